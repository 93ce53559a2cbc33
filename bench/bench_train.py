"""Benchmark ``reprotune run``: what recording costs, and throughput against the Hugging Face Trainer.

    .venv/bin/python bench/bench_train.py            # both parts, the issue's sizes (about 7 min)
    .venv/bin/python bench/bench_train.py --quick    # fewer runs and steps (about 2 min)
    .venv/bin/python bench/bench_train.py --part overhead

1. Recording overhead, tiny model (2 layers, width 64; 1 thread; batch 4). Runs of the real loop
   (``run_experiment``) in which recording is switched on and off by blocks of ``BLOCK`` steps
   (``recorded_steps(predicate)`` of tests/recording.py, from outside the loop): unrecorded blocks
   write no ledger line, hash no weights and send no metrics; recorded blocks do all of it. Both
   kinds of block share one process, one memory layout and the same moments of the shared machine,
   which separate runs do not (whole runs of one variant differed by up to 20 % among themselves
   here, ten times the target).
   Each recorded block's mean step time is compared with the mean of the unrecorded blocks on either
   side (a steady drift cancels); the first step of every block and the first two blocks are left
   out. Figure: the mean of those ratios over every recorded block of ``--repeats`` runs, with a
   95 % confidence interval; the mean, not the median, so that the periodic costs (the ledger's
   flush every half second, the tracker's hand-off every second) count. Two variants: ledger +
   weights hash (trackers off), and ledger + weights hash + MLflow on a SQLite store in a
   temporary folder. Target: at most 2 %. The MLflow store of each run is then checked to hold
   every metric of every recorded step. Also printed: the recording work as the loop timed it
   (``record["timings"]["recording_time_s"]`` per recorded step) and each piece timed alone.
2. Throughput, SmolLM2-135M-Instruct with the quickstart settings (batch 4, max_length 128,
   LoRA r=8 on q/v, fp32, 2 threads, determinism strict, recording and MLflow on) against
   ``transformers.Trainer`` with the same model, LoRA config, tokenised rows in the same order,
   the same collation, batch size, AdamW, schedule and thread count. Each side runs in its own
   fresh process for ``warmup + steps + 1`` optimizer steps; the clock covers steps
   ``warmup+1 .. warmup+steps`` (end of one step to end of another: the last step, which holds
   reprotune's closing validation pass, is outside it). Tokens are the non-padding tokens of
   those batches, the same count for both. Target: reprotune >= Trainer.

Exits 1 when a target is missed. The machine may be shared: read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
import yaml

from _machine import cpu_pressure, require

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
OVERHEAD_TARGET = 0.02

TINY_CONFIG: dict[str, Any] = {
    "seed": {"root": 1},
    "data": {"path": "data.jsonl"},
    "split": {"stratify_by": "category"},
    "model": {"name": "tiny-model", "max_length": 64},
    "lora": {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]},
    "train": {"batch_size": 4, "max_steps": 200, "eval_every": 0, "save_every": 0, "learning_rate": 1.0e-3},
    "eval": {"batch_size": 8},
    "determinism": {"mode": "strict", "threads": 1, "device": "cpu"},
    "tracking": {"mlflow": True, "experiment": "bench-overhead"},
}


# --------------------------------------------------------------------------------------------
# 1. recording overhead


def _tiny_project(root: Path, steps: int) -> Path:
    """Write the tiny model, data and config (MLflow store inside ``root``); return the config path."""
    from reprotune.testing import build_tiny_model, write_tiny_dataset

    build_tiny_model(root / "tiny-model", seed=0)
    write_tiny_dataset(root / "data.jsonl", 80, seed=0, n_categories=3)
    config = json.loads(json.dumps(TINY_CONFIG))
    config["train"]["max_steps"] = steps
    config["tracking"]["uri"] = f"sqlite:///{root / 'mlflow.db'}"
    config["tracking"]["artifact_location"] = str(root / "mlartifacts")
    path = root / "cfg.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=True), encoding="utf-8")
    return path


BLOCK = 10  # steps per block; blocks alternate unrecorded, recorded, unrecorded, ...

VARIANTS: dict[str, tuple[str, bool]] = {
    # name: (label, tracking)
    "ledger": ("ledger + weights hash", False),
    "full": ("ledger + hash + MLflow", True),
}


def _recorded(step: int) -> bool:
    """Whether ``step`` (1-based) falls in a recorded block: blocks 1, 3, 5, ... (0-based)."""
    return (step - 1) // BLOCK % 2 == 1


def _alternating_run(config: Path, run_dir: Path, variant: str) -> tuple[dict[str, Any], list[float]]:
    """One in-process run of ``variant``, recording every other block of steps; record, step times."""
    from recording import recorded_steps  # tests/recording.py
    from reprotune._config.loading import load_config
    from reprotune._train.run import RunOptions, run_experiment

    _, tracking = VARIANTS[variant]
    options = RunOptions(run_dir=run_dir, progress=False, tracking=tracking, code_dir=run_dir.parent)
    with torch.random.fork_rng(), recorded_steps(_recorded):
        result = run_experiment(load_config(config), options)
    return result.record, list(result.step_times_s)


def _block_overheads(step_times: list[float]) -> list[float]:
    """Per recorded block: its mean step time over the mean of its two unrecorded neighbours, - 1.

    The first step of every block is left out (it may carry the cache state of the other kind of
    block), and so are the first two blocks (the first step's warm-up); comparing each recorded
    block with the blocks on both sides of it cancels a steady drift of the machine's speed.
    """
    means = [
        statistics.fmean(step_times[start + 1 : start + BLOCK])
        for start in range(0, len(step_times) - BLOCK + 1, BLOCK)
    ]
    return [
        means[k] / ((means[k - 1] + means[k + 1]) / 2) - 1
        for k in range(3, len(means) - 1, 2)  # recorded blocks have odd k
    ]


def _stored_metric_steps(uri: str, run_id: str) -> dict[str, list[int]]:
    """The steps at which the MLflow store holds each metric of ``run_id``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    return {
        name: sorted(m.step for m in client.get_metric_history(run_id, name))
        for name in ("train_loss", "lr", "grad_norm")
    }


def _per_call_us(call: Callable[[], object], repeat: int = 2000) -> float:
    """Median over 5 rounds of the mean time of ``call``, in microseconds."""
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            call()
        rounds.append((time.perf_counter() - start) / repeat * 1e6)
    return statistics.median(rounds)


def _mlflow_costs(work: Path) -> list[tuple[str, float]]:
    """CPU time (us) the MLflow worker spends per step, logging batches of 160 steps' metrics.

    160 steps is about what the tracker sends at once (every second) from the tiny model's loop.
    """
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'cost.db'}")
    experiment = client.create_experiment("cost", artifact_location=(work / "cost").as_uri())
    run_id = client.create_run(experiment).info.run_id
    rounds = []
    for start in range(0, 800, 160):
        metrics = [
            Metric(k, 1.0, 0, s) for s in range(start, start + 160) for k in ("grad_norm", "lr", "train_loss")
        ]
        cpu = time.thread_time()
        client.log_batch(run_id, metrics=metrics, synchronous=True)
        rounds.append((time.thread_time() - cpu) / 160 * 1e6)
    return [("MLflow worker process: log_batch CPU, 3 metrics", statistics.median(rounds))]


