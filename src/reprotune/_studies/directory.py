"""The study directory one ``reprotune seeds`` works in: opened new or continued, and put back.

- :func:`open_study`: the ``study.json`` content to start from, a new study or the one begun
  there before (same config and ``--vary``, no smaller ``--n``), refusing a directory that holds
  something else;
- :class:`Before`, :class:`Rewritten` and :func:`put_back`: a call refused before any run began
  leaves the directory as it found it, byte for byte: removed when the call made it, else with
  the files it rewrote (study.json, config.yaml, mlflow.json, the logs it appended to) as they
  were and without the files it added (an empty ``--out`` given by the user stays, empty).

Never imports torch.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprotune._config.schema import config_sha256
from reprotune._determinism.seeds import derive_seed
from reprotune._errors import InputError, SchemaVersionError
from reprotune._jsonio import write_bytes_atomic
from reprotune._run.layout import LOCK
from reprotune._run.outputs import first_missing
from reprotune._studies import layout
from reprotune._studies.layout import StudyLayout
from reprotune._studies.plan import SEED_RULE, PlannedRun, StudyPlan
from reprotune._studies.stats import BOOTSTRAP_METHOD, BOOTSTRAP_RESAMPLES, CONFIDENCE
from reprotune._studies.studyfile import load_study, write_study


@dataclass(frozen=True)
class Before:
    """What was at a study directory's path before this call: the outermost directory the call
    will make (None: the directory exists), else the entries the directory held."""

    created: Path | None
    entries: frozenset[Path]

    @classmethod
    def look(cls, root: Path) -> Before:
        created = first_missing(root)
        entries = frozenset(root.iterdir()) if created is None and root.is_dir() else frozenset()
        return cls(created, entries)


@dataclass(frozen=True)
class Rewritten:
    """What the files a call rewrites before its runs held when it took the directory's lock: the
    bytes of study.json, config.yaml and mlflow.json (None: absent) and the size of each file in
    ``logs/`` (a run in its own process appends to ``logs/<name>.log``)."""

    files: dict[Path, bytes | None]
    logs: Path
    sizes: dict[Path, int]

    @classmethod
    def read(cls, paths: StudyLayout) -> Rewritten:
        files = {
            p: p.read_bytes() if p.is_file() else None for p in (paths.study, paths.config, paths.mlflow)
        }
        logs = paths.root / layout.LOGS
        return cls(files, logs, _sizes(logs))

    def restore(self) -> None:
        """Each file as :meth:`read` found it, where it differs: rewritten, removed, or a log cut
        back to its old size (appended to, so its first bytes are as they were)."""
        for path, data in self.files.items():
            if (path.read_bytes() if path.is_file() else None) == data:
                continue
            if data is None:
                path.unlink(missing_ok=True)
            else:
                write_bytes_atomic(path, data)
        for log, size in _sizes(self.logs).items():
            if log not in self.sizes:
                log.unlink(missing_ok=True)
            elif size > self.sizes[log]:
                os.truncate(log, self.sizes[log])


def _sizes(folder: Path) -> dict[Path, int]:
    """The size of each file in ``folder`` (none where it is no directory)."""
    return {p: p.stat().st_size for p in folder.iterdir() if p.is_file()} if folder.is_dir() else {}


def put_back(root: Path, before: Before) -> None:
    """Leave ``root`` as :meth:`Before.look` found it: the directory this call made removed (with
    the parents it made), or, in one that was there, each entry the call added."""
    if before.created is not None:
        shutil.rmtree(before.created, ignore_errors=True)
        return
    for added in set(root.iterdir()) - before.entries if root.is_dir() else ():
        if added.is_dir() and not added.is_symlink():
            shutil.rmtree(added, ignore_errors=True)
        else:
            added.unlink(missing_ok=True)


def runs_made(paths: StudyLayout) -> bool:
    """Whether a run of the study has begun (its directory exists)."""
    runs = paths.root / layout.RUNS
    return runs.is_dir() and any(runs.iterdir())


def _never_began(study: dict[str, Any], paths: StudyLayout) -> bool:
    """A study every run of which is still planned, none with a directory (one refused at its
    first run, by a reprotune before such a refusal removed it)."""
    return all(run.get("status") == "planned" for run in study["runs"]) and not runs_made(paths)


def open_study(paths: StudyLayout, plan: StudyPlan) -> dict[str, Any]:
    """The study's ``study.json`` content to start from: new, or the one begun before (checked).

    A ``study.json`` that loads is not trusted for its numbers: what the study starts from is the
    plan, and every run's entry is written anew from its run directory (the source of truth).

    Raises:
        InputError: a damaged ``study.json``; a study of another config or ``--vary`` one of whose
            runs began; a smaller ``--n``; a directory that is neither empty nor this study's.
        SchemaVersionError: a ``study.json`` of a schema version this version does not read.
    """
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
        "runs": [planned_entry(r) for r in plan.runs],
        "metrics": [],
        "summary": {},
        "variance": None,
        "metric_notes": [],
    }


def planned_entry(planned: PlannedRun) -> dict[str, Any]:
    """A run's entry in ``study.json`` as the plan gives it (``planned``)."""
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
