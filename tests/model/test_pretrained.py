"""Tests for reprotune._model.pretrained: a checkpoint that does not give the model every weight is
refused, since transformers would fill the gap from torch's unseeded global generator."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from reprotune._cli import main
from reprotune._errors import InputError
from reprotune._model.loading import LoadedModel, load_base_model
from reprotune._model.pretrained import refuse_incomplete
from reprotune.testing import build_tiny_model
from tinyrun import TinyProject

Tensors = dict[str, torch.Tensor]


def _load(name: str) -> LoadedModel:
    return load_base_model(
        name, revision=None, dtype="float32", pad_token_id=None, padding_side="right", device="cpu"
    )


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One complete tiny model (untied: it has its own ``lm_head.weight``) for the module."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def _edited(
    model: Path,
    weights: Callable[[Tensors], object] | None = None,
    config: Callable[[dict[str, Any]], object] | None = None,
) -> Path:
    """``model`` with its ``model.safetensors`` and ``config.json`` changed in place by the editors."""
    if config is not None:
        values = json.loads((model / "config.json").read_text(encoding="utf-8"))
        config(values)
        (model / "config.json").write_text(json.dumps(values), encoding="utf-8")
    if weights is not None:
        tensors = load_file(str(model / "model.safetensors"))
        weights(tensors)
        save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    return model


def _tied(values: dict[str, Any]) -> None:
    values["tie_word_embeddings"] = True


def _drop_layer_one(tensors: Tensors) -> None:
    for key in [key for key in tensors if key.startswith("model.layers.1.")]:
        del tensors[key]


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda t: t.pop("model.norm.weight"), "lacks 1 weight the model has: model.norm.weight."),
        (lambda t: t.pop("lm_head.weight"), "lacks 1 weight the model has: lm_head.weight."),
        (
            _drop_layer_one,
            "lacks 9 weights the model has: model.layers.1.input_layernorm.weight, "
            "model.layers.1.mlp.down_proj.weight, model.layers.1.mlp.gate_proj.weight, "
            "model.layers.1.mlp.up_proj.weight, model.layers.1.post_attention_layernorm.weight and 4 more.",
        ),
        (
            lambda t: t.update({"model.norm.weight": torch.ones(32)}),
            "holds 1 weight in another shape than config.json gives: model.norm.weight",
        ),
    ],
    ids=["norm", "untied-lm-head", "a-layer", "shape"],
)
def test_a_checkpoint_without_every_weight_is_refused(
    tiny_dir: Path, tmp_path: Path, edit: Callable[[Tensors], object], said: str
) -> None:
    """A checkpoint lacking a weight (the final norm, the lm_head of an untied model, a whole layer)
    or holding one in another shape loaded without a word, the gap filled from torch's unseeded
    global generator: two runs of one config trained two models. Refused, naming the folder, the
    keys (the first five and how many) and the fix."""
    model = _edited(Path(shutil.copytree(tiny_dir, tmp_path / "model")), edit)
    with pytest.raises(InputError) as info:
        _load(str(model))
    assert info.value.source == "model.name"
    assert f"the checkpoint in {model} {said}" in info.value.message
    assert "random values from torch's generator, not seeded at load, so no two runs would agree" in (
        info.value.message
    )
    assert "save_pretrained" in (info.value.fix or "")


def test_a_missing_weight_is_refused_by_run_before_its_run_directory_is_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``reprotune run`` on a tiny model whose checkpoint lacks ``model.norm.weight`` exits 2 naming
    the key and the fix, and leaves no run directory behind."""
    project = TinyProject.create(tmp_path / "project", n_rows=24)
    _edited(project.root / "tiny-model", lambda t: t.pop("model.norm.weight"))
    run_dir = tmp_path / "run"
    with torch.random.fork_rng():  # a run seeds torch's global generator
        code = main(["run", str(project.config()), "--run-dir", str(run_dir), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert (
        "lacks 1 weight the model has: model.norm.weight" in err and "fix: use the complete checkpoint" in err
    )
    assert "Traceback" not in err
    assert not run_dir.exists()


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gpt2"])
def test_a_complete_checkpoint_loads_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, architecture: Any
) -> None:
    """The tiny model of each architecture loads (its rotary ``inv_freq``, a non-persistent buffer,
    is in no file and is not a missing weight), and nothing is said about its checkpoint."""
    model = build_tiny_model(tmp_path / architecture, seed=0, architecture=architecture)
    with caplog.at_level(logging.WARNING, logger="reprotune._model.pretrained"):
        loaded = _load(str(model))
    assert loaded.model.config.tie_word_embeddings is False
    assert [r for r in caplog.records if r.name == "reprotune._model.pretrained"] == []


def test_a_tied_model_without_lm_head_in_its_file_loads(tiny_dir: Path, tmp_path: Path) -> None:
    """``tie_word_embeddings: true`` and no ``lm_head.weight`` in the file (as save_pretrained
    writes a tied model, SmolLM2's included) is complete: the head is the embedding table."""
    model = _edited(
        Path(shutil.copytree(tiny_dir, tmp_path / "model")), lambda t: t.pop("lm_head.weight"), _tied
    )
    loaded = _load(str(model)).model
    assert loaded.lm_head.weight is loaded.get_input_embeddings().weight
    embeddings = load_file(str(model / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(loaded.lm_head.weight.detach(), embeddings)


def test_tensors_the_model_does_not_use_are_warned_of_and_change_nothing(
    tiny_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint with an extra tensor loads (the model does not read it) and the warning names
    it; an old Llama's per-layer rotary ``inv_freq`` is dropped by transformers without a word.
    The model computes what the complete one does."""
    extra = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8), "score.weight": torch.ones(2, 64)}
    model = _edited(Path(shutil.copytree(tiny_dir, tmp_path / "model")), lambda t: t.update(extra))
    with caplog.at_level(logging.WARNING, logger="reprotune._model.pretrained"):
        loaded = _load(str(model)).model
    said = [r.getMessage() for r in caplog.records if r.name == "reprotune._model.pretrained"]
    assert said == [f"{model}: the checkpoint holds 1 tensor the model does not use (ignored): score.weight"]
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, _load(str(tiny_dir)).model(ids).logits)


def test_a_missing_buffer_is_warned_of_and_more_than_five_keys_are_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A missing key that is a buffer of the model keeps what the model computed (warned, not
    refused); transformers 4's mismatched keys (names without shapes) are named too."""
    with caplog.at_level(logging.WARNING, logger="reprotune._model.pretrained"):
        refuse_incomplete(Path("/m"), {"missing_keys": ["b"]}, buffers={"b"})
    assert [r.getMessage() for r in caplog.records] == [
        "/m: the checkpoint lacks 1 buffer; the model computes them from its config (the record "
        "hashes them under model.buffers): b"
    ]
    with pytest.raises(InputError, match=r"2 weights in another shape than config\.json gives: a, b\."):
        refuse_incomplete(Path("/m"), {"mismatched_keys": ["b", "a"]})
    with pytest.raises(InputError, match=r"lacks 7 weights the model has: k0, k1, k2, k3, k4 and 2 more\."):
        refuse_incomplete(Path("/m"), {"missing_keys": {f"k{i}" for i in range(7)}, "mismatched_keys": set()})