def _breakdown(config: Path, work: Path) -> list[tuple[str, float]]:
    """Per-call cost (us) of each piece of per-step recording work, on the tiny LoRA model, alone."""
    from functools import partial

    from reprotune._config.loading import load_config
    from reprotune._jsonio import canonical_dumps
    from reprotune._model.lora import WeightsHasher, trainable_tensors
    from reprotune._run.ledger import LedgerWriter, train_line
    from reprotune._trackers.mlflow import MlflowTracker
    from reprotune._train.setup import build_setup

    cfg = load_config(config)
    with torch.random.fork_rng():
        model = build_setup(cfg, manifest_out=work / "breakdown-split.json").model
    rows = list(range(4))
    line_args = (1, 0, rows, 50, 1.234, 1e-3, 0.5, "0" * 64)
    tracker = MlflowTracker("sqlite:///unused.db", work / "unused", "unused")  # never started: enqueue only
    metrics = {"train_loss": 1.0, "lr": 1e-3, "grad_norm": 0.5}
    hash_weights = WeightsHasher(trainable_tensors(model))
    try:
        # A long interval: the queueing alone, then the formatting a flush does per line.
        with LedgerWriter(work / "breakdown-ledger.jsonl", flush_interval_s=3600) as ledger:
            queue_line = lambda: ledger.write(partial(train_line, *line_args))  # noqa: E731
            format_line = lambda: canonical_dumps(train_line(*line_args), indent=None)  # noqa: E731
            return [
                ("in the step: weights hash (WeightsHasher)", _per_call_us(hash_weights)),
                ("in the step: queue the ledger line", _per_call_us(queue_line)),
                ("in the step: tracker.log_metrics", _per_call_us(lambda: tracker.log_metrics(1, metrics))),
                ("at a flush: build + format one ledger line", _per_call_us(format_line)),
                *_mlflow_costs(work),
            ]  # fmt: skip
    finally:
        tracker.close()


