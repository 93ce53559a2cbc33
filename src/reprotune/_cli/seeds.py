"""``reprotune seeds CONFIG --n N``: a seed study (docs/seed-studies.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from reprotune._cli._options import add_set_option, path_value, pin_cpu_isa

VARY = ("all", "split", "data_order", "lora_init", "dropout", "each")  # _studies.plan.VARY_CHOICES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=path_value, help="experiment config (YAML)")
    parser.add_argument(
        "--n", type=int, required=True, help="runs per group (at least 2; 5 or more is useful)"
    )
    parser.add_argument(
        "--vary",
        choices=VARY,
        default="all",
        help="which seeds move: all (new root seeds), one consumer, or each consumer in turn (default: all)",
    )
    parser.add_argument(
        "--out", type=path_value, default=None, help="study directory (default: studies/<study-id>)"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="runs at once, each in its own process (default: 1)"
    )
    add_set_option(parser)
    parser.add_argument("--no-tracking", action="store_true", help="do not mirror the study to MLflow")


def format_study(study: dict[str, Any], directory: Path, actions: dict[str, str], tracking: Any) -> str:
    """The closing lines of a study: what ran, each metric's summary, where to look."""
    from reprotune._studies.stats import shares_line, source_label

    counts = {a: sum(1 for v in actions.values() if v == a) for a in ("ran", "resumed", "kept")}
    did = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
    lines = [
        f"study {study['study_id']}: {study['status']}, {len(study['runs'])} runs "
        f"varying {study['vary']} ({did})",
        f"  study directory  {directory}",
    ]
    boot = study["bootstrap"]
    for metric in study["metrics"]:
        for group in study["groups"]:
            d = study["summary"][group][metric]
            label = metric if len(study["groups"]) == 1 else f"{metric} [{source_label(group)}]"
            lines.append(
                f"  {label}: mean {d['mean']:.6g}, sd {d['std']:.3g}, "
                f"min {d['min']:.6g}, max {d['max']:.6g}, 95% CI {d['ci_low']:.6g}..{d['ci_high']:.6g}"
            )
        shares = (study.get("variance") or {}).get(metric)
        if shares:
            lines.append(f"  {metric} variance by source: {shares_line(shares)}")
    lines.append(
        f"  intervals        bootstrap of the mean, {boot['n_resamples']} resamples, seed {boot['seed']}"
    )
    lines.append(f"  report           {directory / 'report.html'}")
    if tracking and tracking.get("ok"):
        lines.append(
            f"  MLflow parent    {tracking['parent_run_id']} in experiment {tracking['experiment']!r}"
        )
    elif tracking:
        lines.append(f"  MLflow           failed and was switched off: {tracking.get('error')}")
    lines += [f"  note: {note}" for note in [*study["notes"], *study["metric_notes"]]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from reprotune._config.loading import load_config

    cfg = load_config(args.config, args.overrides)
    pin_cpu_isa(cfg.determinism.cpu_isa)  # before torch loads
    from reprotune._studies.study import StudyOptions, run_study

    options = StudyOptions(out=args.out, jobs=args.jobs, tracking=not args.no_tracking, name=args.config.stem)
    result = run_study(cfg, n=args.n, vary=args.vary, options=options)
    print(format_study(result.study, result.directory, dict(result.actions), result.tracking))
    return 0
