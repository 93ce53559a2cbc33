"""Benchmark ``reprotune verify``: its wall time over the wall time of the run it verifies.

    .venv/bin/python bench/bench_verify.py            # the quickstart as it is (about 15 min)
    .venv/bin/python bench/bench_verify.py --quick    # the quickstart cut to 12 steps (about 6 min)

Same config, same sitting, each command in its own process, timed from outside (process start,
imports and model load included, as a user waits for them):

1. ``reprotune run CONFIG`` (the reference);
2. ``reprotune verify CONFIG --reference RUN`` (fast mode; target <= 1.5x the run);
3. ``reprotune verify CONFIG --reference RUN --thorough`` (today's full-length legs, for scale);
4. ``reprotune verify CONFIG`` (fast mode, training its own reference; target <= 2.5x the run).

Then what each leg cost that is not training: its wall time minus the time its steps took (from
the leg's record; the controls run beside the rerun's processes, so wall times overlap). The machine
may be shared: read the ratios, not the seconds. Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from _machine import timed_reprotune

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
TARGETS = {"verify --reference": 1.5, "verify": 2.5}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="12 steps, a checkpoint every 4")
    parser.add_argument("--config", type=Path, default=QUICKSTART)
    args = parser.parse_args(argv)
    overrides = ["tracking.mlflow=false"]
    if args.quick:
        overrides += ["train.max_steps=12", "train.save_every=4", "train.eval_every=4"]
    sets = [item for o in overrides for item in ("--set", o)]
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        work = Path(tmp)
        log = work / "bench.log"
        config = str(args.config)
        seconds = {
            "run": timed_reprotune(
                ["run", config, "--run-dir", str(work / "ref"), "--no-progress", *sets], log
            )
        }
        fast, thorough, full = work / "fast", work / "thorough", work / "full"
        seconds["verify --reference"] = timed_reprotune(
            ["verify", config, "--reference", str(work / "ref"), "--out", str(fast), *sets], log
        )
        seconds["verify --reference --thorough"] = timed_reprotune(
            ["verify", config, "--reference", str(work / "ref"), "--out", str(thorough), "--thorough", *sets],
            log,
        )
        seconds["verify"] = timed_reprotune(["verify", config, "--out", str(full), *sets], log)
        fast_record = json.loads((fast / "verification.json").read_text())
        legs = fast_record["legs"]
        verdicts = {name: json.loads((d / "verification.json").read_text())["verdict"] for name, d in
                    (("fast", fast), ("thorough", thorough), ("full", full))}  # fmt: skip
    print(f"config {args.config.name}{' (quick: 12 steps)' if args.quick else ''}; verdicts {verdicts}")
    print(f"{'command':34}{'seconds':>10}{'x run':>8}{'target':>8}")
    ok = True
    for name, value in seconds.items():
        ratio = value / seconds["run"]
        target = TARGETS.get(name)
        met = target is None or ratio <= target
        ok &= met
        goal = "" if target is None else f"<= {target}"
        print(f"{name:34}{value:>10.1f}{ratio:>8.2f}{goal:>8}{'' if met else '  MISS'}")
    print("\nfast legs, what is not training (wall minus the steps' time, from each leg's record):")
    for leg in legs:
        train = leg.get("train_s") or 0.0
        other = leg["wall_s"] - train
        print(f"  {leg['name']:16} wall {leg['wall_s']:7.1f} s  steps {train:7.1f} s  other {other:7.1f} s")
    print(
        f"  the legs took {fast_record['wall_s']:.1f} s from first start to last verdict "
        f"({fast_record['legs_s']:.1f} s of leg processes: the controls run beside the rerun)"
    )
    ok &= all(v == "PASS" for v in verdicts.values())
    print("PASS" if ok else "MISS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