def bench_overhead(repeats: int, steps: int) -> bool:
    """Part 1; prints a table; True when the 2 % target is met and MLflow holds every metric."""
    print(
        f"\n== recording overhead: tiny model, {repeats} runs of {steps} steps per variant, "
        f"recording every other block of {BLOCK} steps =="
    )
    blocks: dict[str, list[list[float]]] = {name: [] for name in VARIANTS}
    in_loop_us: dict[str, list[float]] = {name: [] for name in VARIANTS}
    off_ms: list[float] = []
    recorded_steps = [s for s in range(1, steps + 1) if _recorded(s)]
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        work = Path(tmp)
        config = _tiny_project(work, steps)
        uri = f"sqlite:///{work / 'mlflow.db'}"
        _alternating_run(config, work / "warm-up", "full")  # imports, first SQLite schema: untimed
        complete = True
        for i in range(repeats):
            for variant in VARIANTS:
                record, step_times = _alternating_run(config, work / f"{variant}-{i}", variant)
                blocks[variant].append(_block_overheads(step_times))
                in_loop_us[variant].append(record["timings"]["recording_time_s"] / len(recorded_steps) * 1e6)
                off_ms.append(
                    statistics.median(t for s, t in enumerate(step_times, 1) if not _recorded(s)) * 1e3
                )
                if variant != "full":
                    continue
                mlflow = record["trackers"]["mlflow"]
                stored = _stored_metric_steps(uri, mlflow["mlflow_run_id"]) if mlflow.get("ok") else {}
                if any(got != recorded_steps for got in stored.values()) or not stored:
                    complete = False
                    print(f"  run full-{i}: MLflow store lacks recorded steps: {mlflow}")
        breakdown = _breakdown(config, work)

    step_us = statistics.median(off_ms) * 1e3
    print(f"unrecorded step, median over runs: {step_us / 1e3:.3f} ms")
    print(f"{'':24}{'mean':>9}{'95% CI':>18}{'median':>9}{'in-loop us':>12}   mean per run")
    overheads = {}
    for variant, (label, _) in VARIANTS.items():
        every = [b for run in blocks[variant] for b in run]
        mean, half = statistics.fmean(every), 1.96 * statistics.stdev(every) / len(every) ** 0.5
        overheads[variant] = mean
        ci = f"[{mean - half:+.2%}, {mean + half:+.2%}]"
        runs = " ".join(f"{statistics.fmean(run):+.2%}" for run in blocks[variant])
        in_loop = statistics.median(in_loop_us[variant])
        print(f"{label:24}{mean:>+9.2%}{ci:>18}{statistics.median(every):>+9.2%}{in_loop:>12.1f}   {runs}")
    overhead = overheads["full"]
    n_blocks = sum(len(run) for run in blocks["full"])
    print(
        f"overhead of full recording: {overhead:+.2%} (mean over {n_blocks} recorded blocks, each against "
        f"its unrecorded neighbours), target <= {OVERHEAD_TARGET:.0%}"
    )
    print("in-loop us: the recording work timed where it runs, per recorded step (record timings)")
    print(f"MLflow store holds every recorded step's metrics: {complete}")
    print("recording work per step, each piece timed alone (warm caches):")
    for name, micros in breakdown:
        print(f"  {name:50}{micros:>9.1f} us {micros / step_us:>7.2%} of a step")
    ok = overhead <= OVERHEAD_TARGET and complete
    print("PASS" if ok else "MISS")
    return ok


# --------------------------------------------------------------------------------------------
# 2. throughput against transformers.Trainer (each side in its own process)


