"""Everything about randomness: derived seeds, global seeding, and RNG state capture and restore.

One root seed feeds every consumer through :func:`derive_seed`, a stable, documented function
of ``(root, consumer name)`` alone, so adding, renaming or overriding one consumer never shifts
another. The RNG state of every generator a run touches (Python, NumPy's legacy global, torch
CPU, every CUDA device, and the generators reprotune owns) is captured as one keyed structure
that can be written without pickle (tensors for safetensors plus JSON metadata).

The pure functions (:data:`CONSUMERS`, :func:`derive_seed`, :func:`derive_seeds`) import nothing
heavy: commands that read records (compare, report) use them without importing torch. Functions
that touch torch or NumPy import them when called.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from reprotune._errors import InputError

if TYPE_CHECKING:
    import numpy as np
    import torch

    OwnedGenerator = torch.Generator | np.random.Generator | random.Random

#: The consumers of randomness that get their own derived seed, in recording order.
CONSUMERS: tuple[str, ...] = ("split", "data_order", "lora_init", "dropout", "eval")

#: Seeds are non-negative and fit a signed 64-bit integer, so every library and JSON reader takes them.
SEED_LIMIT = 2**63

_DERIVATION_PREFIX = "reprotune/seed/v1"
_MASK_63 = SEED_LIMIT - 1
_U32 = 0xFFFFFFFF

# Keys of the structure returned by capture_rng_state.
_PYTHON, _NUMPY, _TORCH, _CUDA, _GENERATORS = "python", "numpy", "torch", "cuda", "generators"


def _check_seed(value: object, what: str) -> int:
    """Return ``value`` if it is a valid seed, else raise :class:`InputError` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_LIMIT:
        raise InputError(
            f"{what} must be an integer in [0, 2**63) (got {value!r})",
            fix="use a non-negative integer below 9223372036854775808, e.g. 42",
        )
    return value


def derive_seed(root: int, name: str) -> int:
    """Derive the seed of consumer ``name`` from the root seed.

    The derivation (version 1, stable forever: records depend on it) is::

        digest = sha256(f"reprotune/seed/v1/{root}/{name}".encode("utf-8"))
        seed = int.from_bytes(digest[:8], "big") & (2**63 - 1)

    It depends on ``root`` and ``name`` only, so one consumer's seed never moves when another
    consumer is added, renamed or overridden.

    Args:
        root: the root seed, an integer in ``[0, 2**63)``.
        name: the consumer's name (any non-empty string; see :data:`CONSUMERS`).

    Returns:
        An integer in ``[0, 2**63)``.

    Raises:
        InputError: ``root`` is out of range or ``name`` is empty.

    Example:
        >>> derive_seed(42, "split")
        7567179834970707508
    """
    _check_seed(root, "root seed")
    if not isinstance(name, str) or not name:
        raise InputError(f"seed consumer name must be a non-empty string (got {name!r})")
    digest = hashlib.sha256(f"{_DERIVATION_PREFIX}/{root}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & _MASK_63


def derive_seeds(root: int, overrides: Mapping[str, int] | None = None) -> dict[str, int]:
    """Every seed of a run: ``root`` plus one per consumer in :data:`CONSUMERS`.

    Args:
        root: the root seed.
        overrides: consumer -> explicit seed, replacing that consumer's derived seed only.

    Returns:
        ``{"root": root, "split": ..., "data_order": ..., "lora_init": ..., "dropout": ..., "eval": ...}``.

    Raises:
        InputError: an override names an unknown consumer, or a seed is out of range.
    """
    _check_seed(root, "root seed")
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(CONSUMERS))
    if unknown:
        raise InputError(
            f"unknown seed consumer(s) {', '.join(map(repr, unknown))}",
            source="seed.overrides",
            fix=f"use one of {', '.join(CONSUMERS)}",
        )
    seeds = {"root": root}
    for consumer in CONSUMERS:
        if consumer in overrides:
            seeds[consumer] = _check_seed(overrides[consumer], f"seed.overrides.{consumer}")
        else:
            seeds[consumer] = derive_seed(root, consumer)
    return seeds


