"""Benchmark: a seed study's wall time against the same runs made one by one (``--jobs 1``).

A study of N runs should cost N runs and nothing more: no hidden per-run cost (verifying, metric
reading, ``study.json`` after each run) and little at the end (bootstrap, report). Both sides run in
this process, on the tiny Llama (2 layers, width 64, 1 thread, batch 4, no trackers):

- **baseline**: the study's N planned runs (``plan_study``: the same configs, seeds and all), each
  through ``run_experiment`` into a fresh directory, timed from the first call to the last return;
- **study**: ``run_study(cfg, n=N, vary="all", jobs=1)`` into a fresh directory, timed whole
  (planning, every run, every ``study.json``, the summary, the bootstrap and ``report.html``).

A warm-up run comes first (imports, caches). Rounds alternate which side goes first, so a drift in
the machine's speed does not favour one side; the figure is the median over rounds of study time /
baseline time. Also printed: the study's time outside its runs (its own bookkeeping), as the
study measured it. Target: <= 1.05x. MLflow is off on both sides: a tracked study's runs pay for
their own trackers just as the same runs do alone, and the parent run is not measured here.

Run: ``.venv/bin/python bench/bench_seeds.py [--quick] [--n N] [--steps S] [--rounds R]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from reprotune._config.loading import load_config
from reprotune._model.tiny import build_tiny_model, write_tiny_dataset
from reprotune._studies.plan import plan_study
from reprotune._studies.study import StudyOptions, run_study
from reprotune._train.run import RunOptions, run_experiment

TARGET = 1.05


def _config(root: Path, steps: int) -> Path:
    """A tiny project: model, 200-row dataset and a config of ``steps`` steps, no trackers."""
    build_tiny_model(root / "tiny-model", seed=0)
    write_tiny_dataset(root / "data.jsonl", 200, seed=0, n_categories=3)
    config: dict[str, Any] = {
        "seed": {"root": 1},
        "data": {"path": "data.jsonl"},
        "split": {"stratify_by": "category"},
        "model": {"name": "tiny-model", "max_length": 64},
        "lora": {"r": 4, "alpha": 8, "dropout": 0.1},
        "train": {
            "batch_size": 4,
            "max_steps": steps,
            "eval_every": 0,
            "save_every": 0,
            "learning_rate": 0.01,
        },
        "determinism": {"mode": "strict", "threads": 1, "device": "cpu"},
        "tracking": {"mlflow": False},
    }
    path = root / "cfg.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=True), encoding="utf-8")
    return path


def _baseline(cfg: Any, n: int, out: Path) -> float:
    start = time.perf_counter()
    for planned in plan_study(cfg, n=n, vary="all").runs:
        run_experiment(planned.config, RunOptions(run_dir=out / planned.name, progress=False, tracking=False))
    return time.perf_counter() - start


def _study(cfg: Any, n: int, out: Path) -> tuple[float, float]:
    """The study's wall time, and the time its runs took as the study measured them."""
    start = time.perf_counter()
    options = StudyOptions(out=out, jobs=1, tracking=False, name="bench", progress=lambda line: None)
    result = run_study(cfg, n=n, vary="all", options=options)
    return time.perf_counter() - start, result.seconds_in_runs


def _cpu_pressure() -> str:
    """Linux PSI for the CPU: the share of time some task waited for a core (other load on the box)."""
    try:
        some = Path("/proc/pressure/cpu").read_text(encoding="utf-8").splitlines()[0]
    except (OSError, IndexError):
        return "unknown"
    fields = dict(item.split("=") for item in some.split()[1:])
    return f"some task waiting {fields.get('avg10')}% (10 s avg), {fields.get('avg60')}% (60 s avg)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="3 runs of 20 steps, 2 rounds")
    parser.add_argument("--n", type=int, default=None, help="runs per study (default 4)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 60)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3)")
    args = parser.parse_args(argv)
    n = args.n or (3 if args.quick else 4)
    steps = args.steps or (20 if args.quick else 60)
    rounds = args.rounds or (2 if args.quick else 3)
    print(f"bench_seeds: study of {n} runs x {steps} steps vs the same {n} runs one by one, {rounds} rounds")
    print(f"CPU pressure before: {_cpu_pressure()}")
    ratios, outside = [], []
    with tempfile.TemporaryDirectory(prefix="bench-seeds-") as tmp:
        root = Path(tmp)
        cfg = load_config(_config(root, steps))
        run_experiment(cfg, RunOptions(run_dir=root / "warmup", progress=False, tracking=False))
        print(f"{'round':>5}  {'baseline s':>10}  {'study s':>8}  {'ratio':>6}  {'outside runs':>12}")
        for r in range(rounds):
            if r % 2 == 0:
                base = _baseline(cfg, n, root / f"base-{r}")
                wall, inside = _study(cfg, n, root / f"study-{r}")
            else:
                wall, inside = _study(cfg, n, root / f"study-{r}")
                base = _baseline(cfg, n, root / f"base-{r}")
            ratios.append(wall / base)
            outside.append((wall - inside) / wall)
            print(f"{r:>5}  {base:>10.2f}  {wall:>8.2f}  {wall / base:>6.3f}  {outside[-1]:>11.2%}")
    ratio = statistics.median(ratios)
    met = ratio <= TARGET
    print(
        f"study / {n} single runs: median {ratio:.3f}x over {rounds} rounds (target <= {TARGET}x: "
        f"{'met' if met else 'MISSED'}); the study's own work outside its runs: median "
        f"{statistics.median(outside):.2%} of its wall time"
    )
    print(f"CPU pressure after: {_cpu_pressure()}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
