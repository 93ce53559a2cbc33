"""Tests for reprotune._determinism.seeds: golden derived seeds, global seeding, RNG capture and restore."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from reprotune._determinism.rng import (
    capture_rng_state,
    restore_rng_state,
    rng_state_from_tensors,
    rng_state_to_tensors,
)
from reprotune._determinism.seeds import (
    CONSUMERS,
    check_seed,
    derive_seed,
    derive_seeds,
    seed_everything,
    seed_worker,
    torch_generator,
)
from reprotune._errors import InputError
from reprotune._jsonio import canonical_dumps

# Golden values of derivation v1. If one of these changes, every recorded run's seeds change:
# do not update them, version the derivation instead.
GOLDEN = {
    0: [
        2919051308146224276,
        1501420933966420386,
        3500310064106296276,
        4665045611785890851,
        6960230992329607416,
    ],
    42: [
        7567179834970707508,
        7874871155933087196,
        1446913710995066786,
        4368694085829952428,
        1513372850753852197,
    ],
    2**63 - 1: [
        2204284301346694614,
        1610715693490348121,
        4920865962229539653,
        5295517906625064014,
        8797197453097177356,
    ],
}


def test_consumers_are_the_documented_five() -> None:
    """The consumer names and their order are a contract of the record."""
    assert CONSUMERS == ("split", "data_order", "lora_init", "dropout", "eval")


@pytest.mark.parametrize("root", sorted(GOLDEN), ids=lambda r: f"root={r}")
def test_derive_seed_golden(root: int) -> None:
    """Derived seeds equal the pinned golden values."""
    assert [derive_seed(root, name) for name in CONSUMERS] == GOLDEN[root]


def test_derive_seed_matches_documented_formula() -> None:
    """derive_seed is exactly the formula in its docstring."""
    for name in (*CONSUMERS, "some-future-consumer"):
        digest = hashlib.sha256(f"reprotune/seed/v1/123/{name}".encode()).digest()
        assert derive_seed(123, name) == int.from_bytes(digest[:8], "big") & (2**63 - 1)


def test_derive_seeds_includes_root_and_every_consumer() -> None:
    """derive_seeds gives root plus one seed per consumer."""
    seeds = derive_seeds(42)
    assert seeds == {"root": 42, **dict(zip(CONSUMERS, GOLDEN[42], strict=True))}


def test_override_moves_only_its_consumer() -> None:
    """Overriding one consumer's seed leaves every other seed unchanged."""
    base = derive_seeds(42)
    changed = derive_seeds(42, {"lora_init": 7})
    assert changed["lora_init"] == 7
    assert {k: v for k, v in changed.items() if k != "lora_init"} == {
        k: v for k, v in base.items() if k != "lora_init"
    }


@pytest.mark.parametrize(
    "root", [-1, 2**63, True, 1.5, "42"], ids=["negative", "too-big", "bool", "float", "str"]
)
def test_bad_root_is_refused(root: object) -> None:
    """A root seed out of range or of the wrong type raises InputError naming it."""
    with pytest.raises(InputError, match="root seed"):
        derive_seeds(root)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [0, np.int64(5), 2**63 - 1], ids=["zero", "numpy", "largest"])
def test_check_seed_takes_an_integer_in_range_numpys_too(seed: object) -> None:
    """Python's and NumPy's integers in [0, 2**63) are seeds, and come back as Python ints."""
    checked = check_seed(seed)
    assert type(checked) is int and checked == seed
    # and what takes a seed keeps that int: a record's seeds are JSON, random.seed takes no NumPy
    assert type(derive_seeds(seed)["root"]) is int  # type: ignore[arg-type]
    assert seed_everything(seed) == seed and type(seed_everything(seed)) is int  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "seed", [-1, 2**63, True, 1.5, "42"], ids=["negative", "too-big", "bool", "float", "str"]
)
def test_check_seed_names_the_value_where_it_came_from_and_the_fix(seed: object) -> None:
    """Anything else is refused with what it is, the value, its source and the given fix."""
    with pytest.raises(InputError) as info:
        check_seed(seed, "data.seed", source="exp.yaml", fix="e.g. 7")
    assert f"data.seed must be an integer in [0, 2**63) (got {seed!r})" in str(info.value)
    assert info.value.source == "exp.yaml" and info.value.fix == "e.g. 7"


