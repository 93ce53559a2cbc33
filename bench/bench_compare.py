"""Benchmark: `reprotune compare` end to end on two runs of 10,000 steps that part late.

Builds two run directories (10,000 train steps, a validation line every 100 steps, an adapter of
about 4 MB) whose numbers part at step 9,500, then times the CLI in a fresh process, as a user
runs it. The issue requires under 1 second; the median of 5 runs is asserted.

Run: ``.venv/bin/python bench/bench_compare.py``
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from rundirs import RunSpec, write_run_dir  # noqa: E402  (the test helper builds the runs)

STEPS = 10_000
PART_AT = 9_500
LIMIT_S = 1.0
REPEATS = 5


def main() -> int:
    """Build the runs, time the CLI, print the figures; exit 1 when over the limit."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = RunSpec(steps=STEPS, eval_every=100, adapter_extra=1_000_000)
        a = write_run_dir(Path(tmp) / "a", spec)
        b = write_run_dir(Path(tmp) / "b", replace(spec, noise_from_step=PART_AT))
        ledger_mb = (a / "ledger.jsonl").stat().st_size / 1e6
        command = [sys.executable, "-m", "reprotune", "compare", str(a), str(b)]
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            proc = subprocess.run(command, capture_output=True, text=True, check=False)
            times.append(time.perf_counter() - start)
            if proc.returncode != 1 or "first step with different loss bits" not in proc.stdout:
                print(proc.stdout, proc.stderr, file=sys.stderr)
                raise SystemExit("compare did not report the divergence: the benchmark is void")
        assert f"numbers differ from step {PART_AT}" in proc.stdout, proc.stdout
    median = statistics.median(times)
    print(
        f"compare, 2 x {STEPS} steps ({ledger_mb:.1f} MB ledger each, parting at step {PART_AT}): "
        f"median {median:.3f} s over {REPEATS} runs (min {min(times):.3f}, max {max(times):.3f}); "
        f"limit {LIMIT_S} s"
    )
    assert median < LIMIT_S, f"compare took {median:.3f} s, over the {LIMIT_S} s limit"
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
