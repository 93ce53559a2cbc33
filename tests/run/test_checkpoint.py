"""Tests for reprotune._run.checkpoint: exact save/restore, keep-last-K, verification, fallback, no pickles.

Everything runs in-process on the tiny Llama (2 layers, width 64) with LoRA dropout on, so a step
after a restore draws from the torch RNG and shows whether its state came back.
"""

from __future__ import annotations

import json
import os
import pickle
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from reprotune._errors import InputError
from reprotune._jsonio import canonical_dumps, sha256_bytes, sha256_file
from reprotune._model.lora import apply_lora, tensors_sha256, trainable_tensors
from reprotune._run.checkpoint import (
    STATE_FILE,
    CheckpointState,
    list_checkpoints,
    restore_checkpoint,
    save_checkpoint,
    valid_checkpoints,
    verify_checkpoint,
)
from reprotune._run.ledger import hexf
from reprotune._train.optim import build_optimizer, build_scheduler
from reprotune.testing import build_tiny_model

CHECKPOINT_FILES = ("trainable.safetensors", "optimizer.pt", "rng.safetensors", "rng.json", STATE_FILE)
STATE = CheckpointState(step=2, epoch=0, position=(0, 8))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny model directory for the module."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    """One thread: the machine is shared, and equal thread counts keep reductions equal."""
    torch.set_num_threads(1)


@dataclass
class Trainer:
    """A LoRA model with its optimizer and schedule, as the training loop holds them."""

    model: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any


def _trainer(tiny_dir: Path, *, lora_seed: int) -> Trainer:
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_dir)
    model = apply_lora(
        base, seed=lora_seed, r=4, alpha=8, dropout=0.1, target_modules=["q_proj", "v_proj"], bias="none"
    )
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, name="adamw", learning_rate=1e-2, weight_decay=0.01)
    scheduler = build_scheduler(optimizer, schedule="linear", warmup_steps=2, total_steps=10)
    return Trainer(model, optimizer, scheduler)


def _step(trainer: Trainer) -> str:
    """One optimizer step on a fixed batch (dropout draws from the global torch RNG); the loss bits."""
    ids = (torch.arange(24).reshape(2, 12) * 7) % 250
    loss = trainer.model(input_ids=ids, labels=ids).loss
    loss.backward()
    trainer.optimizer.step()
    trainer.scheduler.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return hexf(float(loss.detach()))


def _weights_sha(trainer: Trainer) -> str:
    return tensors_sha256(trainable_tensors(trainer.model))


def _save(trainer: Trainer, directory: Path, state: CheckpointState = STATE, keep: int = 3) -> Path:
    return save_checkpoint(
        directory,
        state,
        model=trainer.model,
        optimizer=trainer.optimizer,
        scheduler=trainer.scheduler,
        scaler=None,
        keep=keep,
    )


def _restore(trainer: Trainer, path: Path, *, restore_rng: bool = True) -> CheckpointState:
    return restore_checkpoint(
        path,
        model=trainer.model,
        optimizer=trainer.optimizer,
        scheduler=trainer.scheduler,
        scaler=None,
        restore_rng=restore_rng,
    )


def _trained(tiny_dir: Path, steps: int = 2) -> Trainer:
    """A trainer after ``steps`` steps from fixed seeds."""
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    trainer = _trainer(tiny_dir, lora_seed=1)
    for _ in range(steps):
        _step(trainer)
    return trainer


def _scramble_rng() -> None:
    """Move every global generator somewhere else, as a fresh process would be."""
    torch.manual_seed(999)
    random.seed(999)
    np.random.seed(999)


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.random()), torch.rand(4).tolist()


def _flip_byte(path: Path, offset: int | None = None, mask: int = 0xFF) -> None:
    data = bytearray(path.read_bytes())
    where = len(data) // 2 if offset is None else offset
    data[where] ^= mask
    path.write_bytes(bytes(data))


def _resign(checkpoint: Path) -> None:
    """Rewrite state.json so that its hashes match the files as they are now (a forger's move)."""
    state = json.loads((checkpoint / STATE_FILE).read_text(encoding="utf-8"))
    state["files"] = {name: sha256_file(checkpoint / name) for name in state["files"]}
    if "state_sha256" in state:  # a self-hash over the rest of state.json, where the format has one
        state.pop("state_sha256")
        state["state_sha256"] = sha256_bytes(canonical_dumps(state).encode("utf-8"))
    (checkpoint / STATE_FILE).write_text(canonical_dumps(state), encoding="utf-8")


# --- exact round trip -----------------------------------------------------------------------------


def test_round_trip_restores_weights_optimizer_scheduler(tiny_dir: Path, tmp_path: Path) -> None:
    """A fresh model, optimizer and schedule restored from a checkpoint equal the saved ones exactly."""
    saved = _trained(tiny_dir)
    path = _save(saved, tmp_path / "checkpoints")
    fresh = _trainer(tiny_dir, lora_seed=2)
    assert _weights_sha(fresh) != _weights_sha(saved)  # else the weights check below proves nothing

    assert _restore(fresh, path) == STATE
    assert _weights_sha(fresh) == _weights_sha(saved)
    want, got = saved.optimizer.state_dict(), fresh.optimizer.state_dict()
    assert got["param_groups"] == want["param_groups"]
    assert sorted(got["state"]) == sorted(want["state"]) and len(want["state"]) == 8
    for index, slots in want["state"].items():
        assert sorted(got["state"][index]) == sorted(slots) == ["exp_avg", "exp_avg_sq", "step"]
        assert all(torch.equal(got["state"][index][k], slots[k]) for k in slots)
    assert fresh.scheduler.state_dict() == saved.scheduler.state_dict()
    assert fresh.scheduler.last_epoch == 2
    assert fresh.optimizer.param_groups[0]["lr"] == saved.optimizer.param_groups[0]["lr"]


def test_round_trip_restores_every_rng(tiny_dir: Path, tmp_path: Path) -> None:
    """Python, NumPy and torch draws after a restore equal the draws right after the save."""
    saved = _trained(tiny_dir)
    path = _save(saved, tmp_path / "checkpoints")
    expected = _draws()
    _scramble_rng()
    assert _draws() != expected
    _restore(_trainer(tiny_dir, lora_seed=2), path)
    assert _draws() == expected


def test_skipping_the_rng_restore_leaves_the_rng_alone(tiny_dir: Path, tmp_path: Path) -> None:
    """``restore_rng=False`` (verify's negative control) restores the weights but not the generators."""
    saved = _trained(tiny_dir)
    path = _save(saved, tmp_path / "checkpoints")
    after_save = _draws()
    _scramble_rng()
    scrambled = _draws()
    _scramble_rng()
    fresh = _trainer(tiny_dir, lora_seed=2)
    _scramble_rng()
    _restore(fresh, path, restore_rng=False)
    assert _weights_sha(fresh) == _weights_sha(saved)
    assert _draws() == scrambled != after_save


def test_next_steps_after_restore_are_bitwise_equal(tiny_dir: Path, tmp_path: Path) -> None:
    """Two steps after a restore give the same loss bits and weights as two steps without stopping."""
    saved = _trained(tiny_dir)
    path = _save(saved, tmp_path / "checkpoints")
    expected = [(_step(saved), _weights_sha(saved)) for _ in range(2)]
    _scramble_rng()
    fresh = _trainer(tiny_dir, lora_seed=2)
    _restore(fresh, path)
    assert [(_step(fresh), _weights_sha(fresh)) for _ in range(2)] == expected


# --- layout, keep-last-K --------------------------------------------------------------------------


def test_checkpoint_layout_and_manifest(tiny_dir: Path, tmp_path: Path) -> None:
    """A checkpoint holds its files and a state.json with the position and every other file's sha256."""
    path = _save(_trained(tiny_dir), tmp_path / "checkpoints")
    assert path == tmp_path / "checkpoints" / "step-00000002"
    assert sorted(p.name for p in path.iterdir()) == sorted(CHECKPOINT_FILES)
    state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    assert (state["step"], state["epoch"], state["position"]) == (2, 0, [0, 8])
    data_files = [name for name in CHECKPOINT_FILES if name != STATE_FILE]
    assert state["files"] == {name: sha256_file(path / name) for name in data_files}
    assert verify_checkpoint(path) is None
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000002"]  # no temporary left


@pytest.mark.parametrize("keep", [1, 2, 3], ids=lambda k: f"keep{k}")
def test_keeps_the_last_k(tiny_dir: Path, tmp_path: Path, keep: int) -> None:
    """After five saves only the newest ``keep`` checkpoints remain."""
    trainer = _trainer(tiny_dir, lora_seed=1)
    directory = tmp_path / "checkpoints"
    for step in range(1, 6):
        _save(trainer, directory, CheckpointState(step=step, epoch=0, position=(0, 4 * step)), keep=keep)
    assert [p.name for p in list_checkpoints(directory)] == [f"step-{s:08d}" for s in range(6 - keep, 6)]


def test_saving_a_step_again_replaces_it(tiny_dir: Path, tmp_path: Path) -> None:
    """A checkpoint left by a crashed attempt at the same step is replaced whole, not merged."""
    directory = tmp_path / "checkpoints"
    first = _trainer(tiny_dir, lora_seed=1)
    path = _save(first, directory)
    second = _trained(tiny_dir)
    assert _save(second, directory) == path
    assert verify_checkpoint(path) is None
    fresh = _trainer(tiny_dir, lora_seed=3)
    _restore(fresh, path)
    assert _weights_sha(fresh) == _weights_sha(second) != _weights_sha(first)


def test_temporary_directories_are_not_checkpoints(tmp_path: Path) -> None:
    """A half-written temporary directory (a crash mid-save) is never listed as a checkpoint."""
    directory = tmp_path / "checkpoints"
    (directory / ".step-00000004.tmp-k2j3h4").mkdir(parents=True)
    (directory / "step-00000002").mkdir()
    (directory / "notes.txt").write_text("x", encoding="utf-8")
    assert [p.name for p in list_checkpoints(directory)] == ["step-00000002"]
    assert list_checkpoints(tmp_path / "missing") == []


def test_a_save_sweeps_what_killed_saves_left(tiny_dir: Path, tmp_path: Path) -> None:
    """The next save removes the hidden directories of saves killed half-way (a temporary one, and
    an old checkpoint set aside for a replace), and nothing else; it leaves none of its own."""
    directory = tmp_path / "checkpoints"
    killed = [directory / ".step-00000002.tmp-a1b2c3", directory / ".step-00000001.old-d4e5f6"]
    for path in killed:
        (path / "step-00000001").mkdir(parents=True)
    mine = directory / ".notes"
    mine.mkdir()
    trainer = _trained(tiny_dir)
    path = _save(trainer, directory)
    assert sorted(p.name for p in directory.iterdir()) == [".notes", path.name]
    assert verify_checkpoint(path) is None


# --- verification and fallback --------------------------------------------------------------------


@pytest.fixture
def two_checkpoints(tiny_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Checkpoints at steps 2 and 3 of one trainer."""
    trainer = _trained(tiny_dir)
    directory = tmp_path / "checkpoints"
    older = _save(trainer, directory)
    _step(trainer)
    newer = _save(trainer, directory, CheckpointState(step=3, epoch=0, position=(0, 12)))
    return older, newer


@pytest.mark.parametrize("name", CHECKPOINT_FILES)
def test_flipped_byte_in_any_file_is_refused_and_the_previous_one_used(
    two_checkpoints: tuple[Path, Path], name: str
) -> None:
    """A byte flipped in any file of the newest checkpoint: refused, with a warning; the previous is used."""
    older, newer = two_checkpoints
    _flip_byte(newer / name)
    problem = verify_checkpoint(newer)
    assert problem is not None
    assert name in problem
    warnings: list[str] = []
    assert next(valid_checkpoints(newer.parent, report=warnings.append), None) == older
    assert len(warnings) == 1
    assert warnings[0].startswith("warning: ") and str(newer) in warnings[0] and "falling back" in warnings[0]


@pytest.mark.parametrize("name", [n for n in CHECKPOINT_FILES if n != STATE_FILE])
def test_missing_file_is_refused(two_checkpoints: tuple[Path, Path], name: str) -> None:
    """A checkpoint with one of its files deleted is refused, naming the file."""
    _, newer = two_checkpoints
    (newer / name).unlink()
    assert verify_checkpoint(newer) == f"{name} is missing"


def test_no_valid_checkpoint_gives_none_with_a_warning_each(two_checkpoints: tuple[Path, Path]) -> None:
    """When every checkpoint is damaged there is none to resume from, and each refusal is reported."""
    older, newer = two_checkpoints
    _flip_byte(older / "trainable.safetensors")
    (newer / STATE_FILE).unlink()
    warnings: list[str] = []
    assert next(valid_checkpoints(older.parent, report=warnings.append), None) is None
    assert [str(newer) in warnings[0], str(older) in warnings[1]] == [True, True]
    assert len(warnings) == 2
    assert warnings[0].endswith("; falling back to the previous one")
    assert warnings[1].endswith("; no checkpoint is left: starting from step 0")  # not "the previous"


def test_any_single_bit_flip_in_state_json_is_refused(two_checkpoints: tuple[Path, Path]) -> None:
    """state.json guards the others, so it must guard itself: every single-bit flip in it is refused."""
    _, newer = two_checkpoints
    original = (newer / STATE_FILE).read_bytes()
    accepted = []
    for offset in range(len(original)):
        for mask in (0x01,):
            _flip_byte(newer / STATE_FILE, offset, mask)
            if verify_checkpoint(newer) is None:
                accepted.append((offset, mask, chr(original[offset] ^ mask)))
            (newer / STATE_FILE).write_bytes(original)
    assert accepted == []


def test_a_state_json_of_the_wrong_shape_is_refused_naming_each_key_even_with_its_own_hash(
    two_checkpoints: tuple[Path, Path],
) -> None:
    """A state.json rewritten with its own sha256 recomputed (so the hash cannot catch it) but a step
    that is text and a position of three numbers: refused, each key named."""
    _, newer = two_checkpoints
    state = json.loads((newer / STATE_FILE).read_text())
    state.update(step="6", position=[0, 1, 2])
    body = {k: v for k, v in state.items() if k != "state_sha256"}
    state["state_sha256"] = sha256_bytes(canonical_dumps(body).encode("utf-8"))
    (newer / STATE_FILE).write_text(canonical_dumps(state))
    problem = verify_checkpoint(newer)
    assert problem is not None and problem.startswith("state.json is not a checkpoint state: ")
    assert (
        "step: input should be a valid integer" in problem
        and "position: tuple should have at most 2" in problem
    )


# --- nothing is unpickled -------------------------------------------------------------------------


class _Payload:
    """Pickles to a call of ``os.mkdir(marker)``: unpickling it would run code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.mkdir, (str(self.marker),)


def _plant_payload(checkpoint: Path, marker: Path) -> None:
    torch.save({"optimizer": _Payload(marker), "scheduler": {}, "scaler": None}, checkpoint / "optimizer.pt")


def test_pickled_object_is_refused_by_its_hash(two_checkpoints: tuple[Path, Path], tmp_path: Path) -> None:
    """An optimizer.pt replaced by a pickled object fails its hash and is never loaded."""
    older, newer = two_checkpoints
    marker = tmp_path / "code-ran"
    _plant_payload(newer, marker)
    assert verify_checkpoint(newer) == "optimizer.pt does not match its recorded sha256"
    assert next(valid_checkpoints(newer.parent, report=lambda _: None), None) == older
    assert not marker.exists()


def test_pickled_object_with_matching_hash_is_not_executed(
    tiny_dir: Path, two_checkpoints: tuple[Path, Path], tmp_path: Path
) -> None:
    """Even with its hash forged into state.json, a pickled object is refused at load and never runs."""
    _, newer = two_checkpoints
    marker = tmp_path / "code-ran"
    _plant_payload(newer, marker)
    _resign(newer)
    assert verify_checkpoint(newer) is None  # the forgery passes the hash check...
    with pytest.raises((pickle.UnpicklingError, InputError)):
        _restore(_trainer(tiny_dir, lora_seed=2), newer)  # ...but weights_only refuses to build it
    assert not marker.exists()


def test_pickled_object_is_refused_as_bad_input(
    tiny_dir: Path, two_checkpoints: tuple[Path, Path], tmp_path: Path
) -> None:
    """The refusal is an InputError naming the file, not an internal error advising weights_only=False."""
    _, newer = two_checkpoints
    _plant_payload(newer, tmp_path / "code-ran")
    _resign(newer)
    with pytest.raises(InputError) as caught:
        _restore(_trainer(tiny_dir, lora_seed=2), newer)
    assert "optimizer.pt" in str(caught.value)
    assert "weights_only=False" not in str(caught.value)
    assert not (tmp_path / "code-ran").exists()


def test_state_shapes_are_checked_by_parameter_name() -> None:
    """A one-process optimizer state (numbered) and a distributed one (by name, as torch's
    get_optimizer_state_dict gives it) both fit the model as saved; a moment of another shape, or
    a group of another size, is refused naming the parameter."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from reprotune._run.checkpoint_shapes import check_state_shapes, optimizer_state_by_name, trainable_shapes

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    model[0].weight.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()
    shapes = trainable_shapes(model)
    assert shapes == {"0.bias": (2,), "1.weight": (1, 2), "1.bias": (1,)}
    weights = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    saved = optimizer.state_dict()
    named = optimizer_state_by_name(saved, optimizer, model)
    assert sorted(named) == sorted(shapes)
    check_state_shapes(weights, named, shapes)
    full = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    check_state_shapes(weights, full["state"], shapes)
    # A trainable weight the checkpoint lacks would stay at its initial value: refused, named
    # (a checkpoint with its hashes forged to match was restored, and the run diverged).
    with pytest.raises(InputError, match=r"the checkpoint lacks 1 trainable weight\(s\), e\.g\. 1\.bias"):
        check_state_shapes({k: v for k, v in weights.items() if k != "1.bias"}, named, shapes)
    saved["state"][1]["exp_avg_sq"] = torch.zeros(2, 1)
    with pytest.raises(
        InputError,
        match=r"the optimizer's exp_avg_sq of 1\.weight has shape \[2, 1\], the weight's is \[1, 2\]",
    ):
        check_state_shapes(weights, optimizer_state_by_name(saved, optimizer, model), shapes)
    saved["param_groups"][0]["params"] = saved["param_groups"][0]["params"][:-1]
    with pytest.raises(InputError, match="parameter group 0 holds 2 parameters, the optimizer's 3"):
        optimizer_state_by_name(saved, optimizer, model)
