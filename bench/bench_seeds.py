"""Benchmark: a seed study's wall time against the same runs made one by one (``--jobs 1``).

A study of N runs should cost N runs and nothing more: no hidden per-run cost (verifying, metric
reading, ``study.json`` after each run) and little at the end (bootstrap, report). Both sides run in
this process, on the tiny Llama (2 layers, width 64, 1 thread, batch 4, no trackers):

- **baseline**: the study's N planned runs (``plan_study``: the same configs, seeds and all), each
  through ``run_experiment`` into a fresh directory, timed from the first call to the last return;
- **study**: ``run_study(cfg, n=N, vary="all", jobs=1)`` into a fresh directory, timed whole
  (planning, every run, every ``study.json``, the summary, the bootstrap and ``report.html``).

A warm-up run comes first (imports, caches; not SciPy, which the first study imports and pays for).
Rounds alternate which side goes first, so a drift in the machine's speed does not favour one side.

Two figures, medians over rounds:

- **paired**: study / baseline, in wall time and in CPU time (this process's user + system time).
  It would show a study that slows its runs down. On a shared machine it measures the neighbours
  as much as the code: blocks a minute apart swung from 0.8x to 1.4x in wall time and 0.94x to
  1.16x in CPU time for the same code.
- **study / its runs**: the study's wall time over the wall time of its N runs as the study timed
  each (``StudyResult.seconds_in_runs``): what a study costs beyond its runs (planning, verifying,
  ``study.json`` after each run, summary, bootstrap, report), measured inside one block, so the
  machine's drift cancels. With ``--jobs 1`` the runs are the very ``run_experiment`` calls of the
  baseline. The target, <= 1.05x, is judged on this figure.

MLflow is off on both sides: a tracked study's runs pay for their own trackers just as the same
runs do alone, and the parent run is not measured here.

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

from _machine import cpu_pressure
from reprotune._config.loading import load_config
from reprotune._studies.plan import plan_study
from reprotune._studies.study import StudyOptions, run_study
from reprotune._train.run import RunOptions, run_experiment
from reprotune.testing import build_tiny_model, write_tiny_dataset

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


def _baseline(cfg: Any, n: int, out: Path) -> tuple[float, float]:
    """Wall and CPU seconds of the study's planned runs made one by one."""
    wall, cpu = time.perf_counter(), time.process_time()
    for planned in plan_study(cfg, n=n, vary="all").runs:
        run_experiment(planned.config, RunOptions(run_dir=out / planned.name, progress=False, tracking=False))
    return time.perf_counter() - wall, time.process_time() - cpu


def _study(cfg: Any, n: int, out: Path) -> tuple[float, float, float]:
    """The study's wall and CPU seconds, and the wall time its runs took as the study measured it."""
    wall, cpu = time.perf_counter(), time.process_time()
    options = StudyOptions(out=out, jobs=1, tracking=False, name="bench", progress=lambda line: None)
    result = run_study(cfg, n=n, vary="all", options=options)
    return time.perf_counter() - wall, time.process_time() - cpu, result.seconds_in_runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="2 runs of 20 steps, 3 rounds")
    parser.add_argument("--n", type=int, default=None, help="runs per study (default 3)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 40)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 7)")
    args = parser.parse_args(argv)
    n = args.n or (2 if args.quick else 3)
    steps = args.steps or (20 if args.quick else 40)
    rounds = args.rounds or (3 if args.quick else 7)
    print(f"bench_seeds: study of {n} runs x {steps} steps vs the same {n} runs one by one, {rounds} rounds")
    print(f"CPU pressure before: {cpu_pressure()}")
    walls, cpus, outside, selfs = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-seeds-") as tmp:
        root = Path(tmp)
        cfg = load_config(_config(root, steps))
        run_experiment(cfg, RunOptions(run_dir=root / "warmup", progress=False, tracking=False))
        header = ("round", "baseline wall/cpu s", "study wall/cpu s", "wall", "cpu")
        print("{:>5}  {:>19}  {:>16}  {:>6}  {:>6}  outside runs".format(*header))
        for r in range(rounds):
            if r % 2 == 0:
                base_wall, base_cpu = _baseline(cfg, n, root / f"base-{r}")
                wall, cpu, inside = _study(cfg, n, root / f"study-{r}")
            else:
                wall, cpu, inside = _study(cfg, n, root / f"study-{r}")
                base_wall, base_cpu = _baseline(cfg, n, root / f"base-{r}")
            walls.append(wall / base_wall)
            cpus.append(cpu / base_cpu)
            outside.append(wall - inside)
            selfs.append(wall / inside)
            print(
                f"{r:>5}  {base_wall:>9.2f}/{base_cpu:<9.2f}  {wall:>7.2f}/{cpu:<8.2f}  {walls[-1]:>6.3f}  "
                f"{cpus[-1]:>6.3f}  {outside[-1]:.2f} s ({outside[-1] / wall:.2%})"
            )
    wall_ratio, cpu_ratio = statistics.median(walls), statistics.median(cpus)
    own = statistics.median(selfs)
    met = own <= TARGET
    paired = f"wall {wall_ratio:.3f}x, CPU {cpu_ratio:.3f}x"
    print(f"paired, study / the same {n} runs alone, median of {rounds} rounds: {paired}")
    print(
        f"study wall / its {n} runs' wall: median {own:.4f}x "
        f"(target <= {TARGET}x: {'met' if met else 'MISSED'}); "
        f"the study's own work: median {statistics.median(outside):.2f} s a study (round 0, the first study "
        f"in the process, also imports SciPy: {outside[0]:.2f} s)"
    )
    print(f"CPU pressure after: {cpu_pressure()}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
