"""Tests for reprotune._model.lora: seeded LoRA init, weights hash, adapter saving, config record."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from reprotune._errors import InputError
from reprotune._jsonio import canonical_dumps
from reprotune._model.lora import (
    WeightsHasher,
    apply_lora,
    lora_config_dict,
    save_adapter,
    target_module_names,
    tensors_sha256,
    trainable_tensors,
)
from reprotune.testing import build_tiny_model

LORA: dict[str, Any] = {
    "r": 4,
    "alpha": 8,
    "dropout": 0.0,
    "target_modules": ["q_proj", "v_proj"],
    "bias": "none",
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny model directory for the module."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def _base(tiny_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir)


def _lora(tiny_dir: Path, seed: int, **overrides: Any) -> Any:
    return apply_lora(_base(tiny_dir), seed=seed, **{**LORA, **overrides})


def test_same_seed_same_init_whatever_ran_before(tiny_dir: Path) -> None:
    """The same seed gives identical LoRA weights, whatever the global RNG was before."""
    torch.manual_seed(1)
    first = trainable_tensors(_lora(tiny_dir, seed=11))
    torch.manual_seed(2)
    torch.rand(100)
    second = trainable_tensors(_lora(tiny_dir, seed=11))
    assert list(first) == list(second)
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert any(name.endswith("lora_A.default.weight") for name in first)


def test_other_seed_other_init(tiny_dir: Path) -> None:
    """Another seed gives other A matrices (B starts at zero for every seed)."""
    first = trainable_tensors(_lora(tiny_dir, seed=11))
    second = trainable_tensors(_lora(tiny_dir, seed=12))
    for name in first:
        if "lora_A" in name:
            assert not torch.equal(first[name], second[name]), name
        else:
            assert torch.count_nonzero(first[name]) == 0 and torch.equal(first[name], second[name])


def test_global_rng_untouched(tiny_dir: Path) -> None:
    """apply_lora leaves the global torch, numpy and random states as it found them."""
    base = _base(tiny_dir)
    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    states = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    apply_lora(base, seed=3, **LORA)
    assert torch.equal(torch.get_rng_state(), states[0])
    assert np.array_equal(np.random.get_state()[1], states[1])
    assert random.getstate() == states[2]


def test_only_lora_weights_train(tiny_dir: Path) -> None:
    """With bias none, exactly the A and B matrices of the targeted layers require grad."""
    tensors = trainable_tensors(_lora(tiny_dir, seed=0))
    assert len(tensors) == 2 * 2 * 2  # 2 layers x (q_proj, v_proj) x (A, B)
    assert {tuple(t.shape) for name, t in tensors.items() if "lora_A" in name} == {(4, 64)}
    assert {tuple(t.shape) for name, t in tensors.items() if "v_proj.lora_B" in name} == {(32, 4)}


def test_unmatched_target_lists_module_names(tiny_dir: Path) -> None:
    """Target modules matching nothing are an InputError listing the model's layer names."""
    with pytest.raises(InputError, match="match no module") as info:
        _lora(tiny_dir, seed=0, target_modules=["q_proj", "qkv"])
    assert "['qkv']" in str(info.value)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"):
        assert name in (info.value.fix or ""), name
    assert info.value.source == "lora.target_modules"


def test_target_module_names_are_short_and_unique(tiny_dir: Path) -> None:
    """Layer names are deduplicated last components of the LoRA-able leaf modules."""
    assert target_module_names(_base(tiny_dir)) == [
        "down_proj", "embed_tokens", "gate_proj", "k_proj", "lm_head",
        "o_proj", "q_proj", "up_proj", "v_proj",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("override", "source"),
    [({"r": 0}, "lora.r"), ({"alpha": -1}, "lora.alpha"), ({"dropout": 1.0}, "lora.dropout"),
     ({"bias": "some"}, "lora.bias"), ({"target_modules": []}, "lora.target_modules"),
     ({"target_modules": "q_proj"}, "lora.target_modules")],
    ids=["rank", "alpha", "dropout", "bias", "no-targets", "string-targets"],
)  # fmt: skip
def test_bad_settings(tiny_dir: Path, override: dict[str, Any], source: str) -> None:
    """Each bad LoRA setting is an InputError naming its config key."""
    with pytest.raises(InputError) as info:
        _lora(tiny_dir, seed=0, **override)
    assert info.value.source == source


