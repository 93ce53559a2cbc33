"""The eval directory's layout: every file name it holds, spelled once, and how evals are named.

``RUN_DIR/evals/<eval-id>/`` (or ``--out DIR``)::

    eval.json           the eval record: what was evaluated, how, on which rows, and the metrics
    predictions.jsonl   one line per row: token ids, their sha256, the text, the row's scores

An eval directory is complete or absent: it is built under a temporary name beside its final
place and renamed into place when every file is written (:func:`publish_eval_dir`).
"""

from __future__ import annotations

import errno
import itertools
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from reprotune._errors import InputError
from reprotune._jsonio import publishing_dir, write_bytes_atomic, write_json_atomic
from reprotune._run.outputs import refuse_unwritable_parent

EVALS_DIR: Final = "evals"
EVAL_FILE: Final = "eval.json"
PREDICTIONS: Final = "predictions.jsonl"


@dataclass(frozen=True)
class EvalLayout:
    """The paths of one eval directory.

    Example:
        >>> EvalLayout(Path("runs/A/evals/x")).predictions
        PosixPath('runs/A/evals/x/predictions.jsonl')
    """

    root: Path

    @property
    def eval_file(self) -> Path:
        return self.root / EVAL_FILE

    @property
    def predictions(self) -> Path:
        return self.root / PREDICTIONS

    def is_eval_dir(self) -> bool:
        """Whether the directory holds an eval record."""
        return self.eval_file.is_file()


def evals_dir(run_dir: Path) -> Path:
    """``RUN_DIR/evals``: where a run's evals go by default."""
    return run_dir / EVALS_DIR


def refuse_unwritable_evals_dir(run_dir: Path) -> None:
    """Without ``--out`` the eval goes in ``RUN_DIR/evals/<eval-id>``: refuse, before the model
    loads, a ``RUN_DIR/evals`` that is a file or a directory (or run directory) not writable here."""
    evals = evals_dir(run_dir)
    try:
        refuse_unwritable_parent(evals / "<eval-id>", source="the default eval directory")
    except InputError as exc:
        raise InputError(
            f"{exc.message} (no --out was given: an eval of a run goes in RUN_DIR/{EVALS_DIR}/)",
            source=f"{evals} (the default of --out)",
            fix=f"make {evals} a directory you can write (move a file of that name away), or give "
            "--out DIR to write the eval elsewhere",
        ) from None


def new_eval_id(split: str, identity_sha256: str, now: datetime | None = None) -> str:
    """``YYYYmmdd-HHMMSS-<split>-<first 8 hex of the eval's identity>`` (UTC)."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{split}-{identity_sha256[:8]}"


def run_evals(run_dir: Path) -> list[Path]:
    """The complete eval directories of a run, oldest first (by name, which starts with the time)."""
    root = evals_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted(
        p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and EvalLayout(p).is_eval_dir()
    )


def publish_eval_dir(final: Path, predictions: bytes, record: dict[str, Any], *, unique: bool) -> Path:
    """Build the eval directory beside ``final`` and rename it into place (complete or absent);
    return where it went.

    ``unique`` (a default name, no ``--out``): a name already taken, found before building or when
    the rename finds it taken, gets the next free suffix (``-2``, ``-3``, ...), and ``record``'s
    ``eval_id`` with it; two evals of one identity in one second both land. Else a taken ``final``
    is refused: an eval never overwrites.
    """
    base = final
    for attempt in itertools.count(1):
        if unique:
            final = base if attempt == 1 else base.with_name(f"{base.name}-{attempt}")
            if final.exists() or final.is_symlink():
                continue
            record["eval_id"] = final.name
        try:
            with publishing_dir(final, replace=False) as building:
                paths = EvalLayout(building)
                write_bytes_atomic(paths.predictions, predictions)
                write_json_atomic(paths.eval_file, record)
            return final
        except OSError as exc:
            taken = exc.errno in (errno.EEXIST, errno.ENOTEMPTY) and (final.exists() or final.is_symlink())
            if taken and unique:
                continue  # another eval took the name between the check and the rename
            if not taken:
                raise InputError(
                    f"cannot create the eval directory {final}: {exc.strerror or exc}",
                    source=str(final),
                    fix="choose a directory you can write to (--out)",
                ) from None
            raise InputError(
                f"cannot put the eval directory in place at {final}: {exc.strerror or exc}",
                source=str(final),
                fix="choose a new directory (--out): an eval never overwrites",
            ) from None
    raise AssertionError("unreachable: itertools.count never ends")