def seed_everything(seed: int) -> int:
    """Seed Python's ``random``, NumPy's legacy global RNG and torch (CPU and every CUDA device).

    NumPy's legacy seeding takes 32-bit words, so the seed is passed as its low and high 32-bit
    halves: every bit of a 63-bit seed counts.

    Args:
        seed: an integer in ``[0, 2**63)``.

    Returns:
        The seed used.

    Raises:
        InputError: ``seed`` is out of range.
    """
    import numpy as np
    import torch

    _check_seed(seed, "seed")
    random.seed(seed)
    np.random.seed([seed & _U32, seed >> 32])
    torch.manual_seed(seed)  # also seeds every CUDA device
    return seed


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn`` for a ``torch.utils.data.DataLoader``: seed Python and NumPy in a worker.

    torch seeds each worker with ``base_seed + worker_id``, where ``base_seed`` is drawn from the
    DataLoader's ``generator``; this carries that seed to ``random`` and NumPy, which torch leaves
    alone. Pass ``generator=torch_generator(seeds["data_order"])`` too, or the base seed itself
    comes from the unseeded global generator.

    Args:
        worker_id: the worker's index (unused: torch already folded it into the seed).
    """
    import numpy as np
    import torch

    del worker_id
    worker_seed = torch.initial_seed() & _MASK_63
    random.seed(worker_seed)
    np.random.seed([worker_seed & _U32, worker_seed >> 32])


def torch_generator(seed: int, device: str = "cpu") -> torch.Generator:
    """A new ``torch.Generator`` on ``device`` seeded with ``seed``: randomness reprotune owns.

    Raises:
        InputError: ``seed`` is out of range.
    """
    import torch

    _check_seed(seed, "seed")
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def capture_rng_state(generators: Mapping[str, OwnedGenerator] | None = None) -> dict[str, Any]:
    """Capture every RNG state a run depends on, as one keyed structure.

    Args:
        generators: the generators reprotune owns, by name (``torch.Generator``,
            ``numpy.random.Generator`` or ``random.Random``).

    Returns:
        ``{"python": ..., "numpy": ..., "torch": ByteTensor, "cuda": [ByteTensor per device],
        "generators": {name: {"kind": ..., "state": ..., "device": ...}}}``. Pass it to
        :func:`restore_rng_state`, or to :func:`rng_state_to_tensors` to save it.

    Raises:
        InputError: a generator is of an unsupported type.
    """
    import numpy as np
    import torch

    owned: dict[str, dict[str, Any]] = {}
    for name, generator in (generators or {}).items():
        if isinstance(generator, torch.Generator):
            owned[name] = {"kind": "torch", "state": generator.get_state(), "device": str(generator.device)}
        elif isinstance(generator, np.random.Generator):
            owned[name] = {"kind": "numpy", "state": generator.bit_generator.state}
        elif isinstance(generator, random.Random):
            owned[name] = {"kind": "python", "state": generator.getstate()}
        else:
            raise InputError(
                f"cannot capture the state of generator {name!r} of type {type(generator).__name__}",
                fix="use a torch.Generator, numpy.random.Generator or random.Random",
            )
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return {
        _PYTHON: random.getstate(),
        _NUMPY: np.random.get_state(),
        _TORCH: torch.get_rng_state(),
        _CUDA: list(cuda),
        _GENERATORS: owned,
    }


def restore_rng_state(
    state: Mapping[str, Any], generators: Mapping[str, OwnedGenerator] | None = None
) -> dict[str, OwnedGenerator]:
    """Restore a state captured by :func:`capture_rng_state`.

    Globals (Python, NumPy, torch CPU, CUDA devices) are restored in place. Each owned generator
    in ``state`` is restored into the generator of the same name in ``generators`` when given
    there, or into a new generator of the recorded kind (and device) otherwise.

    Args:
        state: the captured state.
        generators: existing generators to restore in place, by name.

    Returns:
        name -> generator, for every owned generator in ``state``.

    Raises:
        InputError: the state names more CUDA devices than are present, or a given generator's
            type does not match the recorded kind.
    """
    import numpy as np
    import torch

    random.setstate(state[_PYTHON])
    np.random.set_state(state[_NUMPY])
    torch.set_rng_state(state[_TORCH])
    cuda_states = list(state.get(_CUDA, []))
    if cuda_states:
        present = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if len(cuda_states) > present:
            raise InputError(
                f"the RNG state covers {len(cuda_states)} CUDA device(s) but {present} are present",
                fix="resume on a machine with the same number of GPUs",
            )
        torch.cuda.set_rng_state_all(cuda_states)

    given = dict(generators or {})
    restored: dict[str, OwnedGenerator] = {}
    for name, entry in state.get(_GENERATORS, {}).items():
        kind = entry["kind"]
        target = given.get(name)
        if kind == "torch":
            if target is None:
                target = torch.Generator(device=entry.get("device", "cpu"))
            if not isinstance(target, torch.Generator):
                raise _kind_mismatch(name, kind, target)
            target.set_state(entry["state"])
        elif kind == "numpy":
            if target is None:
                bit_generator = getattr(np.random, entry["state"]["bit_generator"])()
                target = np.random.Generator(bit_generator)
            if not isinstance(target, np.random.Generator):
                raise _kind_mismatch(name, kind, target)
            target.bit_generator.state = entry["state"]
        elif kind == "python":
            if target is None:
                target = random.Random()
            if not isinstance(target, random.Random):
                raise _kind_mismatch(name, kind, target)
            target.setstate(entry["state"])
        else:
            raise InputError(f"unknown generator kind {kind!r} for {name!r} in RNG state")
        restored[name] = target
    return restored


def _kind_mismatch(name: str, kind: str, target: object) -> InputError:
    return InputError(
        f"generator {name!r} was saved as a {kind} generator but a {type(target).__name__} was given",
        fix="pass a generator of the same kind as the one captured",
    )


# --- pickle-free serialisation ---------------------------------------------------------------
#
# Tensors carry the bulk (MT19937 keys, torch states); JSON metadata carries the structure and
# the scalars. Floats go through float.hex so no JSON reader can round them.


def _encode_value(value: Any, key: str, tensors: dict[str, torch.Tensor]) -> Any:
    """JSON-safe form of one state component; arrays become tensors stored under ``key``."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        tensors[key] = value.detach().cpu().contiguous()
        return {"$tensor": key, "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, np.ndarray):
        # Keys are uint32 (MT19937) or uint64; int64 holds the former exactly, and the bits of
        # the latter (restored through a view), in a dtype every safetensors reader knows.
        as_int64 = value.view(np.int64) if value.dtype == np.uint64 else value.astype(np.int64)
        tensors[key] = torch.from_numpy(np.ascontiguousarray(as_int64))
        return {"$ndarray": key, "dtype": str(value.dtype)}
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return {"$float": float(value).hex()}
    if isinstance(value, tuple) and _is_int_tuple(value):
        tensors[key] = torch.tensor(value, dtype=torch.int64)
        return {"$int_tuple": key}
    if isinstance(value, (tuple, list)):
        return {
            "$seq": [_encode_value(v, f"{key}.{i}", tensors) for i, v in enumerate(value)],
            "tuple": isinstance(value, tuple),
        }
    if isinstance(value, dict):
        return {"$dict": {str(k): _encode_value(v, f"{key}.{k}", tensors) for k, v in value.items()}}
    raise InputError(f"cannot serialise RNG state component {key!r} of type {type(value).__name__}")


def _is_int_tuple(value: tuple[Any, ...]) -> bool:
    """A long tuple of int64-sized ints (Python's MT19937 key): cheaper as one tensor than as JSON."""
    return len(value) > 16 and all(
        isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63 for v in value
    )


def _decode_value(meta: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """Inverse of :func:`_encode_value`."""
    import numpy as np
    import torch

    if not isinstance(meta, dict):
        return meta
    if "$tensor" in meta:
        return tensors[meta["$tensor"]].to(getattr(torch, meta["dtype"])).clone()
    if "$ndarray" in meta:
        raw = tensors[meta["$ndarray"]].numpy()
        dtype = np.dtype(meta["dtype"])
        return raw.view(np.uint64).copy() if dtype == np.uint64 else raw.astype(dtype)
    if "$float" in meta:
        return float.fromhex(meta["$float"])
    if "$int_tuple" in meta:
        return tuple(int(v) for v in tensors[meta["$int_tuple"]].tolist())
    if "$seq" in meta:
        items = [_decode_value(v, tensors) for v in meta["$seq"]]
        return tuple(items) if meta["tuple"] else items
    if "$dict" in meta:
        return {k: _decode_value(v, tensors) for k, v in meta["$dict"].items()}
    raise InputError(f"unrecognised RNG state metadata entry {sorted(meta)!r}")


def rng_state_to_tensors(state: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split a captured RNG state into tensors and JSON-safe metadata, for pickle-free saving.

    Save the tensors with ``safetensors.torch.save_file(tensors, path,
    metadata={"rng": canonical_dumps(meta)})`` and read them back with
    :func:`rng_state_from_tensors`. Tensor names are readable paths (``python.1``, ``torch``,
    ``cuda.0``, ``generators.order.state``).

    Args:
        state: a structure returned by :func:`capture_rng_state`.

    Returns:
        ``(tensors, meta)``: tensor name -> CPU tensor, and the JSON-safe metadata.

    Raises:
        InputError: the state holds a component that cannot be serialised.
    """
    tensors: dict[str, torch.Tensor] = {}
    encoded = {str(name): _encode_value(value, str(name), tensors) for name, value in state.items()}
    return tensors, {"format": "reprotune/rng-state", "version": 1, "state": encoded}


def rng_state_from_tensors(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> dict[str, Any]:
    """Rebuild the structure of :func:`capture_rng_state` from :func:`rng_state_to_tensors` output.

    Raises:
        InputError: the metadata is not a reprotune RNG state, or of an unknown version.
    """
    if meta.get("format") != "reprotune/rng-state" or meta.get("version") != 1:
        raise InputError(
            f"not a reprotune RNG state v1 (format {meta.get('format')!r}, version {meta.get('version')!r})",
            fix="load a checkpoint written by this version of reprotune",
        )
    return {name: _decode_value(value, tensors) for name, value in meta["state"].items()}