def _quickstart_cfg(total_steps: int) -> Any:
    from reprotune._config.loading import load_config

    overrides = [
        f"train.max_steps={total_steps}",
        "train.eval_every=0",
        "train.save_every=0",
        "eval.max_rows=8",
    ]
    return load_config(QUICKSTART, overrides)


def _setup(cfg: Any, work: Path) -> Any:
    """The quickstart run's setup (``build_setup``): model with LoRA, data order, tokenised rows."""
    from reprotune._train.setup import build_setup

    work.mkdir(parents=True, exist_ok=True)
    return build_setup(cfg, manifest_out=work / "split.json")


def _step_batches(setup: Any, total_steps: int) -> list[list[tuple[list[int], list[int]]]]:
    """The tokenised rows of each optimizer step of the quickstart run, in reprotune's order."""
    return [[setup.examples.get(r) for r in setup.order.step_rows(s)] for s in range(1, total_steps + 1)]


def worker_reprotune(total_steps: int, work: Path) -> list[float]:
    """Run the quickstart for ``total_steps`` steps; return the clock at the end of each step."""
    from reprotune._train.loop import StepEnd
    from reprotune._train.run import RunOptions, run_experiment

    stamps: list[float] = []

    class Clock:
        """A step hook: called once per step, after the step's ledger line, metrics and checkpoint."""

        def on_step_end(self, end: StepEnd) -> None:
            stamps.append(time.perf_counter())

    cfg = _quickstart_cfg(total_steps)
    os.chdir(work)  # the quickstart's MLflow store (./mlflow.db) goes into the scratch folder
    options = RunOptions(run_dir=work / "run", progress=False, code_dir=ROOT, hooks=(Clock(),))
    result = run_experiment(cfg, options)
    require(result.status == "completed", f"the run ended {result.status}")
    require(len(stamps) == total_steps, f"{len(stamps)} steps timed of {total_steps}")
    return stamps


