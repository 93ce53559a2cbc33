"""What the benchmarks say about the machine they ran on (imported by the bench_*.py scripts,
which run with this folder first on sys.path; run_all.py runs only bench_*.py)."""

from __future__ import annotations

from pathlib import Path


def cpu_pressure() -> str:
    """Linux PSI for the CPU: the share of time some task waited for a core (other load on the box)."""
    try:
        some = Path("/proc/pressure/cpu").read_text(encoding="utf-8").splitlines()[0]
    except (OSError, IndexError):
        return "unknown"
    fields = dict(item.split("=") for item in some.split()[1:])
    return f"some task waiting {fields.get('avg10')}% (10 s avg), {fields.get('avg60')}% (60 s avg)"
