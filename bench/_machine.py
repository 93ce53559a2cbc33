"""What the benchmarks say about the machine they ran on (imported by the bench_*.py scripts,
which run with this folder first on sys.path; run_all.py runs only bench_*.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

#: What every benchmarked ``reprotune`` process gets: offline, quiet, no telemetry.
QUIET_ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def cpu_pressure() -> str:
    """Linux PSI for the CPU: the share of time some task waited for a core (other load on the box)."""
    try:
        some = Path("/proc/pressure/cpu").read_text(encoding="utf-8").splitlines()[0]
    except (OSError, IndexError):
        return "unknown"
    fields = dict(item.split("=") for item in some.split()[1:])
    return f"some task waiting {fields.get('avg10')}% (10 s avg), {fields.get('avg60')}% (60 s avg)"


def require(ok: bool, what: str) -> None:
    """Stop a benchmark whose measurement is void (exit 1, one line, no traceback): ``what`` says
    what did not hold."""
    if not ok:
        raise SystemExit(f"benchmark void: {what}")


def timed_reprotune(args: list[str], log: Path, cwd: Path | None = None) -> float:
    """Wall seconds of ``python -m reprotune ARGS`` in a fresh process, its output appended to
    ``log``; exit 0 and 1 (a verdict) count as ran, anything else stops the benchmark."""
    started = time.perf_counter()
    with open(log, "ab") as out:
        command = [sys.executable, "-m", "reprotune", *args]
        code = subprocess.call(command, stdout=out, stderr=out, env={**os.environ, **QUIET_ENV}, cwd=cwd)
    if code not in (0, 1):
        raise SystemExit(f"`reprotune {' '.join(args)}` failed ({code}); see {log}")
    return time.perf_counter() - started
