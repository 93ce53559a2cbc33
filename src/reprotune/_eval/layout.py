"""The eval directory's layout: every file name it holds, spelled once, and how evals are named.

``RUN_DIR/evals/<eval-id>/`` (or ``--out DIR``)::

    eval.json           the eval record: what was evaluated, how, on which rows, and the metrics
    predictions.jsonl   one line per row: token ids, their sha256, the text, the row's scores

An eval directory is complete or absent: it is built under a temporary name beside its final
place and renamed into place when every file is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

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