def _reference_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """The documented encoding, written out the slow, obvious way."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        shape = ",".join(map(str, t.shape))
        data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        digest.update(f"{name}\0{t.dtype}\0{shape}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def test_tensors_sha256_matches_documented_encoding() -> None:
    """The fast hash equals the documented encoding, for several dtypes, shapes and orders."""
    g = torch.Generator().manual_seed(0)
    tensors = {
        "b": torch.randn(3, 4, generator=g),
        "a": torch.randn(5, generator=g).to(torch.bfloat16),
        "c": torch.randn(4, 3, generator=g).t(),  # not contiguous
        "d": torch.tensor(2.5, dtype=torch.float64),
        "e": torch.zeros(0, 3),
    }
    assert tensors_sha256(tensors) == _reference_sha256(tensors)
    assert tensors_sha256(dict(reversed(list(tensors.items())))) == tensors_sha256(tensors)


def test_tensors_sha256_sees_every_difference() -> None:
    """One changed element, a renamed tensor, a reshaped or recast tensor all change the hash."""
    base = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    reference = tensors_sha256(base)
    changed = base["w"].clone()
    changed[1, 2] = torch.nextafter(changed[1, 2], torch.tensor(100.0))
    variants = [
        {"w": changed},
        {"v": base["w"]},
        {"w": base["w"].reshape(3, 2)},
        {"w": base["w"].to(torch.float64)},
    ]
    assert len({reference, *(tensors_sha256(v) for v in variants)}) == 1 + len(variants)


def test_weights_hasher_follows_in_place_updates(tiny_dir: Path) -> None:
    """Built once, the hasher gives tensors_sha256 of the weights as they are at each call."""
    model = _lora(tiny_dir, seed=3)
    weights = trainable_tensors(model)
    hasher = WeightsHasher(weights)
    before = hasher()
    assert before == tensors_sha256(weights)
    with torch.no_grad():
        next(p for p in model.parameters() if p.requires_grad).add_(1e-3)
    after = hasher()
    assert after != before
    assert after == tensors_sha256(trainable_tensors(model))


def test_weights_hasher_falls_back_for_tensors_numpy_lacks() -> None:
    """bf16 and non-contiguous tensors are hashed through tensors_sha256, with the same digest."""
    g = torch.Generator().manual_seed(1)
    tensors = {
        "a": torch.randn(4, 3, generator=g).to(torch.bfloat16),
        "b": torch.randn(3, 4, generator=g).t(),  # not contiguous
    }
    hasher = WeightsHasher(tensors)
    assert hasher() == _reference_sha256(tensors)
    tensors["a"].mul_(2)
    assert hasher() == _reference_sha256(tensors)


def test_save_adapter_is_byte_deterministic(tiny_dir: Path, tmp_path: Path) -> None:
    """Equal weights save to identical adapter bytes; the returned hashes are the files' hashes."""
    first = save_adapter(_lora(tiny_dir, seed=4), tmp_path / "one" / "adapter")
    second = save_adapter(_lora(tiny_dir, seed=4), tmp_path / "two" / "adapter")
    assert sorted(first) == ["adapter_config.json", "adapter_model.safetensors"]
    assert first == second
    for name, digest in first.items():
        assert hashlib.sha256((tmp_path / "one" / "adapter" / name).read_bytes()).hexdigest() == digest
    other = save_adapter(_lora(tiny_dir, seed=5), tmp_path / "three" / "adapter")
    assert other["adapter_model.safetensors"] != first["adapter_model.safetensors"]


def test_save_adapter_replaces_existing(tiny_dir: Path, tmp_path: Path) -> None:
    """Saving over an adapter folder replaces it whole, leaving no temporary folders."""
    target = tmp_path / "adapter"
    target.mkdir()
    (target / "stale.txt").write_text("old")
    hashes = save_adapter(_lora(tiny_dir, seed=4), target)
    assert sorted(p.name for p in target.iterdir()) == sorted(hashes)
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")  # PEFT 0.21 on transformers 5
def test_saved_adapter_reloads_same_weights(tiny_dir: Path, tmp_path: Path) -> None:
    """The saved adapter loads back onto the base model with the same trainable-weights hash."""
    from peft import PeftModel

    model = _lora(tiny_dir, seed=9)
    with torch.no_grad():  # make B non-zero so the check covers both matrices
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.125)
    save_adapter(model, tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(_base(tiny_dir), tmp_path / "adapter", is_trainable=True)
    assert tensors_sha256(trainable_tensors(reloaded)) == tensors_sha256(trainable_tensors(model))


def test_lora_config_dict_is_json_safe(tiny_dir: Path) -> None:
    """The recorded LoRA config serializes canonically and holds what PEFT received."""
    config = lora_config_dict(_lora(tiny_dir, seed=0))
    canonical_dumps(config)
    assert (config["r"], config["lora_alpha"], config["lora_dropout"], config["bias"]) == (4, 8, 0.0, "none")
    assert (config["target_modules"], config["peft_type"], config["task_type"]) == (
        ["q_proj", "v_proj"],
        "LORA",
        "CAUSAL_LM",
    )
