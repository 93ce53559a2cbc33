"""Benchmark: checkpoint save and load time on the quickstart run, and the overhead of checkpointing.

Two parts, both in this process, on the quickstart config (``examples/quickstart.yaml``: SmolLM2-135M,
LoRA r=8 on q_proj/v_proj, AdamW, fp32, CPU, 2 threads):

1. ``save_checkpoint`` / ``restore_checkpoint`` on the real PeftModel and AdamW (after one real
   optimizer step, so AdamW holds its moments): the median of several calls each, and the size.
2. Training runs of the same config through ``run_experiment`` (no trackers, no progress bar, the
   final validation cut to 4 rows), without checkpoints and with one every N steps. The record's
   mean step time includes the checkpoint saves (they happen inside the step), so
   ``(mean_with - mean_without) / mean_without`` is the measured overhead; the estimate beside it
   is ``save time / (N x step time)``.

The machine is shared and timings move by 10-20 % from run to run: read the figures as sizes, not
as three digits. ``--quick`` runs fewer steps and repeats (about a minute once the model is cached).

Run: ``.venv/bin/python bench/bench_checkpoint.py [--quick] [--steps N]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "quickstart.yaml"


def _prepared(cfg: Any) -> tuple[Any, torch.optim.Optimizer, Any]:
    """The quickstart's PeftModel, AdamW and schedule, after one optimizer step on a fixed batch."""
    from reprotune._lora import apply_lora
    from reprotune._model import load_base_model
    from reprotune._optim import build_optimizer, build_scheduler
    from reprotune._seeding import derive_seeds

    seeds = derive_seeds(cfg.seed.root, dict(cfg.seed.overrides))
    loaded = load_base_model(cfg.model.name, revision=cfg.model.revision, dtype=cfg.model.dtype,
                             pad_token_id=cfg.model.pad_token_id, padding_side=cfg.model.padding_side,
                             device="cpu")
    model = apply_lora(loaded.model, seed=seeds["lora_init"], r=cfg.lora.r, alpha=cfg.lora.alpha,
                       dropout=cfg.lora.dropout, target_modules=list(cfg.lora.target_modules),
                       bias=cfg.lora.bias)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, name=cfg.train.optimizer, learning_rate=cfg.train.learning_rate,
                                weight_decay=cfg.train.weight_decay)
    scheduler = build_scheduler(optimizer, schedule=cfg.train.scheduler, warmup_steps=cfg.train.warmup_steps,
                                total_steps=cfg.train.max_steps or 1)
    ids = torch.randint(0, 1000, (cfg.train.batch_size, 64), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer, scheduler


def time_save_load(cfg: Any, repeats: int) -> dict[str, float]:
    """Median save and load seconds over ``repeats`` calls, the checkpoint's size and its parts."""
    from reprotune._checkpoint import CheckpointState, restore_checkpoint, save_checkpoint

    model, optimizer, scheduler = _prepared(cfg)
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    saves, loads = [], []
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "checkpoints"
        path = directory
        for step in range(1, repeats + 1):
            start = time.perf_counter()
            path = save_checkpoint(directory, CheckpointState(step=step, epoch=0, position=(0, step)),
                                   model=model, optimizer=optimizer, scheduler=scheduler, scaler=None, keep=2)
            saves.append(time.perf_counter() - start)
        size = sum(f.stat().st_size for f in path.iterdir())
        for _ in range(repeats):
            start = time.perf_counter()
            restore_checkpoint(path, model=model, optimizer=optimizer, scheduler=scheduler, scaler=None)
            loads.append(time.perf_counter() - start)
    return {"save_s": statistics.median(saves), "load_s": statistics.median(loads), "size_mb": size / 1e6,
            "trainable": float(n_trainable)}


def time_run(steps: int, save_every: int, run_dir: Path) -> dict[str, float]:
    """A quickstart run of ``steps`` steps checkpointing every ``save_every`` (0: never); its timings."""
    from reprotune._config import load_config
    from reprotune._train import RunOptions, run_experiment

    cfg = load_config(CONFIG, [f"train.max_steps={steps}", f"train.save_every={save_every}",
                               "train.eval_every=0", "eval.max_rows=4", "tracking.mlflow=false"])
    result = run_experiment(cfg, RunOptions(run_dir=run_dir, progress=False, tracking=False))
    step_s = float(result.record["timings"]["step_time_s_mean"])
    return {"step_s": step_s, "train_s": step_s * steps}


def main(argv: list[str] | None = None) -> int:
    """Run both parts and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats (about a minute)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 20; quick 6)")
    args = parser.parse_args(argv)
    from reprotune._config import load_config

    steps = args.steps or (6 if args.quick else 20)
    every_runs = [0, 2] if args.quick else [0, 1, 5]
    repeats = 3 if args.quick else 7

    cfg = load_config(CONFIG)
    if cfg.determinism.threads:  # as the runs below will (the quickstart pins 2)
        torch.set_num_threads(cfg.determinism.threads)
    print(f"quickstart: {cfg.model.name}, LoRA r={cfg.lora.r} on {list(cfg.lora.target_modules)}, "
          f"batch {cfg.train.batch_size}, max_length {cfg.model.max_length}, {cfg.train.precision}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    io = time_save_load(cfg, repeats)
    print(f"\ncheckpoint ({int(io['trainable']):,} trainable parameters, {io['size_mb']:.1f} MB on disk), "
          f"median of {repeats}:")
    print(f"  save_checkpoint     {io['save_s'] * 1e3:8.1f} ms")
    print(f"  restore_checkpoint  {io['load_s'] * 1e3:8.1f} ms")

    with tempfile.TemporaryDirectory() as tmp:
        runs = {every: time_run(steps, every, Path(tmp) / f"every-{every}") for every in every_runs}
    base = runs[0]["step_s"]
    print(f"\ntraining runs of {steps} steps (mean step time includes the saves):")
    print(f"  {'checkpoint every':<18}{'mean step':>11}{'train time':>12}{'measured':>10}{'estimate':>10}")
    for every, run in runs.items():
        label = "never" if every == 0 else f"{every} step{'s' if every > 1 else ''}"
        measured = "" if every == 0 else f"{(run['step_s'] - base) / base:+.1%}"
        estimate = "" if every == 0 else f"{io['save_s'] / (every * base):.1%}"
        print(f"  {label:<18}{run['step_s']:>10.3f}s{run['train_s']:>11.2f}s{measured:>10}{estimate:>10}")
    print(f"\nestimated overhead, save time / (N x step time), step time {base:.3f} s:")
    for every in (1, 5, 10):
        print(f"  every {every:>2} steps  {io['save_s'] / (every * base):6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
