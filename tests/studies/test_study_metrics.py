"""A run's metrics: the final validation loss from its record, and its evaluations, read defensively."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reprotune._studies.metrics import run_metrics

RECORD: dict[str, Any] = {"outputs": {"final_val_loss": (5.4375).hex()}}


def _eval(run: Path, name: str, body: object) -> None:
    path = run / "evals" / name / "eval.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(body) if not isinstance(body, str) else body, encoding="utf-8")


def test_final_val_loss_exact_bits(tmp_path: Path) -> None:
    """The value is the record's float.hex, bit for bit."""
    metrics, notes = run_metrics(tmp_path, RECORD)
    assert metrics == {"final_val_loss": 5.4375} and notes == []


def test_eval_metrics_read_defensively(tmp_path: Path) -> None:
    """Numbers become <split>/<name> (nested with dots); unfinished, broken and numberless evals are
    left out with a note; a name two evals disagree on is kept apart by eval id."""
    first = {"bleu": 12.5, "chrf": {"score": 40}}
    _eval(tmp_path, "e1", {"split": "test", "status": "completed", "metrics": first})
    second = {"bleu": 13.0, "signature": "BLEU|nrefs:1", "em": True}
    _eval(tmp_path, "e2", {"split": "test", "metrics": second})
    _eval(tmp_path, "e3", {"split": "test", "status": "running", "metrics": {"bleu": 1.0}})
    _eval(tmp_path, "e4", "{not json")
    _eval(tmp_path, "e5", {"metrics": {"note": "text only"}})
    metrics, notes = run_metrics(tmp_path, RECORD)
    assert metrics == {
        "final_val_loss": 5.4375,
        "test/bleu": 12.5,
        "test/chrf.score": 40.0,
        "test/bleu@e2": 13.0,
    }
    assert [n.split(": ", 1)[1] for n in notes] == [
        "left out, status 'running'",
        "left out, unreadable (JSONDecodeError)",
        "left out, no numeric metrics",
    ]


def test_no_validation_loss(tmp_path: Path) -> None:
    """A run without a final validation loss: no such metric, and a note."""
    metrics, notes = run_metrics(tmp_path, {"outputs": {"final_val_loss": None}})
    assert metrics == {} and "no final validation loss" in notes[0]