def test_unknown_override_is_refused() -> None:
    """An override for an unknown consumer raises InputError listing the known ones."""
    with pytest.raises(InputError, match="lora") as info:
        derive_seeds(1, {"lora": 3})
    assert "lora_init" in str(info.value)


def test_seed_everything_repeats_draws_and_uses_high_bits() -> None:
    """seed_everything returns the seed, repeats draws, and seeds differing above bit 32 differ in NumPy."""

    def draws() -> tuple[float, float, float]:
        return random.random(), float(np.random.random()), float(torch.rand(1).item())

    assert seed_everything(5) == 5
    first = draws()
    seed_everything(5)
    assert draws() == first
    seed_everything(5 + 2**32)
    assert draws()[1] != first[1]


def test_seed_worker_follows_torch_initial_seed() -> None:
    """seed_worker seeds Python and NumPy from torch's (per-worker) initial seed."""
    torch.manual_seed(99)
    seed_worker(0)
    a = (random.random(), float(np.random.random()))
    torch.manual_seed(99)
    seed_worker(3)
    assert (random.random(), float(np.random.random())) == a
    torch.manual_seed(100)
    seed_worker(0)
    assert random.random() != a[0]


def test_torch_generator_is_seeded() -> None:
    """torch_generator(seed) gives the same stream for the same seed."""
    a = torch.randperm(20, generator=torch_generator(3))
    b = torch.randperm(20, generator=torch_generator(3))
    assert torch.equal(a, b)


def _owned() -> dict[str, Any]:
    return {
        "order": torch_generator(11),
        "pcg": np.random.default_rng(12),
        "mt": np.random.Generator(np.random.MT19937(13)),
        "py": random.Random(14),
    }


def _draw_all(gens: Mapping[str, Any]) -> list[object]:
    """One draw from every global generator and every owned one."""
    out: list[object] = [random.random(), np.random.random(), torch.rand(3).tolist()]
    out.append(torch.rand(2, generator=gens["order"]).tolist())
    out.append(gens["pcg"].random(2).tolist())
    out.append(gens["mt"].random(2).tolist())
    out.append(gens["py"].random())
    if torch.cuda.is_available():
        out.append(torch.rand(2, device="cuda").tolist())
    return out


def test_restore_then_draw_equal_in_place() -> None:
    """Restoring a captured state into the same generators repeats every draw."""
    gens = _owned()
    _draw_all(gens)  # move away from the seeded starting points
    state = capture_rng_state(gens)
    expected = _draw_all(gens)
    _draw_all(gens)
    restored = restore_rng_state(state, gens)
    assert set(restored) == set(gens)
    assert _draw_all(gens) == expected


def test_state_survives_safetensors_round_trip(tmp_path: Path) -> None:
    """A state saved as tensors + JSON metadata, without pickle, restores into new generators."""
    gens = _owned()
    _draw_all(gens)
    tensors, meta = rng_state_to_tensors(capture_rng_state(gens))
    save_file(tensors, str(tmp_path / "rng.safetensors"), metadata={"rng": canonical_dumps(meta)})
    expected = _draw_all(gens)
    seed_everything(0)  # scramble the globals

    loaded = load_file(str(tmp_path / "rng.safetensors"))
    text = json.loads(canonical_dumps(meta))  # what a reader gets back from the metadata string
    fresh = restore_rng_state(rng_state_from_tensors(loaded, text))
    assert {k: type(v) for k, v in fresh.items()} == {k: type(v) for k, v in gens.items()}
    assert _draw_all(fresh) == expected


def test_wrong_generator_kind_is_refused() -> None:
    """Restoring a torch generator's state into a random.Random raises InputError."""
    state = capture_rng_state({"order": torch_generator(1)})
    with pytest.raises(InputError, match="order"):
        restore_rng_state(state, {"order": random.Random()})


def test_unknown_rng_format_is_refused() -> None:
    """Metadata that is not a reprotune RNG state raises InputError."""
    with pytest.raises(InputError, match="not a reprotune RNG state"):
        rng_state_from_tensors({}, {"format": "other", "version": 1, "state": {}})


