"""What a study's runs started from, as ``study.json`` keeps it: the base model and the data file
(their hashes, from the runs' records), whether every run agrees, and a note when they do not.
Never imports torch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reprotune._run.record import RunRecord


def base_model(records: Sequence[RunRecord]) -> tuple[dict[str, Any] | None, list[str]]:
    """The base model the runs started from (the first run's source and hashes), whether every run
    did (``runs_agree``: ``significance`` refuses a study whose runs did not, as it refuses two
    studies of different models), and a note when they did not."""
    seen = [
        {
            "source": r.model.source if r.model else None,
            "weights_sha256": r.model.weights_sha256 if r.model else None,
            "tokenizer_sha256": r.model.tokenizer_sha256 if r.model else None,
        }
        for r in records
    ]
    if not seen:
        return None, []
    # The files, not where they were found: a model given by another path is the same model.
    files = [(s["weights_sha256"], s["tokenizer_sha256"]) for s in seen]
    agree = all(f == files[0] for f in files[1:])
    notes = []
    if not agree:
        notes.append(
            f"the runs did not all start from the same base model files ({len(set(files))} weights and "
            "tokenizer sha256 pairs: the model changed while the study was made); the spread mixes "
            "models with seed noise: make the study again in a new --out; base_model is the first run's"
        )
    elif any(s != seen[0] for s in seen[1:]):
        notes.append("the runs found the base model at different sources; base_model is the first run's")
    return {**seen[0], "runs_agree": agree}, notes


def data_identity(records: Sequence[RunRecord]) -> tuple[dict[str, Any] | None, list[str]]:
    """The data file every run trained on (its sha256), whether the runs agree, and a note when
    they do not (the data file changed while the study was made: kept runs trained on the old)."""
    seen = [r.data.file_sha256 if r.data else None for r in records]
    if not seen:
        return None, []
    agree = all(s == seen[0] for s in seen[1:])
    notes = (
        []
        if agree
        else [
            f"the runs did not all train on the same data ({len(set(seen))} data.file_sha256 values: "
            "the data file changed while the study was made); the spread mixes data with seed noise: "
            "make the study again in a new --out; data is the first run's"
        ]
    )
    return {"file_sha256": seen[0], "runs_agree": agree}, notes
