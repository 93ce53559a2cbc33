"""Run every benchmark in ``bench/`` (each ``bench_*.py``, in name order) and report which missed.

    .venv/bin/python bench/run_all.py                 # every benchmark, full size
    .venv/bin/python bench/run_all.py --quick         # --quick to each benchmark that offers it
    .venv/bin/python bench/run_all.py --only train    # only bench_train.py (repeatable)

Each benchmark runs as its own subprocess with this Python, its output passed through as it
comes. A benchmark misses when it exits non-zero (they exit 1 when a target is missed); with
``--quick``, also when its ``--help`` does not answer within 120 s (it is not run, and the others
are). Exit status: 0 when every benchmark met its targets, 1 when any missed, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent


def discover(only: list[str]) -> list[Path]:
    """The ``bench_*.py`` files, by name; with ``only``, those whose name has one of its words."""
    scripts = sorted(BENCH_DIR.glob("bench_*.py"))
    if only:
        scripts = [s for s in scripts if any(word in s.stem for word in only)]
    return scripts


#: Seconds a benchmark's ``--help`` may take (its imports) before it counts as not answering.
HELP_TIMEOUT_S = 120


def offers_quick(script: Path) -> bool | None:
    """True when ``script --help`` lists a ``--quick`` option; None when it did not answer within
    :data:`HELP_TIMEOUT_S` seconds (it is killed)."""
    try:
        done = subprocess.run(
            [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=HELP_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return None
    return done.returncode == 0 and "--quick" in done.stdout


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; return 0 when all met their targets, 1 otherwise, 2 on bad usage."""
    parser = argparse.ArgumentParser(description="Run every bench/bench_*.py; exit 1 if any misses a target.")
    parser.add_argument("--quick", action="store_true", help="pass --quick to benchmarks that accept it")
    parser.add_argument(
        "--only", action="append", default=[], metavar="WORD", help="run bench_*WORD*.py only"
    )
    args = parser.parse_args(argv)

    scripts = discover(args.only)
    if not scripts:
        print(f"run_all: no bench_*.py in {BENCH_DIR} matches {args.only}", file=sys.stderr)
        return 2
    results: list[tuple[str, int | None, float]] = []  # None: not run (its --help did not answer)
    for script in scripts:
        command = [sys.executable, str(script)]
        start = time.perf_counter()
        if args.quick:
            quick = offers_quick(script)
            if quick is None:
                print(
                    f"\n######## {script.name}: not run: its --help did not answer in {HELP_TIMEOUT_S} s,"
                    " so whether it offers --quick is unknown (run it alone to see why)",
                    flush=True,
                )
                results.append((script.name, None, time.perf_counter() - start))
                continue
            if quick:
                command.append("--quick")
        print(f"\n######## {script.name} {' '.join(command[2:])}".rstrip(), flush=True)
        start = time.perf_counter()
        code = subprocess.run(command, cwd=BENCH_DIR.parent).returncode
        results.append((script.name, code, time.perf_counter() - start))

    print("\n######## summary")
    for name, status, seconds in results:
        if status is None:
            verdict = f"MISSED (not run: --help took over {HELP_TIMEOUT_S} s)"
        else:
            verdict = "met its targets" if status == 0 else f"MISSED (exit {status})"
        print(f"  {name:28}{seconds:>8.1f} s  {verdict}")
    return 0 if all(status == 0 for _, status, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