def worker_trainer(total_steps: int, work: Path) -> list[float]:
    """The same steps with ``transformers.Trainer``; return the clock at the end of each step."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from reprotune._train.batches import collate

    cfg = _quickstart_cfg(total_steps)
    setup = _setup(cfg, work / "setup")  # the same model, LoRA init and rows as reprotune's run
    torch.set_num_threads(cfg.determinism.threads)
    torch.use_deterministic_algorithms(False)  # the Trainer's own defaults
    pad, model = setup.pad_token_id, setup.model
    rows = [ex for batch in _step_batches(setup, total_steps) for ex in batch]
    dataset = [{"input_ids": ids, "labels": labels} for ids, labels in rows]

    def collator(features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        return collate(
            [(f["input_ids"], f["labels"]) for f in features], pad_token_id=pad, padding_side="right"
        )

    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            stamps.append(time.perf_counter())

    args = TrainingArguments(
        output_dir=str(work / "trainer"),
        per_device_train_batch_size=cfg.train.batch_size,
        max_steps=total_steps,
        learning_rate=cfg.train.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=cfg.train.warmup_steps,
        max_grad_norm=cfg.train.max_grad_norm,
        weight_decay=cfg.train.weight_decay,
        optim="adamw_torch",
        train_sampling_strategy="sequential",  # the rows are already in reprotune's order
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_pin_memory=False,
        remove_unused_columns=False,
        seed=cfg.seed.root,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=dataset, data_collator=collator, callbacks=[Clock()]
    )
    trainer.train()
    require(len(stamps) == total_steps, f"{len(stamps)} Trainer steps timed of {total_steps}")
    return stamps


def _non_pad_tokens(total_steps: int, work: Path) -> list[int]:
    """Non-padding tokens of each optimizer step 1..``total_steps`` (the same batches on both sides)."""
    cfg = _quickstart_cfg(total_steps)
    batches = _step_batches(_setup(cfg, work), total_steps)
    return [sum(len(ids) for ids, _ in batch) for batch in batches]


def _spawn(side: str, total_steps: int, work: Path) -> list[float]:
    out = work / f"{side}.json"
    args = [
        sys.executable,
        __file__,
        "--worker",
        side,
        "--total-steps",
        str(total_steps),
        "--work",
        str(work),
    ]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stdout + done.stderr[-4000:], file=sys.stderr)
        require(False, f"the {side} worker failed (exit {done.returncode}; its output above)")
    return list(json.loads(out.read_text(encoding="utf-8")))


def bench_throughput(warmup: int, steps: int, rounds: int) -> bool:
    """Part 2; prints a table and returns True when reprotune's tokens/s >= the Trainer's.

    Each round runs both sides once, in alternating order, so that a burst of load from elsewhere
    on a shared machine falls on both; the figures sum the timed steps of every round.
    """
    total = warmup + steps + 1
    timed = f"steps {warmup + 1}..{warmup + steps} of {total}, {rounds} round(s)"
    print(f"\n== throughput: SmolLM2-135M with the quickstart settings, {timed} ==")
    step_s: dict[str, list[float]] = {"reprotune": [], "trainer": []}
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        work = Path(tmp)
        step_tokens = _non_pad_tokens(total, work / "tokens")[warmup : warmup + steps]
        for r in range(rounds):
            for side in ("reprotune", "trainer") if r % 2 == 0 else ("trainer", "reprotune"):
                side_dir = work / f"{side}-{r}"
                side_dir.mkdir()
                stamps = _spawn(side, total, side_dir)
                # stamps[i] is the end of step i + 1: step s takes stamps[s - 1] - stamps[s - 2].
                step_s[side] += [stamps[s - 1] - stamps[s - 2] for s in range(warmup + 1, warmup + steps + 1)]
    tokens = sum(step_tokens) * rounds
    print(f"{'':24}{'seconds':>10}{'s/step':>10}{'median s/step':>15}{'tokens/s':>12}")
    for side, label in (("reprotune", "reprotune run"), ("trainer", "transformers.Trainer")):
        secs = sum(step_s[side])
        median = statistics.median(step_s[side])
        print(
            f"{label:24}{secs:>10.2f}{secs / len(step_s[side]):>10.3f}{median:>15.3f}{tokens / secs:>12.1f}"
        )
    ratio = sum(step_s["trainer"]) / sum(step_s["reprotune"])
    per_step = statistics.median(t / r for r, t in zip(step_s["reprotune"], step_s["trainer"], strict=True))
    print(f"non-padding tokens in the timed steps: {tokens} ({sum(step_tokens)} per round)")
    print(f"reprotune / Trainer throughput, total tokens / total seconds: {ratio:.3f}")
    print(f"reprotune / Trainer throughput, median over the same batches: {per_step:.3f}   target >= 1.0")
    # The target is judged on the median of same-batch ratios: on a shared 2-core machine one
    # descheduled step can take 30x its usual time and would decide a ratio of totals alone.
    ok = per_step >= 1.0
    print("PASS" if ok else "MISS")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--quick", action="store_true", help="2 runs of 400 steps a variant; 1 round of 4 SmolLM2 steps"
    )
    parser.add_argument("--part", choices=("overhead", "throughput", "all"), default="all")
    parser.add_argument("--repeats", type=int, default=None, help="overhead: runs per variant (default 5)")
    parser.add_argument("--steps", type=int, default=None, help="overhead: steps per run (default 1200)")
    parser.add_argument(
        "--tp-steps", type=int, default=None, help="throughput: timed steps a round (default 4)"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="throughput: rounds of both sides (default 3)"
    )
    parser.add_argument("--worker", choices=("reprotune", "trainer"), help=argparse.SUPPRESS)
    parser.add_argument("--total-steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        worker = worker_reprotune if args.worker == "reprotune" else worker_trainer
        stamps = worker(args.total_steps, args.work)
        (args.work / f"{args.worker}.json").write_text(json.dumps(stamps), encoding="utf-8")
        return 0

    torch.set_num_threads(1)
    repeats = args.repeats or (2 if args.quick else 5)
    steps = args.steps or (400 if args.quick else 1200)
    tp_steps = args.tp_steps or 4
    tp_rounds = args.rounds or (1 if args.quick else 3)
    print(f"CPU pressure before: {cpu_pressure()}")
    results = []
    if args.part in ("overhead", "all"):
        results.append(bench_overhead(repeats, steps))
    if args.part in ("throughput", "all"):
        results.append(bench_throughput(2, tp_steps, tp_rounds))
    print(f"\nCPU pressure after: {cpu_pressure()}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