def test_pure_functions_do_not_import_torch() -> None:
    """Importing _seeding and deriving seeds never imports torch (compare and report rely on it)."""
    code = (
        "import sys; from reprotune._determinism.seeds import derive_seeds; derive_seeds(1); "
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, 'heavy import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_seed_everything_records_what_it_seeded() -> None:
    """Python, NumPy and torch always; TensorFlow exactly when it is installed."""
    import importlib.util

    from reprotune._determinism.seeds import last_seeding

    seed_everything(2**40 + 7)
    seeding = last_seeding()
    assert seeding is not None and seeding["seed"] == 2**40 + 7
    has_tensorflow = importlib.util.find_spec("tensorflow") is not None
    expected = ["python", "numpy", "torch", *(["tensorflow"] if has_tensorflow else [])]
    assert seeding["seeded"] == expected
    assert ("tensorflow" in seeding) == has_tensorflow


#: A stand-in for TensorFlow (a 600 MB install, not one of reprotune's requirements): its
#: ``random.set_seed`` and ``config.experimental.enable_op_determinism``, by their real names,
#: record how they were called.
_TENSORFLOW_STANDIN = """
import types
__version__ = "2.99.0-standin"
calls = []
random = types.SimpleNamespace(set_seed=lambda seed: calls.append(("set_seed", seed)))
config = types.SimpleNamespace(
    experimental=types.SimpleNamespace(
        enable_op_determinism=lambda: calls.append(("enable_op_determinism",))
    )
)
"""


def test_seed_everything_seeds_tensorflow_when_installed(tmp_path: Path) -> None:
    """With a ``tensorflow`` package importable, seed_everything calls tf.random.set_seed with the
    seed and turns on TF's deterministic ops, and records both (in a fresh process, so that the
    stand-in never meets this one's imports)."""
    package = tmp_path / "site" / "tensorflow"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(_TENSORFLOW_STANDIN, encoding="utf-8")
    script = (
        "import json, sys, tensorflow\n"
        "from reprotune import seed_everything\n"
        "from reprotune._determinism.seeds import last_seeding\n"
        "seed_everything(1234)\n"
        "print(json.dumps({'calls': tensorflow.calls, 'seeding': last_seeding()}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["calls"] == [["set_seed", 1234], ["enable_op_determinism"]]
    assert out["seeding"] == {
        "seed": 1234,
        "seeded": ["python", "numpy", "torch", "tensorflow"],
        "tensorflow": {"version": "2.99.0-standin", "op_determinism": True},
    }


def test_a_broken_tensorflow_does_not_stop_seed_everything(tmp_path: Path) -> None:
    """TensorFlow installed but failing to import (built against another NumPy, say): torch and the
    rest are seeded, a warning says why TensorFlow was not, and the record keeps the error."""
    package = tmp_path / "site" / "tensorflow"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('built against another numpy')\n")
    script = (
        "import json, warnings\n"
        "from reprotune import seed_everything\n"
        "from reprotune._determinism.seeds import last_seeding\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    seed_everything(7)\n"
        "print(json.dumps({'seeding': last_seeding(), 'warnings': [str(w.message) for w in caught]}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["seeding"]["seeded"] == ["python", "numpy", "torch"]
    assert out["seeding"]["tensorflow"] == {"error": "ImportError: built against another numpy"}
    assert any("TensorFlow is installed but ImportError" in w for w in out["warnings"])


def test_a_state_saved_with_gpus_restores_where_there_are_fewer() -> None:
    """A CPU run's checkpoint saved on a machine with a GPU holds that GPU's generator: restored on
    a machine without one, the CPU state comes back and the GPU's is let be (it was refused: "the
    RNG state covers 1 CUDA device(s) but 0 are present", so the run could not resume)."""
    torch.manual_seed(7)
    state = capture_rng_state()
    expected = torch.rand(3)
    gpu = torch.cuda.get_rng_state() if torch.cuda.is_available() else state["torch"]
    saved = {**state, "cuda": [gpu] * 9}  # nine GPUs' generators, more than any machine here
    torch.manual_seed(8)
    restore_rng_state(saved)
    assert torch.equal(torch.rand(3), expected)
