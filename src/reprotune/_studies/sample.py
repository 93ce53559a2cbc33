"""A completed study as one sample to test, or the reason it is none (``significance``, exit 2).

A ``study.json`` is read as its writer left it only if it holds together: every planned run
completed with a finite value of each listed metric, each group's summary made of exactly those
values (an edited number, in a run or in a summary, is refused, naming where), and every run
started from the same base model files. Never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reprotune._errors import InputError
from reprotune._studies.studyfile import load_study

#: What a study whose study.json does not hold together is told to do: its runs are the truth.
REWRITE_FIX = "run the `reprotune seeds` command that made it again: it rewrites study.json from its runs"


def load_checked(path: str | Path, option: str, *, allow_different_models: bool = False) -> dict[str, Any]:
    """The study at ``path`` (:func:`~reprotune._studies.studyfile.load_study`) when it is one
    sample ``significance`` can test.

    Args:
        path: the study directory or its ``study.json``.
        option: the argument it came from (``STUDY_A``), for messages.
        allow_different_models: take a study whose runs started from different base models.

    Raises:
        InputError: unreadable, unfinished, of ``--vary each``, fewer than 2 runs, no metric every
            run measured, a study.json that does not hold together, or runs of different base
            models (without ``allow_different_models``).
        SchemaVersionError: a study.json of a schema version this version does not read.
    """
    study = load_study(path, option=option)
    if study["status"] != "completed":
        done = sum(run["status"] == "completed" for run in study["runs"])
        raise InputError(
            f"{option} {path} is not complete ({done} of {len(study['runs'])} runs)",
            source=option,
            fix="run the same `reprotune seeds` command again to finish it",
        )
    if study["vary"] == "each":
        raise InputError(
            f"{option} {path} is a --vary each study (one group per source of randomness), not one sample",
            source=option,
            fix="compare studies made with --vary all (or one seed consumer)",
        )
    if len(study["runs"]) < 2:
        raise InputError(
            f"{option} {path} has {len(study['runs'])} run(s); a spread needs at least 2",
            source=option,
            fix="run the study with --n 2 or more (5 or more for a useful test)",
        )
    if not study["metrics"]:
        raise _no_metric(study, option, path)
    problem = _inconsistency(study) or _summary_mismatch(study)
    if problem:
        raise InputError(
            f"{option} {path}: study.json does not hold together: {problem}",
            source=option,
            fix=REWRITE_FIX,
        )
    if (study.get("base_model") or {}).get("runs_agree") is False and not allow_different_models:
        raise InputError(
            f"{option} {path}: its runs did not all start from the same base model files "
            "(base_model.runs_agree is false: the model changed while the study was made), so its "
            "spread mixes models with seed noise",
            source=option,
            fix="make the study again in a new --out, every run from one model; or pass --allow to "
            "test it anyway",
        )
    return study


def _no_metric(study: Mapping[str, Any], option: str, path: str | Path) -> InputError:
    """The refusal of a study with no metric every run measured, saying why from its notes (no
    validation loss, a metric some runs only have, evaluations that differ)."""
    notes = list(study.get("metric_notes") or [])
    why = "; ".join(notes[:3]) + (f"; and {len(notes) - 3} more" if len(notes) > 3 else "")
    return InputError(
        f"{option} {path} has no metric that every run measured, so nothing to test "
        + (f"(its metric notes: {why})" if notes else "(its runs measured none)"),
        source=option,
        fix="have every run measured alike (a validation loss, or `reprotune eval` of each run with "
        "the same settings), then run the `reprotune seeds` command that made it again to refresh "
        "study.json",
    )


def _inconsistency(study: Mapping[str, Any]) -> str | None:
    """What makes a completed study.json (edited, or damaged) no sample to test, or None: runs
    neither one per planned seed nor completed, a listed metric without a finite value in every
    run or without its summary."""
    runs, groups = study["runs"], study.get("groups") or []
    names = [run.get("name") for run in runs]
    if len(set(names)) != len(names) or len(runs) != study.get("n", 0) * len(groups):
        planned = f"--n {study.get('n')} of {len(groups)} group(s)"
        return f"{len(runs)} runs, {len(set(names))} of them named apart, for {planned}"
    for run in runs:
        metrics = run.get("metrics")
        if run.get("status") != "completed":
            return f"run {run.get('name')!r} is {run.get('status')!r}, not completed"
        if not isinstance(metrics, Mapping):
            return f"run {run.get('name')!r} has no metrics mapping"
        for metric in study["metrics"]:
            value = metrics.get(metric)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                return f"run {run.get('name')!r} gives {metric} {value!r}, not a finite number"
    for group in groups:
        missing = [m for m in study["metrics"] if m not in ((study.get("summary") or {}).get(group) or {})]
        if missing:
            return f"its summary of {group!r} lacks {', '.join(missing)}"
    return None


def _summary_mismatch(study: Mapping[str, Any]) -> str | None:
    """Where a group's summary does not hold its runs' values (run order), or None. The test
    takes the runs' values and the report draws the summary's: a number edited in one of the two
    places would have the verdict and its picture tell two studies."""
    for group in study["groups"]:
        runs = [run for run in study["runs"] if run["group"] == group]
        for metric in study["metrics"]:
            values = study["summary"][group][metric].get("values")
            if not isinstance(values, list):
                return f"its summary of {group!r} has no list of the values of {metric}"
            if len(values) != len(runs):
                return f"its summary of {group!r} holds {len(values)} values of {metric} for {len(runs)} runs"
            for run, value in zip(runs, values, strict=True):
                if run["metrics"][metric] != value:
                    return (
                        f"run {run['name']!r} gives {metric} {run['metrics'][metric]!r}, its summary "
                        f"of {group!r} {value!r}"
                    )
    return None
