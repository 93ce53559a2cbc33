"""``reprotune seeds``: a study's life, from its plan to its ``study.json`` and report.

1. plan the runs (``_studies.plan``: the seed rule) and open the study directory: a new one, or
   the same study begun before (same config and vary; a larger ``--n`` extends it);
2. bring every run to completion (``_studies.execute``: kept, resumed or run), writing
   ``study.json`` after each and tagging its MLflow run as a child of the study's;
3. summarise every metric all runs have (``_studies.stats``), write the final ``study.json`` and
   ``report.html``, and close the MLflow parent run.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprotune._config.loading import dump_config_yaml
from reprotune._config.schema import ExperimentConfig, config_sha256
from reprotune._determinism.seeds import derive_seed
from reprotune._errors import InputError, SchemaVersionError
from reprotune._jsonio import write_bytes_atomic
from reprotune._run.layout import LOCK
from reprotune._run.lock import holding_run_dir
from reprotune._run.outputs import first_missing, refuse_inside_run, refuse_unwritable_parent
from reprotune._run.record import RunRecord, ended_status
from reprotune._studies import layout
from reprotune._studies.execute import Action, RunOutcome, execute_runs
from reprotune._studies.layout import StudyLayout
from reprotune._studies.metrics import FINAL_VAL_LOSS, run_metrics
from reprotune._studies.plan import SEED_RULE, PlannedRun, StudyPlan, plan_study
from reprotune._studies.report import write_study_report
from reprotune._studies.sources import base_model, data_identity
from reprotune._studies.stats import (
    BOOTSTRAP_METHOD,
    BOOTSTRAP_RESAMPLES,
    CONFIDENCE,
    describe,
    variance_shares,
)
from reprotune._studies.studyfile import load_study, write_study
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
    created = first_missing(paths.root)
    undo = False  # refused, holding the directory this call made, before a run began: as it was
    try:
        # One writer: a second `seeds` on the same directory is refused while this one runs (that
        # refusal, before the lock is held, removes nothing: the directory is the other's).
        with holding_run_dir(paths.root, report=options.progress, what="study directory", option="--out"):
            try:
                return _run_locked(cfg, plan, paths, options)
            except InputError:
                undo = created is not None and not _runs_made(paths)
                raise
    finally:
        if undo and created is not None:
            shutil.rmtree(created, ignore_errors=True)


def _never_began(study: dict[str, Any], paths: StudyLayout) -> bool:
    """A study every run of which is still planned, none with a directory (one refused at its
    first run, by a reprotune before such a refusal removed it)."""
    return all(run.get("status") == "planned" for run in study["runs"]) and not _runs_made(paths)


def _runs_made(paths: StudyLayout) -> bool:
    """Whether a run of the study has begun (its directory exists)."""
    runs = paths.root / layout.RUNS
    return runs.is_dir() and any(runs.iterdir())


def _run_locked(
    cfg: ExperimentConfig, plan: StudyPlan, paths: StudyLayout, options: StudyOptions
) -> StudyResult:
    before = paths.study.read_bytes() if paths.study.is_file() else None
    study = _open(paths, plan)
    dump_config_yaml(cfg, paths.config)
    tracker = _tracker(cfg, plan, paths, options)
    actions: dict[str, Action] = {}
    notes: dict[str, list[str]] = {}
    records: dict[str, RunRecord] = {}
    entries = {entry["name"]: entry for entry in study["runs"]}
    seconds = 0.0

    def on_done(outcome: RunOutcome) -> None:
        nonlocal seconds
        seconds += outcome.seconds
        entry, run_notes = _entry(outcome)
        entries[outcome.planned.name] = entry
        notes[outcome.planned.name] = run_notes
        records[outcome.planned.name] = outcome.record
        actions[outcome.planned.name] = outcome.action
        write_study(paths.study, {**study, "runs": [entries[r.name] for r in plan.runs]})
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
    runs = [entries[r.name] for r in plan.runs]
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


def _open(paths: StudyLayout, plan: StudyPlan) -> dict[str, Any]:
    """The study's ``study.json`` content to start from: new, or the one begun before (checked)."""
    fresh = new_study(plan)
    rebuild = (
        f"remove {paths.study} and run the same command again: its run directories are checked "
        "against the plan and kept, and study.json is written anew"
    )
    if paths.study.is_file():
        try:
            old = load_study(paths.study)
        except SchemaVersionError:
            raise
        except InputError as exc:  # damaged: rewriting it needs the runs alone
            raise InputError(exc.message, source=exc.source, fix=rebuild) from None
        for key, what in (("config_sha256", "config"), ("vary", "--vary")):
            if old[key] != fresh[key] and _never_began(old, paths):  # nothing of it to keep
                paths.mlflow.unlink(missing_ok=True)  # its MLflow parent run is the other config's
                write_study(paths.study, fresh)
                return fresh
            if old[key] != fresh[key]:
                raise InputError(
                    f"study directory {paths.root} holds a study of another {what} "
                    f"({old[key]!r} there, {fresh[key]!r} now)",
                    source=str(paths.study),
                    fix="give this study another --out directory, or run the command that began that one",
                )
        if old["n"] > plan.n:
            raise InputError(
                f"study directory {paths.root} holds a study of --n {old['n']}; --n {plan.n} would drop runs",
                source="--n",
                fix=f"pass --n {old['n']} (or more, to add runs), or another --out directory",
            )
        return fresh
    if paths.root.is_dir():
        for leftover in paths.root.glob(f".{layout.STUDY}.*.tmp"):
            leftover.unlink()  # a first study.json killed before it landed: nothing was run
    if paths.root.exists() and not _only_this_studys_runs(paths, plan):
        raise InputError(
            f"{paths.root} exists and is not a study directory (it has no {layout.STUDY})",
            source="--out",
            fix="choose a new --out directory, or an empty one",
        )
    paths.root.mkdir(parents=True, exist_ok=True)
    write_study(paths.study, fresh)
    return fresh


