"""Benchmark: checkpoint save and load time on the quickstart run, and the overhead of checkpointing.

Two parts, both in this process, on the quickstart config (``examples/quickstart.yaml``: SmolLM2-135M,
LoRA r=8 on q_proj/v_proj, AdamW, fp32, CPU, 2 threads):

1. ``save_checkpoint`` / ``restore_checkpoint`` on the real PeftModel and AdamW (after one real
   optimizer step, so AdamW holds its moments): the median of several calls each, and the size.
2. Training runs of the same config through ``run_experiment`` (no trackers, no progress bar, the
   final validation cut to 4 rows), without checkpoints and with one every N steps, interleaved
   over ``--rounds`` rounds. Three views of the overhead: ``paired``, the median over rounds of
   (step time with / step time without - 1), the record's mean step time including the saves;
   ``saves/train``, the loop's own ``save_checkpoint`` calls, timed one by one, as a share of that
   run's training time; and the estimate ``save time / (N x step time)`` from part 1.

Each save fsyncs every file and both directories. On a disk that other processes are writing to,
one fsync can wait for their data too, so part 1 also times the save with ``os.fsync`` made a
no-op, to show how much of it is the disk. On a shared machine the step time itself moves a lot
from run to run (other jobs), which swamps a 1 % effect in ``paired``; ``saves/train`` is immune
to that. Read the figures as sizes, not as three digits. ``--quick`` runs fewer steps (a few
minutes once the model is cached).

Target: a checkpoint at the quickstart's ``save_every`` (10) costs at most 1 % of training: the
median of the loop's own saves over 10 x the step time of the runs without checkpoints, both
measured in this run. Exits 1 when it is missed.

Run: ``.venv/bin/python bench/bench_checkpoint.py [--quick] [--steps N] [--rounds R] [--threads T]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "quickstart.yaml"
QUICKSTART_SAVE_EVERY = 10  # examples/quickstart.yaml's train.save_every
TARGET_SHARE = 0.01


def _prepared(cfg: Any, workdir: Path) -> tuple[Any, torch.optim.Optimizer, Any]:
    """The quickstart's PeftModel, AdamW and schedule (``build_setup``), after one optimizer step."""
    from reprotune._train.setup import build_setup

    setup = build_setup(cfg, manifest_out=workdir / "split.json")
    model, optimizer, scheduler = setup.model, setup.optimizer, setup.scheduler
    model.train()
    ids = torch.randint(0, 1000, (cfg.train.batch_size, 64), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer, scheduler


@contextlib.contextmanager
def _no_fsync() -> Iterator[None]:
    """``os.fsync`` as a no-op (only to measure how much of a save is waiting for the disk)."""
    real = os.fsync
    os.fsync = lambda fd: None
    try:
        yield
    finally:
        os.fsync = real


def time_save_load(cfg: Any, repeats: int) -> dict[str, float]:
    """Median save (with and without fsync) and load seconds over ``repeats`` calls, and the size."""
    from reprotune._run.checkpoint import CheckpointState, restore_checkpoint, save_checkpoint

    saves: dict[bool, list[float]] = {True: [], False: []}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        model, optimizer, scheduler = _prepared(cfg, Path(tmp))
        n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        directory = Path(tmp) / "checkpoints"
        path = directory
        for step in range(1, 2 * repeats + 1):
            synced = step % 2 == 1  # interleaved, so both see the same disk weather
            start = time.perf_counter()
            with contextlib.nullcontext() if synced else _no_fsync():
                path = save_checkpoint(
                    directory,
                    CheckpointState(step=step, epoch=0, position=(0, step)),
                    model=model,
                    optimizer=optimizer,
                    scheduler=scheduler,
                    scaler=None,
                    keep=2,
                )
            saves[synced].append(time.perf_counter() - start)
        size = sum(f.stat().st_size for f in path.iterdir())
        for _ in range(repeats):
            start = time.perf_counter()
            restore_checkpoint(path, model=model, optimizer=optimizer, scheduler=scheduler, scaler=None)
            loads.append(time.perf_counter() - start)
    return {
        "save_s": statistics.median(saves[True]),
        "save_nosync_s": statistics.median(saves[False]),
        "load_s": statistics.median(loads),
        "size_mb": size / 1e6,
        "trainable": float(n_trainable),
    }


def time_run(steps: int, save_every: int, run_dir: Path, threads: int | None) -> tuple[float, list[float]]:
    """A quickstart run of ``steps`` steps checkpointing every ``save_every`` (0: never).

    Returns:
        The mean step time (from the record) and the duration of each checkpoint save in the loop.
    """
    from reprotune._config.loading import load_config
    from reprotune._train.run import RunOptions, run_experiment

    overrides = [
        f"train.max_steps={steps}",
        f"train.save_every={save_every}",
        "train.eval_every=0",
        "eval.max_rows=4",
        "tracking.mlflow=false",
    ]
    if threads is not None:
        overrides.append(f"determinism.threads={threads}")
    cfg = load_config(CONFIG, overrides)
    result = run_experiment(cfg, RunOptions(run_dir=run_dir, progress=False, tracking=False))
    # The loop's own saves, as its checkpoint hook timed them.
    return float(result.record["timings"]["step_time_s_mean"]), list(result.checkpoint_times_s)


def main(argv: list[str] | None = None) -> int:
    """Run both parts and print the tables; 0 when the target is met, 1 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (about a minute or two)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 20; quick 6)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each setting, interleaved (default 2)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads instead of the config's 2 (1 on a busy 2-core machine: more "
        "threads than free cores make each step many times slower)",
    )
    args = parser.parse_args(argv)
    from reprotune._config.loading import load_config

    steps = args.steps or (6 if args.quick else 20)
    settings = [0, 2] if args.quick else [0, 1, 5]
    repeats = 3 if args.quick else 7

    cfg = load_config(CONFIG)
    threads = args.threads or cfg.determinism.threads
    if threads:  # as the runs below will (the quickstart pins 2)
        torch.set_num_threads(threads)
    print(
        f"quickstart: {cfg.model.name}, LoRA r={cfg.lora.r} on {list(cfg.lora.target_modules)}, "
        f"batch {cfg.train.batch_size}, max_length {cfg.model.max_length}, {cfg.train.precision}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    io = time_save_load(cfg, repeats)
    print(
        f"\ncheckpoint ({int(io['trainable']):,} trainable parameters, {io['size_mb']:.1f} MB on disk), "
        f"median of {repeats}:"
    )
    print(f"  save_checkpoint               {io['save_s'] * 1e3:8.1f} ms")
    print(f"  save_checkpoint, no fsync     {io['save_nosync_s'] * 1e3:8.1f} ms")
    print(f"  restore_checkpoint            {io['load_s'] * 1e3:8.1f} ms")

    step_means: dict[int, list[float]] = {every: [] for every in settings}
    in_loop: dict[int, list[float]] = {every: [] for every in settings}
    attributed: dict[int, list[float]] = {every: [] for every in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for every in settings:
                mean, saves = time_run(steps, every, Path(tmp) / f"every-{every}-{round_}", args.threads)
                step_means[every].append(mean)
                in_loop[every].extend(saves)
                attributed[every].append(sum(saves) / (mean * steps))
    base = statistics.median(step_means[0])
    print(
        f"\ntraining runs of {steps} steps, {args.rounds} interleaved rounds "
        "(median step time, which includes the saves):"
    )
    print(
        f"  {'checkpoint every':<17}{'step time':>10}{'paired':>9}{'saves':>7}{'save median':>13}"
        f"{'save worst':>12}{'saves/train':>13}"
    )
    for every in settings:
        label = "never" if every == 0 else f"{every} step{'s' if every > 1 else ''}"
        saves = in_loop[every]
        row = f"  {label:<17}{statistics.median(step_means[every]):>9.3f}s"
        if every:
            # Paired: this setting against "never" of the same round, so both saw the same load.
            pairs = zip(step_means[every], step_means[0], strict=True)
            paired = statistics.median(a / b - 1 for a, b in pairs)
            row += (
                f"{paired:>+9.1%}{len(saves):>7}{statistics.median(saves) * 1e3:>10.0f} ms"
                f"{max(saves) * 1e3:>9.0f} ms{statistics.median(attributed[every]):>13.2%}"
            )
        print(row)
    print(f"\nestimated overhead, save time / (N x step time), step time {base:.3f} s:")
    for every in (1, 5, 10):
        print(f"  every {every:>2} steps  {io['save_s'] / (every * base):6.1%}")
    # The target, judged on the loop's own saves against the step time of the runs without
    # checkpoints, both measured here: the quickstart's save_every (10) costs at most 1 %.
    loop_save = statistics.median(t for every in settings if every for t in in_loop[every])
    share = loop_save / (QUICKSTART_SAVE_EVERY * base)
    verdict = "PASS" if share <= TARGET_SHARE else "FAIL"
    print(
        f"\ntarget: a checkpoint every {QUICKSTART_SAVE_EVERY} steps costs <= {TARGET_SHARE:.0%} of "
        f"training: median save in the loop {loop_save * 1e3:.0f} ms / ({QUICKSTART_SAVE_EVERY} x "
        f"{base:.3f} s) = {share:.2%} {verdict}"
    )
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
