"""``reprotune run CONFIG``: a reproducible LoRA fine-tune."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from reprotune._cli._options import add_set_option, add_watch_options, path_value, pin_cpu_isa, watch_hooks

if TYPE_CHECKING:
    from reprotune._train.options import RunResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=path_value, help="experiment config (YAML)")
    add_set_option(parser)
    parser.add_argument(
        "--run-dir", type=path_value, default=None, help="run directory (default: runs/<run-id>)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-tracking", action="store_true", help="do not mirror the run to MLflow")
    # For verify's resume leg: stop after this step, as if interrupted, leaving a resumable run.
    parser.add_argument("--stop-after-step", type=int, default=None, help=argparse.SUPPRESS)
    # For rerun: train on this manifest (a recorded run's split.json) instead of the config's split.
    parser.add_argument("--manifest", type=path_value, default=None, help=argparse.SUPPRESS)
    add_watch_options(parser)


def print_summary(result: RunResult) -> None:
    """The closing lines of a run: where it is, what it produced, how to look at it (said by rank 0
    alone in a distributed run)."""
    record = result.typed  # None on a distributed run's ranks other than 0
    if record is None:
        return
    print(f"run {record.run_id}: {result.status} after {result.steps_done} steps")
    print(f"  run directory   {result.run_dir}")
    if result.adapter_sha256:
        print(f"  adapter sha256  {result.adapter_sha256}")
    if result.final_val_loss is not None:
        print(f"  final val loss  {result.final_val_loss:.6f}")
    median, share = record.timings.step_time_s_median, record.timings.recording_share
    if median is not None:
        cost = f"; recording (ledger, weights hash, trackers) {share:.2%} of it" if share is not None else ""
        print(f"  step time       {median * 1e3:.1f} ms median{cost}")
    mlflow = record.tracker("mlflow")
    if mlflow is not None and mlflow.ok and mlflow.mlflow_run_id:
        print(f"  MLflow run      {mlflow.mlflow_run_id} in experiment {mlflow.experiment!r}")
        print(f"  open MLflow     mlflow ui --backend-store-uri {mlflow.tracking_uri}")
    elif mlflow is not None:
        print(f"  MLflow          failed and was switched off: {mlflow.error}")


def run(args: argparse.Namespace) -> int:
    from reprotune._config.loading import load_config

    cfg = load_config(args.config, args.overrides)
    pin_cpu_isa(cfg.determinism.cpu_isa)  # before torch loads
    from reprotune._train.options import RunOptions
    from reprotune._train.run import run_experiment

    options = RunOptions(
        run_dir=args.run_dir,
        progress=not args.no_progress,
        tracking=not args.no_tracking,
        stop_after_step=args.stop_after_step,
        manifest=args.manifest,
        hooks=watch_hooks(args),
        train_lock=args.train_lock,
    )
    result = run_experiment(cfg, options)
    print_summary(result)
    from reprotune._cli.eval import eval_at_end

    eval_at_end(result, progress=not args.no_progress)  # eval.generate_at_end (docs/eval.md)
    return 0
