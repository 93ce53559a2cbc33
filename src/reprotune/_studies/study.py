"""``reprotune seeds``: a study's life, from its plan to its ``study.json`` and report.

1. plan the runs (``_studies.plan``: the seed rule) and open the study directory
   (``_studies.directory``): a new one, or the same study begun before (same config and vary; a
   larger ``--n`` extends it); refused before a run began, the directory is put back as it was,
   byte for byte;
2. bring every run to completion (``_studies.execute``: kept, resumed or run), writing
   ``study.json`` after each and tagging its MLflow run as a child of the study's;
3. name every metric across the runs (``_studies.metrics``), summarise each one all runs have
   (``_studies.stats``), write the final ``study.json`` and ``report.html``, and close the MLflow
   parent run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprotune._config.loading import dump_config_yaml
from reprotune._config.schema import ExperimentConfig, config_sha256
from reprotune._determinism.seeds import derive_seed
from reprotune._errors import InputError
from reprotune._jsonio import write_bytes_atomic
from reprotune._run.lock import holding_run_dir
from reprotune._run.outputs import refuse_inside_run, refuse_unwritable_parent
from reprotune._run.record import RunRecord, ended_status
from reprotune._studies.directory import Before, Rewritten, open_study, planned_entry, put_back, runs_made
from reprotune._studies.execute import Action, RunOutcome, execute_runs
from reprotune._studies.layout import StudyLayout
from reprotune._studies.metrics import FINAL_VAL_LOSS, RunMeasures, name_metrics, read_run
from reprotune._studies.plan import StudyPlan, plan_study
from reprotune._studies.report import write_study_report
from reprotune._studies.sources import base_model, data_identity
from reprotune._studies.stats import describe, variance_shares
from reprotune._studies.studyfile import write_study
from reprotune._studies.tracking import StudyTracker
from reprotune._trackers.base import flatten_params
from reprotune._version import __version__


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class StudyOptions:
    """How to run a study, beyond its config, ``n`` and ``vary``.

    Args:
        out: the study directory; default ``studies/<study id>`` under the current directory.
        jobs: runs at once; 1 runs them in this process, more in separate processes.
        tracking: mirror to MLflow when the config enables it.
        name: a short name for the study id (the config file's stem).
        progress: where one line per run goes.
    """

    out: Path | None = None
    jobs: int = 1
    tracking: bool = True
    name: str = "study"
    progress: Callable[[str], None] = field(default=_stderr)


@dataclass(frozen=True)
class StudyResult:
    """A finished study: where, its ``study.json`` content, and what this invocation did."""

    directory: Path
    study: dict[str, Any]
    actions: dict[str, Action]
    seconds_in_runs: float
    tracking: dict[str, Any] | None


def run_study(
    cfg: ExperimentConfig, *, n: int, vary: str, options: StudyOptions = StudyOptions()
) -> StudyResult:
    """Run (or continue) the seed study of ``cfg``: ``n`` runs per group varying ``vary``.

    Raises:
        InputError: bad ``n``, ``vary`` or ``jobs``; a study directory that holds something else;
            a run directory that no longer matches its record.
        RunFailedError: a run failed (run the same command again to continue once it is fixed).

    Example:
        >>> cfg = load_config("examples/quickstart.yaml", ["train.max_steps=10"])  # doctest: +SKIP
        >>> result = run_study(cfg, n=3, vary="all")  # doctest: +SKIP
        >>> result.study["summary"]["all"]["final_val_loss"]["mean"]  # doctest: +SKIP
    """
    if isinstance(options.jobs, bool) or not isinstance(options.jobs, int) or options.jobs < 1:
        raise InputError(
            f"--jobs must be 1 or more (got {options.jobs!r})", source="--jobs", fix="e.g. --jobs 2"
        )
    plan = plan_study(cfg, n=n, vary=vary, name=options.name)
    paths = StudyLayout(options.out or Path("studies") / plan.study_id)
    refuse_inside_run(paths.root, option="--out")
    refuse_unwritable_parent(paths.root, source="--out")
    before = Before.look(paths.root)
    undo = False  # refused before a run began: the directory as this call found it
    try:
        # One writer: a second `seeds` on the same directory is refused while this one runs (that
        # refusal, before the lock is held, removes nothing: the directory is the other's).
        with holding_run_dir(paths.root, report=options.progress, what="study directory", option="--out"):
            rewritten = Rewritten.read(paths)
            try:
                return _run_locked(cfg, plan, paths, options)
            except InputError:
                undo = not runs_made(paths)
                if undo:  # the files it rewrote, under the lock: a study taken over is the other's again
                    rewritten.restore()
                raise
    finally:
        if undo:
            put_back(paths.root, before)


def _run_locked(
    cfg: ExperimentConfig, plan: StudyPlan, paths: StudyLayout, options: StudyOptions
) -> StudyResult:
    before = paths.study.read_bytes() if paths.study.is_file() else None
    study = open_study(paths, plan)
    dump_config_yaml(cfg, paths.config)
    tracker = _tracker(cfg, plan, paths, options)
    actions: dict[str, Action] = {}
    records: dict[str, RunRecord] = {}
    measured: dict[str, RunMeasures] = {}
    entries = {entry["name"]: entry for entry in study["runs"]}
    seconds = 0.0

    def on_done(outcome: RunOutcome) -> None:
        nonlocal seconds
        seconds += outcome.seconds
        entries[outcome.planned.name] = _entry(outcome)
        outputs = outcome.record.outputs
        loss = outputs.final_val_loss if outputs is not None else None
        measured[outcome.planned.name] = read_run(outcome.run_dir, loss)
        records[outcome.planned.name] = outcome.record
        actions[outcome.planned.name] = outcome.action
        write_study(paths.study, {**study, "runs": _named_runs(plan, entries, measured)})
        if tracker is not None:
            _adopt(tracker, plan, outcome)
        options.progress(_progress_line(plan, outcome, len(actions)))

    try:
        execute_runs(plan.runs, paths, jobs=options.jobs, tracking=options.tracking, on_done=on_done)
    except BaseException as exc:
        if isinstance(exc, InputError) and before is not None:
            write_bytes_atomic(paths.study, before)  # a refused continuation leaves the study as it was
        if tracker is not None:  # the parent run says so; a study continued later reopens it
            status = ended_status(exc)
            tracker.finish({}, [paths.study], status)
        raise
    runs = _named_runs(plan, entries, measured)
    notes = {name: list(m.notes) for name, m in measured.items()}
    final = {**study, "status": "completed", "runs": runs, **summarise_runs(plan, runs, notes)}
    final["base_model"], model_notes = base_model([records[r.name] for r in plan.runs])
    final["data"], data_notes = data_identity([records[r.name] for r in plan.runs])
    final["metric_notes"] = final["metric_notes"] + model_notes + data_notes
    write_study(paths.study, final)
    write_study_report(final, paths.report)
    summary = None
    if tracker is not None:
        summary = tracker.finish(_parent_metrics(final), [paths.study, paths.report], "completed")
    return StudyResult(paths.root, final, actions, seconds, summary)


def _entry(outcome: RunOutcome) -> dict[str, Any]:
    """A completed run's entry in ``study.json``, but for its metrics (:func:`_named_runs`)."""
    record = outcome.record
    outputs = record.outputs
    return {
        **planned_entry(outcome.planned),
        "status": "completed",
        "seeds": dict(record.seeds),
        "adapter_sha256": outputs.adapter_sha256 if outputs else None,
        "ledger_sha256": outputs.ledger_sha256 if outputs else None,
    }


def _named_runs(
    plan: StudyPlan, entries: Mapping[str, dict[str, Any]], measured: Mapping[str, RunMeasures]
) -> list[dict[str, Any]]:
    """Every run's entry in plan order, each completed one with its metrics named across the
    completed runs (:func:`name_metrics`): the names one run's evals get depend on the others'."""
    done = [r.name for r in plan.runs if r.name in measured]
    named = dict(zip(done, name_metrics([measured[name] for name in done]), strict=True))
    return [
        {**entries[r.name], "metrics": named[r.name][0], "metric_setups": named[r.name][1]}
        if r.name in named
        else entries[r.name]
        for r in plan.runs
    ]


def summarise_runs(
    plan: StudyPlan, runs: Sequence[dict[str, Any]], notes: dict[str, list[str]]
) -> dict[str, Any]:
    """Per group and metric: the description; with ``each``, the variance shares per metric."""
    names = sorted({name for run in runs for name in run["metrics"]})
    complete = [m for m in names if all(m in run["metrics"] for run in runs)]
    metric_notes = [line for r in plan.runs for line in notes.get(r.name, [])]
    for name in names:
        if name not in complete:
            have = sum(name in run["metrics"] for run in runs)
            metric_notes.append(
                f"{name}: measured in {have} of {len(runs)} runs only, left out of the summary"
            )
    for name in list(complete):  # evaluated otherwise in some runs: not one sample
        setups = sorted({(run.get("metric_setups") or {}).get(name) or "?" for run in runs})
        if name != FINAL_VAL_LOSS and len(setups) > 1:
            complete.remove(name)
            metric_notes.append(
                f"{name}: the runs' evaluations differ ({' vs '.join(setups)}), left out of the "
                "summary: evaluate every run alike"
            )
    seed = derive_seed(plan.config.seed.root, "study/bootstrap")
    values = {
        group: {m: [run["metrics"][m] for run in runs if run["group"] == group] for m in complete}
        for group in plan.groups
    }
    summary = {
        group: {m: describe(v, seed=seed) for m, v in by_metric.items()}
        for group, by_metric in values.items()
    }
    variance = None
    if plan.vary == "each":
        variance = {m: variance_shares({g: values[g][m] for g in plan.groups}) for m in complete}
    return {"metrics": complete, "summary": summary, "variance": variance, "metric_notes": metric_notes}


def _tracker(
    cfg: ExperimentConfig, plan: StudyPlan, paths: StudyLayout, options: StudyOptions
) -> StudyTracker | None:
    if not (options.tracking and cfg.tracking.mlflow):
        return None
    tracker = StudyTracker(
        cfg.tracking.uri,
        cfg.tracking.artifact_location,
        cfg.tracking.experiment,
        paths.mlflow,
        options.progress,
    )
    params = {**flatten_params(cfg.resolved()), "study.vary": plan.vary, "study.n": str(plan.n)}
    tags = {
        "reprotune.version": __version__,
        "reprotune.study_id": plan.study_id,
        "reprotune.study.vary": plan.vary,
        "config.sha256": config_sha256(cfg),
    }
    tracker.start(plan.study_id, params, tags)
    return tracker


def _adopt(tracker: StudyTracker, plan: StudyPlan, outcome: RunOutcome) -> None:
    mlflow = outcome.record.tracker("mlflow")
    if mlflow is not None and mlflow.ok and mlflow.mlflow_run_id:
        tracker.adopt(
            mlflow.mlflow_run_id,
            {
                "reprotune.study_id": plan.study_id,
                "reprotune.study.varied": outcome.planned.varied,
                "reprotune.study.seed": str(outcome.planned.seed),
                "reprotune.study.index": str(outcome.planned.index),
            },
        )


def _parent_metrics(study: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    single = len(study["groups"]) == 1
    for group, by_metric in study["summary"].items():
        prefix = "" if single else f"{group}."
        for metric, d in by_metric.items():
            for key in ("mean", "std", "ci_low", "ci_high"):
                if d[key] is not None:
                    out[f"{prefix}{metric}.{key}"] = d[key]
    for metric, shares in (study["variance"] or {}).items():
        for group, s in shares.items():
            if s["share"] is not None:
                out[f"variance_share.{metric}.{group}"] = s["share"]
    return out


def _progress_line(plan: StudyPlan, outcome: RunOutcome, done: int) -> str:
    p = outcome.planned
    outputs = outcome.record.outputs
    loss = outputs.final_val_loss if outputs is not None else None
    shown = f", final val loss {float.fromhex(loss):.6f}" if loss is not None else ""
    verb = {"kept": "verified and kept", "ran": "ran", "resumed": "resumed"}[outcome.action]
    return (
        f"seeds: {done}/{len(plan.runs)} {p.name} ({p.varied} seed {p.seed}): {verb} "
        f"in {outcome.seconds:.1f} s{shown}"
    )
