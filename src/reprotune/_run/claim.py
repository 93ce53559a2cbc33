"""Claiming a run directory for a new run, and telling a half-started one from a real one.

A run directory holds one run. A new run takes an empty (or missing) directory, one that a start
killed before its first record landed left behind, or one whose run failed before its first
step (bad input found late: nothing was trained, so the directory is cleared and reused);
anything else is refused with the command that continues it. :func:`check_run_dir_free` says so
before anything is built or written; :func:`claim_run_dir` decides again under the directory's
lock (``_run.lock``), and clears what may be cleared.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from reprotune._config.schema import ExperimentConfig, config_sha256
from reprotune._data.manifest import SIDECAR_SUFFIX
from reprotune._errors import InputError
from reprotune._run import layout
from reprotune._run.layout import RunLayout
from reprotune._run.lock import refuse_if_held
from reprotune._run.outputs import refuse_inside_run, refuse_unwritable_parent
from reprotune._run.ranks import current_world, resume_command
from reprotune._run.record import RunRecord, make_run_id, read_record

#: What a run writes at its top level: a directory holding only these (and a failed run that
#: never trained) may be cleared for a new run.
_RUN_FILES = (layout.RECORD, layout.CONFIG, layout.MANIFEST, layout.LEDGER, layout.PATCH)
_RUN_DIRS = (layout.ADAPTER_DIR, layout.CHECKPOINTS)


def new_run_dir(cfg: ExperimentConfig, base: Path = Path("runs")) -> Path:
    """``runs/<run id>`` (``make_run_id``: UTC time and config hash), with a suffix if that exists."""
    return unused_path(base, make_run_id(config_sha256(cfg)))


def unused_path(base: Path, name: str) -> Path:
    """``base/name``, or ``base/name-2``, ``-3``... : the first that does not exist."""
    candidate, suffix = base / name, 1
    while candidate.exists():
        suffix += 1
        candidate = base / f"{name}-{suffix}"
    return candidate


def check_run_dir_free(run_dir: Path) -> None:
    """Refuse, before anything is built or written, a ``run_dir`` a new run cannot take.

    Raises:
        InputError: ``run_dir`` (or a parent) is a file, holds a completed or unfinished run,
            or holds other files.
    """
    for parent in (run_dir, *run_dir.parents):
        if parent.exists() and not parent.is_dir():
            what = "is a file" if parent == run_dir else f"is under {parent}, which is a file"
            raise InputError(
                f"--run-dir {str(run_dir)!r} {what}, not a directory",
                source="--run-dir",
                fix="give a directory path (new, or empty)",
            )
        if parent.is_dir():
            break
    refuse_inside_run(run_dir, option="--run-dir")
    refuse_unwritable_parent(run_dir, source="--run-dir")
    _refusal(run_dir)


def claim_run_dir(run_dir: Path, *, report: Callable[[str], None] | None = None) -> None:
    """Make ``run_dir`` ready for a new run, refusing one that holds a run (call it under the lock).

    A directory whose run failed before its first step is cleared and reused (said on ``report``).
    """
    paths = RunLayout(run_dir)
    _refusal(run_dir)
    if paths.is_run_dir():  # _refusal let it through: a run that failed before its first step
        error = read_record(paths.record).error
        if report is not None:
            first = error.message.splitlines()[0] if error and error.message else "no error recorded"
            report(f"note: reusing {run_dir}: its run failed before its first step ({first})")
        _clear_run_files(paths)
    for leftover in unlanded_first_record(run_dir):
        leftover.unlink()  # a start killed before its first record landed: nothing was trained
    run_dir.mkdir(parents=True, exist_ok=True)


def _refusal(run_dir: Path) -> None:
    paths = RunLayout(run_dir)
    if paths.is_run_dir():
        record = read_record(paths.record)
        if record.status == "completed":
            raise InputError(
                f"run directory {run_dir} already holds a completed run",
                source=str(paths.record),
                fix="choose a new directory with --run-dir, or leave --run-dir out for a fresh one",
            )
        if failed_before_first_step(paths, record):
            return
        refuse_if_held(run_dir)  # being written now: say so, not "continue it with resume"
        distributed = record.distributed
        nodes = distributed.nodes if distributed is not None else 1
        resume = resume_command(str(run_dir), current_world(distributed), nodes)
        raise InputError(
            f"run directory {run_dir} holds an unfinished run (status {record.status!r})",
            source=str(paths.record),
            fix=f"continue it with {resume}, or choose a new directory with --run-dir",
        )
    if unlanded_first_record(run_dir):
        return
    others = _entries(run_dir)
    if others:
        shown = ", ".join(sorted(p.name for p in others)[:5])
        raise InputError(
            f"run directory {run_dir} exists and is not empty (it holds {shown})",
            source=str(run_dir),
            fix="choose a new directory with --run-dir",
        )


def failed_before_first_step(paths: RunLayout, record: RunRecord) -> bool:
    """Whether the run in ``paths`` failed before it trained anything (so nothing is lost by reuse).

    Its status is ``failed``, no attempt reached a step, there is no checkpoint, no train line
    in the ledger, and nothing but a run's own files in the directory.
    """
    if record.status != "failed" or record.timings.steps_done:
        return False
    if any(paths.checkpoints.glob("step-*")) or paths.adapter_weights.exists():
        return False
    if paths.ledger.is_file():
        with open(paths.ledger, "rb") as handle:
            if any(b'"kind":"train"' in line for line in handle):
                return False
    return all(p.name in (*_RUN_FILES, *_RUN_DIRS) or _is_sidecar(p.name) for p in _entries(paths.root))


def _is_sidecar(name: str) -> bool:
    return name.endswith(SIDECAR_SUFFIX)  # a manifest's row hashes (a copied one keeps its name)


def _clear_run_files(paths: RunLayout) -> None:
    """Remove what a run that failed before its first step left (its record last)."""
    for name in _RUN_DIRS:
        shutil.rmtree(paths.root / name, ignore_errors=True)
    for entry in _entries(paths.root):
        if entry.name != layout.RECORD and entry.is_file():
            entry.unlink()
    paths.record.unlink()


def _entries(run_dir: Path) -> list[Path]:
    """What ``run_dir`` holds besides its lock file (nothing when it does not exist)."""
    if not run_dir.is_dir():
        return []
    return [p for p in run_dir.iterdir() if p.name != layout.LOCK]


def unlanded_first_record(run_dir: Path) -> list[Path]:
    """The temporary files of a first ``record.json`` that never landed, when nothing else is there.

    The record is the first file a run writes (after its lock), so a start killed while writing
    it leaves only these; the directory is then as good as empty.
    """
    record = RunLayout(run_dir).record
    if not run_dir.is_dir() or record.exists():
        return []
    entries = _entries(run_dir)
    temporary = [p for p in entries if p.name.startswith(f".{record.name}.") and p.name.endswith(".tmp")]
    return temporary if temporary and len(temporary) == len(entries) else []
