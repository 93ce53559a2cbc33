"""The quickstart in avx2-compatible here and on an Intel CPU emulated by QEMU: the same bits?

Whether ``determinism.cpu_isa: avx2-compatible`` gives this CPU's bits on an Intel CPU, checked on
one emulated by QEMU's user mode, for a few steps (the emulation is about 100x slower).

    .venv/bin/python bench/emulated_intel.py [--steps 4] [--cpu Haswell-v4]

Runs the quickstart (``--set tracking.mlflow=false``, ``train.max_steps`` and ``train.eval_every``
at ``--steps``) in ``avx2-compatible`` here, then under ``qemu-x86_64 -cpu CPU`` (Debian's
qemu-user; MKL takes its Intel dispatch there), and compares the two runs with ``reprotune
compare``: every step's loss bits and weights hash, the validation loss and the adapter. The
emulator's ``rsqrtps`` and ``rcpps`` are exact, where Intel's and AMD's silicon each return their
own approximation, so an op whose bits hang on them differs here (docs/microscope.md, section 5):
IDENTICAL says the mode's bits depend on neither the vendor's dispatch nor those instructions. It
is not a real Intel machine (bench/portable_bytes.py carries that check between machines). About
35 minutes for 4 steps on 2 cores (a step takes about 5 minutes emulated, 3 s here).

Exit 0 when IDENTICAL, 1 when the runs differ, 2 when it cannot run here (no QEMU, not x86-64).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
MODE = "avx2-compatible"


def quickstart_command(steps: int, run_dir: Path) -> list[str]:
    """``python -m reprotune run`` of the quickstart in the mode, cut to ``steps`` steps."""
    sets = {
        "tracking.mlflow": "false",
        "determinism.cpu_isa": MODE,
        "train.max_steps": str(steps),
        "train.eval_every": str(steps),
        "train.warmup_steps": str(min(3, steps)),
    }
    command = [sys.executable, "-m", "reprotune", "run", str(QUICKSTART), "--run-dir", str(run_dir)]
    for key, value in sets.items():
        command += ["--set", f"{key}={value}"]
    return [*command, "--no-progress"]


def _run(command: list[str], label: str) -> None:
    start = time.perf_counter()
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"emulated_intel: the quickstart {label} failed:\n{done.stderr[-2000:]}")
    print(f"{label}: {time.perf_counter() - start:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps (default 4)")
    parser.add_argument("--cpu", default="Haswell-v4", help="QEMU's Intel CPU model (default Haswell-v4)")
    args = parser.parse_args(argv)
    qemu = shutil.which("qemu-x86_64")
    if platform.machine() != "x86_64" or qemu is None:
        print("emulated_intel: needs an x86-64 machine with qemu-x86_64 (Debian's qemu-user)")
        return 2
    with tempfile.TemporaryDirectory(prefix="emulated-intel-") as tmp:
        here, intel = Path(tmp) / "here", Path(tmp) / "intel"
        _run(quickstart_command(args.steps, here), "here")
        _run([qemu, "-cpu", args.cpu, *quickstart_command(args.steps, intel)], f"on an emulated {args.cpu}")
        compare = [sys.executable, "-m", "reprotune", "compare", str(here), str(intel)]
        done = subprocess.run(compare, cwd=ROOT, capture_output=True, text=True)
        print(done.stdout, end="")
        return 0 if done.stdout.startswith("IDENTICAL") else 1


if __name__ == "__main__":
    sys.exit(main())
