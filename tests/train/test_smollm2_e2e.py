"""End to end on the embedded SmolLM2-135M-Instruct: the quickstart config, cut to three steps
(the session's one SmolLM2 run, tests/conftest.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from reprotune._data.manifest import load_manifest
from reprotune._data.order import DataOrder
from reprotune._jsonio import sha256_file
from reprotune._run.ledger import batch_sha256


@pytest.fixture()
def quickstart_run(smollm2_run: Path) -> Path:
    """The quickstart, three steps, run by the CLI in its own process (conftest.smollm2_run)."""
    return smollm2_run


def _record(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "record.json").read_text(encoding="utf-8"))


def _ledger(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.mark.slow
def test_quickstart_completes_with_finite_loss(quickstart_run: Path) -> None:
    """Three steps on SmolLM2 complete, every loss is finite, MLflow got the run."""
    record = _record(quickstart_run)
    assert record["status"] == "completed"
    assert record["model"]["kind"] == "builtin"
    assert record["model"]["chat_template"] is True
    train = [e for e in _ledger(quickstart_run) if e["kind"] == "train"]
    val = [e for e in _ledger(quickstart_run) if e["kind"] == "val"]
    assert [e["step"] for e in train] == [1, 2, 3]
    assert [e["step"] for e in val] == [3]
    assert val[0]["n_rows"] == 8
    for entry in train + val:
        assert math.isfinite(float.fromhex(entry["loss"]))
    assert record["trackers"]["mlflow"]["ok"] is True
    assert record["trackers"]["mlflow"]["metrics_logged"] == 3 * 3 + 1


@pytest.mark.slow
def test_quickstart_adapter_holds_only_lora_tensors(quickstart_run: Path) -> None:
    """The adapter file is the recorded one and holds LoRA A/B matrices of q_proj and v_proj only."""
    from safetensors import safe_open

    path = quickstart_run / "adapter" / "adapter_model.safetensors"
    assert sha256_file(path) == _record(quickstart_run)["outputs"]["adapter_sha256"]
    with safe_open(str(path), framework="pt") as handle:
        names = list(handle.keys())
    assert names
    assert all(".lora_A." in n or ".lora_B." in n for n in names), names
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in names} == {"q_proj", "v_proj"}
    n_layers = len({n.split(".layers.")[1].split(".")[0] for n in names})
    assert len(names) == n_layers * 2 * 2  # A and B, for q_proj and v_proj, in every layer


@pytest.mark.slow
def test_quickstart_masks_the_prompt(quickstart_run: Path) -> None:
    """Step 1's labelled tokens are its rows' response tokens, far fewer than all tokens."""
    from reprotune._compat import load_tokenizer
    from reprotune._data.loaders import load_table

    record = _record(quickstart_run)
    manifest = load_manifest(quickstart_run / "split.json")
    order = DataOrder(record["seeds"]["data_order"], [int(i) for i in manifest.indices["train"]], 4)
    rows = order.step_rows(1)
    (step1,) = [e for e in _ledger(quickstart_run) if e["kind"] == "train" and e["step"] == 1]
    assert step1["batch_sha256"] == batch_sha256(rows)

    table = load_table(record["config"]["data"]["path"], "auto")
    tokenizer = load_tokenizer(Path(record["model"]["resolved_path"]))
    total = response = 0
    for row in rows:
        prompt, answer = table.row(row)["prompt"], table.row(row)["response"]
        chat = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
        full = tokenizer.apply_chat_template(chat, tokenize=False)
        total += min(len(tokenizer(full, add_special_tokens=False)["input_ids"]), 128)
        response += len(tokenizer(answer, add_special_tokens=False)["input_ids"])
    # The loss covers each response and the template's end of turn (<|im_end|>, newline).
    assert response <= step1["n_tokens"] <= response + 2 * len(rows)
    assert step1["n_tokens"] < total / 2  # SmolLM2's template puts a long system turn first
