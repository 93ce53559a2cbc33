"""On the embedded SmolLM2-135M-Instruct: an eval of the session's SmolLM2 run gives the same
predictions at batch sizes 1 and 3, with real text from the real tokenizer and chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reprotune._eval.evaluate import run_eval


@pytest.mark.slow
def test_smollm2_eval_is_batch_size_invariant(smollm2_run: Path, tmp_path: Path) -> None:
    """Three test rows of a three-step SmolLM2 run (the session's, tests/conftest.py): batch sizes 1
    and 3 write byte-identical predictions; the outputs are text the tokenizer decoded, from prompts
    in the chat template."""
    run_dir = smollm2_run
    one = run_eval(run_dir, max_rows=3, batch_size=1, out=tmp_path / "bs1")
    three = run_eval(run_dir, max_rows=3, batch_size=3, out=tmp_path / "bs3")
    assert (one.eval_dir / "predictions.jsonl").read_bytes() == (
        three.eval_dir / "predictions.jsonl"
    ).read_bytes()
    lines = [json.loads(line) for line in (one.eval_dir / "predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and all(line["output_ids"] and line["text"].strip() for line in lines)
    assert one.record["generation"]["batch_invariant"] and one.record["generation"]["invariance"]["shown"]
    assert one.record["generation"]["prompt"]["format"] == "chat_template"
    assert one.record["generation"]["eos_token_ids"] == [2]
    assert (
        one.record["model"]["weights_sha256"]
        == json.loads((run_dir / "record.json").read_text())["model"]["weights_sha256"]
    )
