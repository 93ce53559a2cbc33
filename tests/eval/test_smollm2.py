"""On the embedded SmolLM2-135M-Instruct: an eval of a one-step run gives the same predictions at
batch sizes 1 and 3, with real text from the real tokenizer and chat template."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reprotune._eval.evaluate import run_eval

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
OVERRIDES = (
    "train.max_steps=1",
    "train.warmup_steps=0",
    "train.eval_every=0",
    "train.save_every=0",
    "eval.max_rows=2",
    "determinism.threads=1",
    "tracking.mlflow=false",
    "eval.max_new_tokens=8",
)


@pytest.mark.slow
def test_smollm2_eval_is_batch_size_invariant(tmp_path: Path) -> None:
    """Three test rows of a one-step SmolLM2 run: batch sizes 1 and 3 write byte-identical
    predictions; the outputs are text the tokenizer decoded, from prompts in the chat template."""
    run_dir = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "reprotune",
        "run",
        str(QUICKSTART),
        "--run-dir",
        str(run_dir),
        "--no-progress",
    ]
    for item in OVERRIDES:
        args += ["--set", item]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    one = run_eval(run_dir, max_rows=3, batch_size=1, out=tmp_path / "bs1")
    three = run_eval(run_dir, max_rows=3, batch_size=3, out=tmp_path / "bs3")
    assert (one.eval_dir / "predictions.jsonl").read_bytes() == (
        three.eval_dir / "predictions.jsonl"
    ).read_bytes()
    lines = [json.loads(line) for line in (one.eval_dir / "predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and all(line["output_ids"] and line["text"].strip() for line in lines)
    assert one.record["generation"]["prompt"]["format"] == "chat_template"
    assert one.record["generation"]["eos_token_ids"] == [2]
    assert (
        one.record["model"]["weights_sha256"]
        == json.loads((run_dir / "record.json").read_text())["model"]["weights_sha256"]
    )
