"""Reading ``predictions.jsonl`` back: each line validated, a bad line refused naming its line and keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reprotune._errors import InputError
from reprotune._eval.evalfile import ids_sha256, predictions_bytes, read_predictions


def _line(index: int) -> dict[str, Any]:
    return {
        "index": index,
        "row_sha256": "a" * 64,
        "prompt_ids_sha256": ids_sha256([1, 2]),
        "prompt_tokens": 2,
        "output_ids": [5, 6, 7],
        "output_ids_sha256": ids_sha256([5, 6, 7]),
        "stopped_at_eos": True,
        "text": "hello",
        "scores": {"bleu": 12.5, "length": 3.0},
    }


def test_predictions_read_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "predictions.jsonl"
    path.write_bytes(predictions_bytes([_line(0), _line(1)]))
    read = read_predictions(path)
    assert [p.index for p in read] == [0, 1]
    assert read[1].output_ids == (5, 6, 7) and read[1].scores == {"bleu": 12.5, "length": 3.0}
    assert read[0].model_dump(mode="json") == _line(0)


def test_a_line_separator_in_a_generated_text_does_not_split_its_line(tmp_path: Path) -> None:
    """A model may generate U+2028, U+2029 or U+0085; they stand raw in the line and read back."""
    path = tmp_path / "predictions.jsonl"
    line = _line(0) | {"text": "one\u2028two\u2029three\u0085four"}
    path.write_bytes(predictions_bytes([line, _line(1)]))
    assert [p.text for p in read_predictions(path)] == [line["text"], "hello"]


def test_a_bad_line_is_refused_naming_its_line_and_every_key_at_fault(tmp_path: Path) -> None:
    path = tmp_path / "predictions.jsonl"
    broken = {k: v for k, v in _line(1).items() if k != "text"} | {"prompt_tokens": "two"}
    path.write_bytes(predictions_bytes([_line(0), broken]))
    with pytest.raises(InputError) as refused:
        read_predictions(path)
    message = str(refused.value)
    assert message.startswith(f"{path}:2: not a prediction: ")
    assert "prompt_tokens: input should be a valid integer" in message and "text: field required" in message
    assert "fix: restore the eval directory from a copy, or run the eval again" in message

    path.write_bytes(predictions_bytes([_line(0)]) + b'{"index": 1,\n')
    with pytest.raises(
        InputError, match=r"predictions\.jsonl:2: not a prediction: <top level>: invalid JSON"
    ):
        read_predictions(path)