def _only_this_studys_runs(paths: StudyLayout, plan: StudyPlan) -> bool:
    """Whether ``paths.root`` is empty, or holds only what this study writes besides study.json
    (its runs, by their planned names, logs, report): a study whose study.json was removed, which
    a rerun rebuilds from its runs (each checked against the plan)."""
    if not paths.root.is_dir():
        return False
    known = {LOCK, layout.RUNS, layout.LOGS, layout.REPORT, layout.MLFLOW, layout.CONFIG}
    if any(p.name not in known for p in paths.root.iterdir()):
        return False
    runs = paths.root / layout.RUNS
    planned = {r.name for r in plan.runs}
    return not runs.exists() or (runs.is_dir() and all(p.name in planned for p in runs.iterdir()))


def new_study(plan: StudyPlan) -> dict[str, Any]:
    """The ``study.json`` content of a study about to start: the plan, every run ``planned``."""
    cfg = plan.config
    return {
        "study_id": plan.study_id,
        "status": "running",
        "config": cfg.resolved(),
        "config_sha256": config_sha256(cfg),
        "vary": plan.vary,
        "n": plan.n,
        "groups": list(plan.groups),
        "seed_rule": SEED_RULE,
        "notes": list(plan.notes),
        "base_model": None,
        "bootstrap": {
            "seed": derive_seed(cfg.seed.root, "study/bootstrap"),
            "seed_rule": "derive_seed(R, 'study/bootstrap'); a new numpy Generator from it per interval",
            "method": f"scipy.stats.bootstrap, {BOOTSTRAP_METHOD} (percentile when BCa cannot be computed)",
            "n_resamples": BOOTSTRAP_RESAMPLES,
            "confidence_level": CONFIDENCE,
        },
        "runs": [_planned_entry(r) for r in plan.runs],
        "metrics": [],
        "summary": {},
        "variance": None,
        "metric_notes": [],
    }


def _planned_entry(planned: PlannedRun) -> dict[str, Any]:
    return {
        "name": planned.name,
        "dir": f"{layout.RUNS}/{planned.name}",
        "group": planned.group,
        "varied": planned.varied,
        "index": planned.index,
        "seed": planned.seed,
        "status": "planned",
        "config_sha256": config_sha256(planned.config),
    }


def _entry(outcome: RunOutcome) -> tuple[dict[str, Any], list[str]]:
    record = outcome.record
    outputs = record.outputs
    metrics, notes, setups = run_metrics(outcome.run_dir, outputs.final_val_loss if outputs else None)
    entry = {
        **_planned_entry(outcome.planned),
        "status": "completed",
        "seeds": dict(record.seeds),
        "adapter_sha256": outputs.adapter_sha256 if outputs else None,
        "ledger_sha256": outputs.ledger_sha256 if outputs else None,
        "metrics": metrics,
        "metric_setups": setups,
    }
    return entry, notes


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
