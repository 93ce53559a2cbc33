"""Benchmark: distributed runs under torchrun (CPU, gloo) against one process, and the cost of the
fixed-order reductions against a plain all-reduce.

Every variant is a real ``torchrun --standalone`` launch of this script as a worker, which calls
``run_experiment`` (the run ``reprotune run`` makes: ledger, weights hash, no trackers) on the tiny
model with one global batch of 8 rows per step (4 micro-batches of 2), for DDP and FSDP at world
sizes 1 and 2. Rank 0 reports the run's step times (the median, skipping the first steps).

The reductions: in each worker, with its process group up, the float64 vector one step gathers
(one loss per micro-batch, the gradient square sum, the token count, the rows' hash) is gathered
and added in rank order (``gather_f64`` + ``ordered_sum``, what every step does) and, interleaved
with it, all-reduced plainly (``all_reduce``, whose order the backend picks), ``--reps`` times each.
Their medians, and the extra the fixed order costs, are given as shares of the same launch's
median step time. Target: the fixed-order reduction costs <= 5 % of a step. Exit 1 when missed.

World size 2 on 2 cores gives no speed-up on a model this small: the figures show the overhead of
the distributed machinery, not a scaling curve. On a shared machine step times move with the load;
compare the ratios of one invocation.

``--part invariant``: ``train.world_size_invariant`` (each micro-batch's LoRA gradient gathered and
added in global micro-batch order) against the plain backend reduction, on the tiny model (DDP and
FSDP2) and on the quickstart (SmolLM2-135M, LoRA r=8 on q/v, batch 4, 2 micro-batches a step; DDP)
at world sizes 1 and 2. Launches of the two modes alternate (off, on, off, on ...: ``--rounds``
pairs), and each pair's ratio of median step times is taken; the figure is the median of those
ratios. Target: at most 1.15x. The extra memory is that of the gradient copies, per rank: the LoRA
parameters' elements x 4 bytes x (its own micro-batches + all micro-batches gathered + the sum).

Run: ``.venv/bin/python bench/bench_distributed.py [--quick] [--part reductions|invariant|all]``
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
from pathlib import Path

from _machine import require

ROOT = Path(__file__).resolve().parents[1]
TARGET_SHARE = 0.05
TARGET_INVARIANT = 1.15
VARIANTS = (("ddp", 1), ("ddp", 2), ("fsdp", 1), ("fsdp", 2))
#: (config, world size) of the invariant part: the tiny model under both strategies, the quickstart.
INVARIANT_VARIANTS = (("ddp", 1), ("ddp", 2), ("fsdp", 1), ("fsdp", 2), ("quickstart", 1), ("quickstart", 2))
WARMUP_STEPS = 3


def write_project(root: Path, steps: int) -> None:
    """The tiny model, its data, and one config per strategy in ``root``."""
    import yaml

    from reprotune.testing import build_tiny_model, write_tiny_dataset

    build_tiny_model(root / "tiny-model", seed=0)
    write_tiny_dataset(root / "data.jsonl", 400, seed=0, n_categories=3)
    for strategy in ("ddp", "fsdp"):
        config = {
            "seed": {"root": 1},
            "data": {"path": "data.jsonl"},
            "split": {"stratify_by": "category"},
            "model": {"name": "tiny-model", "max_length": 64},
            "lora": {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]},
            "train": {
                "batch_size": 2,
                "grad_accum_steps": 4,
                "max_steps": steps,
                "eval_every": 0,
                "save_every": 0,
            },
            "eval": {"batch_size": 8, "max_rows": 8},
            "determinism": {"mode": "strict", "threads": 1, "device": "cpu"},
            "tracking": {"mlflow": False},
            "distributed": {"strategy": strategy, "timeout_s": 300},
        }
        (root / f"{strategy}.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        invariant = {**config, "train": {**config["train"], "world_size_invariant": True}}  # type: ignore[dict-item]
        (root / f"{strategy}-invariant.yaml").write_text(yaml.safe_dump(invariant), encoding="utf-8")
    quickstart = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text(encoding="utf-8"))
    quickstart["train"].update(
        {
            "grad_accum_steps": 2,
            "max_steps": max(steps // 2, WARMUP_STEPS + 4),
            "eval_every": 0,
            "save_every": 0,
        }
    )
    quickstart["determinism"]["threads"] = 1
    quickstart["tracking"] = {"mlflow": False}
    quickstart["distributed"] = {"strategy": "ddp", "timeout_s": 600}
    (root / "quickstart.yaml").write_text(yaml.safe_dump(quickstart), encoding="utf-8")
    quickstart["train"]["world_size_invariant"] = True
    (root / "quickstart-invariant.yaml").write_text(yaml.safe_dump(quickstart), encoding="utf-8")


def worker(config: Path, run_dir: Path, out: Path, reps: int) -> None:
    """One rank of a launch: time the reductions, then the run; rank 0 writes ``out``."""
    import torch.distributed as dist

    from reprotune._config.loading import load_config
    from reprotune._train.distributed import gather_f64, start_process_group
    from reprotune._train.run import RunOptions, run_experiment
    from reprotune._train.step import ordered_sum

    cfg = load_config(config)
    ctx = start_process_group(cfg)
    require(ctx is not None, "the worker runs under torchrun")
    assert ctx is not None  # for the type checker
    import torch

    n = cfg.train.grad_accum_steps + 3  # what one step gathers
    values = [float(i) + 0.5 for i in range(n)]
    fixed, plain = [], []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        parts = gather_f64(ctx, values)
        [ordered_sum([p[i] for p in parts]) for i in range(n)]
        fixed.append(time.perf_counter() - start)
        dist.barrier()
        start = time.perf_counter()
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor)
        tensor.tolist()
        plain.append(time.perf_counter() - start)
    result = run_experiment(cfg, RunOptions(run_dir=run_dir, progress=False, tracking=False))
    if ctx.is_main:
        import resource

        from safetensors.torch import load_file

        adapter = load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))
        out.write_text(
            json.dumps(
                {
                    "step_times_s": list(result.step_times_s),
                    "fixed_s": statistics.median(fixed),
                    "plain_s": statistics.median(plain),
                    "recording_share": result.record["timings"].get("recording_share"),
                    "lora_elements": sum(t.numel() for t in adapter.values()),
                    "micro_batches": cfg.train.grad_accum_steps,
                    "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                }
            ),
            encoding="utf-8",
        )
    dist.destroy_process_group()


def launch(root: Path, strategy: str, world: int, reps: int, *, tag: str = "") -> dict[str, object]:
    """One torchrun launch of the worker on ``root/STRATEGY.yaml``; rank 0's figures."""
    out = root / f"{strategy}-{world}{tag}.json"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(world),
        str(Path(__file__).resolve()),
        "--worker",
        str(root / f"{strategy}.yaml"),
        "--run-dir",
        str(root / "runs" / f"{strategy}-{world}{tag}"),
        "--out",
        str(out),
        "--reps",
        str(reps),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(
            f"{strategy} at world size {world} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    figures: dict[str, object] = json.loads(out.read_text(encoding="utf-8"))
    return figures


def _median_step(figures: dict[str, object]) -> float:
    return statistics.median(list(figures["step_times_s"])[WARMUP_STEPS:])  # type: ignore[call-overload]


def reductions(steps: int, reps: int) -> bool:
    """The fixed-order reductions of the loss vector against a plain all-reduce; True when met."""
    import torch

    print(
        f"tiny Llama (2 layers, width 64), LoRA r=4, 8 rows a step (4 micro-batches of 2), {steps} steps, "
        f"CPU, gloo, 1 thread per rank, torch {torch.__version__}, {os.cpu_count()} cores"
    )
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_project(root, steps)
        for strategy, world in VARIANTS:
            rows[(strategy, world)] = launch(root, strategy, world, reps)
    print(
        f"\n  {'variant':<10}{'step (median)':>15}{'vs world 1':>12}{'recording':>11}"
        f"{'fixed-order':>13}{'all_reduce':>12}{'fixed share':>13}{'extra share':>13}"
    )
    worst = 0.0
    for (strategy, world), figures in rows.items():
        step = _median_step(figures)
        base = _median_step(rows[(strategy, 1)])
        fixed, plain = float(figures["fixed_s"]), float(figures["plain_s"])  # type: ignore[arg-type]
        share, extra = fixed / step, (fixed - plain) / step
        worst = max(worst, share) if world > 1 else worst
        recording = figures.get("recording_share")
        print(
            f"  {strategy + ' W=' + str(world):<10}{step * 1e3:>12.1f} ms{step / base:>11.2f}x"
            f"{(recording or 0.0):>11.1%}{fixed * 1e6:>10.0f} us{plain * 1e6:>9.0f} us"
            f"{share:>13.2%}{extra:>+13.2%}"
        )
    met = worst <= TARGET_SHARE
    print(
        f"\nfixed-order reduction per step at world size 2: at most {worst:.2%} of a step "
        f"(target <= {TARGET_SHARE:.0%}): {'met' if met else 'MISSED'}"
    )
    return met


def invariant(steps: int, rounds: int) -> bool:
    """The world-size invariant mode against the plain backend reduction; True when met."""
    print(
        f"\ntrain.world_size_invariant on vs off: tiny model {steps} steps (4 micro-batches of 2), "
        f"quickstart {max(steps // 2, WARMUP_STEPS + 4)} steps (2 micro-batches of 4); {rounds} "
        "alternating pairs of launches per variant, 1 thread per rank"
    )
    print(
        f"\n  {'variant':<16}{'off (median)':>14}{'on (median)':>14}{'on / off':>10}"
        f"{'pair ratios':>24}{'extra grads':>13}{'max RSS on-off':>16}"
    )
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_project(root, steps)
        for config, world in INVARIANT_VARIANTS:
            ratios, offs, ons, rss = [], [], [], []
            for n in range(rounds):
                off = launch(root, config, world, 1, tag=f"-off{n}")
                on = launch(root, f"{config}-invariant", world, 1, tag=f"-on{n}")
                offs.append(_median_step(off))
                ons.append(_median_step(on))
                ratios.append(ons[-1] / offs[-1])
                rss.append((int(on["max_rss_kib"]) - int(off["max_rss_kib"])) / 1024)  # type: ignore[call-overload]
            elements, k = int(on["lora_elements"]), int(on["micro_batches"])  # type: ignore[call-overload]
            extra_mib = elements * 4 * (k // world + k + 1) / 2**20
            ratio = statistics.median(ratios)
            worst = max(worst, ratio)
            print(
                f"  {config + ' W=' + str(world):<16}{statistics.median(offs) * 1e3:>11.1f} ms"
                f"{statistics.median(ons) * 1e3:>11.1f} ms{ratio:>9.3f}x"
                f"{' '.join(f'{r:.3f}' for r in ratios):>24}{extra_mib:>9.2f} MiB"
                f"{statistics.median(rss):>+12.1f} MiB"
            )
    met = worst <= TARGET_INVARIANT
    print(
        f"\nworld-size invariant mode: at most {worst:.3f}x the plain reduction's step time "
        f"(target <= {TARGET_INVARIANT}x): {'met' if met else 'MISSED'}"
    )
    return met


def main(argv: list[str] | None = None) -> int:
    """Run the parts and print their tables; 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, repetitions and rounds")
    parser.add_argument("--part", choices=("reductions", "invariant", "all"), default="all")
    parser.add_argument(
        "--steps", type=int, default=None, help="optimizer steps per run (default 40; quick 12)"
    )
    parser.add_argument(
        "--reps", type=int, default=None, help="reductions timed per launch (default 400; quick 100)"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="invariant part: pairs of launches (default 3; quick 1)"
    )
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    reps = args.reps or (100 if args.quick else 400)
    if args.worker is not None:
        require(args.run_dir is not None and args.out is not None, "a worker needs --run-dir and --out")
        worker(args.worker, args.run_dir, args.out, reps)
        return 0
    steps = args.steps or (12 if args.quick else 40)
    met = True
    if args.part in ("reductions", "all"):
        met &= reductions(steps, reps)
    if args.part in ("invariant", "all"):
        met &= invariant(steps, args.rounds or (1 if args.quick else 3))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
