"""Tests for reprotune.testing: the tiny Llama, its byte-level tokenizer and the tiny dataset."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reprotune._errors import InputError
from reprotune.testing import TINY_CHAT_TEMPLATE, build_tiny_model, tiny_rows, write_tiny_dataset


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny model (seed 0) for the tests that only read it."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def test_same_seed_same_bytes_in_process(tiny_dir: Path, tmp_path: Path) -> None:
    """Two builds with one seed write byte-identical weights and tokenizer files."""
    again = build_tiny_model(tmp_path / "again", seed=0)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (again / name).read_bytes() == (tiny_dir / name).read_bytes(), name


def test_same_seed_same_bytes_across_processes(tiny_dir: Path, tmp_path: Path) -> None:
    """A build in a fresh Python process writes the same model.safetensors bytes."""
    code = (
        "import sys, torch; torch.set_num_threads(1); torch.manual_seed(12345);"
        "from pathlib import Path; from reprotune.testing import build_tiny_model;"
        "build_tiny_model(Path(sys.argv[1]), seed=0)"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "other")], check=True, capture_output=True)
    assert _sha(tmp_path / "other" / "model.safetensors") == _sha(tiny_dir / "model.safetensors")


def test_other_seed_other_weights(tiny_dir: Path, tmp_path: Path) -> None:
    """A different seed gives different weights."""
    other = build_tiny_model(tmp_path / "seed1", seed=1)
    assert _sha(other / "model.safetensors") != _sha(tiny_dir / "model.safetensors")


def test_build_leaves_global_rng_alone(tmp_path: Path) -> None:
    """Building the model neither reads nor advances the caller's global torch RNG."""
    torch.manual_seed(7)
    state = torch.get_rng_state()
    build_tiny_model(tmp_path / "m", seed=3)
    assert torch.equal(torch.get_rng_state(), state)


def test_architecture_and_special_tokens(tiny_dir: Path) -> None:
    """The saved config is the documented tiny Llama and the special ids follow the 256 bytes."""
    config = json.loads((tiny_dir / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"]) == (2, 64, 4)
    assert (config["num_key_value_heads"], config["intermediate_size"], config["vocab_size"]) == (2, 128, 259)
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (256, 257, 258)


def test_tokenizer_is_byte_level(tiny_dir: Path) -> None:
    """Text encodes to its UTF-8 bytes as ids, special tokens to 256-258, and decodes back exactly."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    text = "héllo wörld\n\t~"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text
    assert tokenizer("<s>a</s><pad>", add_special_tokens=False)["input_ids"] == [256, 97, 257, 258]
    assert tokenizer.chat_template == TINY_CHAT_TEMPLATE


def test_chat_template_can_be_left_out(tmp_path: Path) -> None:
    """chat_template=False saves a tokenizer without a chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "plain", chat_template=False))
    assert not tokenizer.chat_template


def test_dataset_is_deterministic_and_covers_categories(tmp_path: Path) -> None:
    """The same arguments write the same bytes; every category occurs; rows are short strings."""
    first = write_tiny_dataset(tmp_path / "a.jsonl", 40, seed=5, n_categories=4)
    second = write_tiny_dataset(tmp_path / "b.jsonl", 40, seed=5, n_categories=4)
    assert first.read_bytes() == second.read_bytes()
    rows = [json.loads(line) for line in first.read_text().splitlines()]
    assert len(rows) == 40
    assert {row["category"] for row in rows} == {"cat0", "cat1", "cat2", "cat3"}
    assert all(isinstance(row["prompt"], str) and isinstance(row["response"], str) for row in rows)
    assert max(len(row["prompt"]) for row in rows) < 60
    assert tiny_rows(40, seed=6, n_categories=4) != rows


@pytest.mark.parametrize(("n_rows", "n_categories"), [(-1, 2), (5, 0), (5, 9)], ids=["rows", "zero", "many"])
def test_dataset_rejects_bad_counts(n_rows: int, n_categories: int) -> None:
    """Counts out of range are InputErrors."""
    with pytest.raises(InputError):
        tiny_rows(n_rows, n_categories=n_categories)


def test_importing_the_testing_module_loads_no_torch() -> None:
    """``reprotune.testing`` is for a user's own tests too: importing it (for ``tiny_rows``, say)
    costs no torch; only building a model loads it."""
    code = "import sys, reprotune.testing; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
