"""RNG state: capture every generator a run depends on, restore it, and save it without pickle.

The state of every generator a run touches (Python, NumPy's legacy global, torch CPU, every CUDA
device, and the generators reprotune owns) is captured as one keyed structure, which
:func:`rng_state_to_tensors` splits into tensors (for safetensors) and JSON metadata, so a
checkpoint's RNG state is restored without unpickling anything. torch and NumPy are imported when
a function is called.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from reprotune._errors import InputError

if TYPE_CHECKING:
    import numpy as np
    import torch

    OwnedGenerator = torch.Generator | np.random.Generator | random.Random

# Keys of the structure returned by capture_rng_state.
_PYTHON, _NUMPY, _TORCH, _CUDA, _GENERATORS = "python", "numpy", "torch", "cuda", "generators"


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

    The CUDA generators are restored for the devices present, the first ones saved: a state saved
    on a machine with more GPUs (by a CPU run, or a run on its first GPU) restores here.

    Raises:
        InputError: a given generator's type does not match the recorded kind.
    """
    import numpy as np
    import torch

    random.setstate(state[_PYTHON])
    np.random.set_state(state[_NUMPY])
    torch.set_rng_state(state[_TORCH])
    # Every GPU's generator is saved, used or not: those present here are restored (a run computes
    # on devices it finds present; a CPU run, saved on a machine with GPUs, on none of them).
    present = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for index, cuda_state in enumerate(list(state.get(_CUDA, []))[:present]):
        torch.cuda.set_rng_state(cuda_state, index)

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


_RANKS_FORMAT = "reprotune/rng-state-ranks"


def ranks_rng_to_tensors(
    states: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """:func:`rng_state_to_tensors` of every rank of a distributed run, in one file's worth.

    Tensors are named ``rank<r>/<name>``; the metadata lists each rank's, in rank order.

    Args:
        states: every rank's :func:`capture_rng_state`, in rank order.
    """
    tensors: dict[str, torch.Tensor] = {}
    metas = []
    for rank, state in enumerate(states):
        rank_tensors, meta = rng_state_to_tensors(state)
        tensors.update({f"rank{rank}/{name}": tensor for name, tensor in rank_tensors.items()})
        metas.append(meta)
    return tensors, {"format": _RANKS_FORMAT, "version": 1, "ranks": metas}


def ranks_rng_from_tensors(
    tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Inverse of :func:`ranks_rng_to_tensors`: every rank's state, in rank order.

    Raises:
        InputError: the metadata is not a reprotune per-rank RNG state.
    """
    if meta.get("format") != _RANKS_FORMAT or meta.get("version") != 1:
        raise InputError(
            f"not a reprotune per-rank RNG state v1 (format {meta.get('format')!r})",
            fix="load a checkpoint written by a distributed run of this version of reprotune",
        )
    states = []
    for rank, rank_meta in enumerate(meta["ranks"]):
        prefix = f"rank{rank}/"
        own = {name[len(prefix) :]: t for name, t in tensors.items() if name.startswith(prefix)}
        states.append(rng_state_from_tensors(own, rank_meta))
    return states
