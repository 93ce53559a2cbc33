"""Benchmark ``reprotune verify RUN_DIR --spot``: its wall time over the run it checks.

    .venv/bin/python bench/bench_spot.py            # the quickstart at 120 steps (about 6 min)
    .venv/bin/python bench/bench_spot.py --quick    # the quickstart at 40 steps (about 3 min)

The quickstart config (SmolLM2-135M, LoRA r=8 on q/v, batch 4, 2 threads) made long enough that
process starts do not dominate: 120 optimizer steps, a checkpoint every 10, all kept, validation
every 40, no tracker. In one sitting, each command in its own process and timed from outside
(process start, imports and model loads included, as a user waits for them):

1. ``reprotune run CONFIG`` (the run to check);
2. ``reprotune verify RUN --spot`` at the default budget (0.2 of the steps; the first and the last
   interval always), with its negative controls.

Printed: both wall times, their ratio (target <= 0.3x), the intervals and steps replayed, and the
probability that a fault confined to one interval is caught. Exits 1 when the target is missed.
The machine may be shared: read the ratio, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from _machine import timed_reprotune

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
TARGET = 0.3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 steps instead of 120")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (printed)")
    args = parser.parse_args(argv)
    steps = 40 if args.quick else 120
    overrides = [
        "tracking.mlflow=false",
        f"train.max_steps={steps}",
        "train.save_every=10",
        f"train.keep_checkpoints={steps // 10}",
        "train.eval_every=40",
    ]
    sets = [item for o in overrides for item in ("--set", o)]
    work = Path(tempfile.mkdtemp(prefix="bench-spot-"))
    log = work / "bench.log"
    run_dir, out = work / "run", work / "spot"
    # In the work directory: the code fingerprint is of no repository (this one may change while
    # the benchmark runs, and a spot check refuses code that differs from the run's).
    run_s = timed_reprotune(
        ["run", str(QUICKSTART), "--run-dir", str(run_dir), "--no-progress", *sets], log, work
    )
    spot_s = timed_reprotune(["verify", str(run_dir), "--spot", "--out", str(out)], log, work)
    verification = json.loads((out / "verification.json").read_text(encoding="utf-8"))
    spot = verification["spot"]
    ratio = spot_s / run_s
    print(f"quickstart, {steps} steps, a checkpoint every 10; {os.cpu_count()} cores")
    print(f"  reprotune run                 {run_s:7.1f} s")
    print(
        f"  reprotune verify RUN --spot   {spot_s:7.1f} s   {ratio:.3f}x the run (target <= {TARGET}x), "
        f"verdict {verification['verdict']}"
    )
    print(
        f"  replayed {spot['intervals_replayed']} of {spot['intervals_available']} intervals, "
        f"{spot['steps_replayed']} of {spot['total_steps']} steps (budget {spot['budget']:g}); "
        f"legs: " + ", ".join(f"{leg['name']} {leg['verdict']}" for leg in verification["legs"])
    )
    print(f"  proves: {spot['proves']}")
    if args.keep:
        print(f"  work directory: {work}")
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    met = ratio <= TARGET and verification["verdict"] == "PASS"
    print(f"verify --spot cost: {ratio:.3f}x (target <= {TARGET}x): {'met' if met else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
