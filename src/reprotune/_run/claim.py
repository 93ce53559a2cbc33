"""Claiming a run directory for a new run, and telling a half-started one from a real one.

A run directory holds one run. A new run takes an empty (or missing) directory, or one that a
start killed before its first record landed left behind; anything else is refused with the
command that continues it.
"""

from __future__ import annotations

from pathlib import Path

from reprotune._config.schema import ExperimentConfig
from reprotune._errors import InputError
from reprotune._run.layout import RunLayout
from reprotune._run.record import load_record, make_run_id


def new_run_dir(cfg: ExperimentConfig, base: Path = Path("runs")) -> Path:
    """``runs/<run id>`` (``make_run_id``: UTC time and config hash), with a suffix if that exists."""
    run_id = make_run_id(cfg)
    candidate, suffix = base / run_id, 1
    while candidate.exists():
        suffix += 1
        candidate = base / f"{run_id}-{suffix}"
    return candidate


def claim_run_dir(run_dir: Path) -> None:
    """Create ``run_dir`` for a new run, refusing one that already holds a run."""
    paths = RunLayout(run_dir)
    if paths.is_run_dir():
        status = load_record(paths.record).get("status")
        if status == "completed":
            raise InputError(
                f"run directory {run_dir} already holds a completed run",
                source=str(paths.record),
                fix="choose a new directory with --run-dir, or leave it out for a fresh runs/<id>",
            )
        raise InputError(
            f"run directory {run_dir} holds an unfinished run (status {status!r})",
            source=str(paths.record),
            fix=f"continue it with `reprotune resume {run_dir}`, or choose a new directory with --run-dir",
        )
    for leftover in unlanded_first_record(run_dir):
        leftover.unlink()  # a start killed before its first record landed: nothing was trained
    if run_dir.exists() and any(run_dir.iterdir()):
        raise InputError(
            f"run directory {run_dir} exists and is not empty",
            fix="choose a new directory with --run-dir",
        )
    run_dir.mkdir(parents=True, exist_ok=True)


def unlanded_first_record(run_dir: Path) -> list[Path]:
    """The temporary files of a first ``record.json`` that never landed, when nothing else is there.

    The record is the first file a run writes, so a start killed while writing it leaves only
    these; the directory is then as good as empty.
    """
    record = RunLayout(run_dir).record
    if not run_dir.is_dir() or record.exists():
        return []
    entries = list(run_dir.iterdir())
    temporary = [p for p in entries if p.name.startswith(f".{record.name}.") and p.name.endswith(".tmp")]
    return temporary if temporary and len(temporary) == len(entries) else []
