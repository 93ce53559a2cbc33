"""How a trace writes an op's tensors: the content hash of each, and the dropout RNG state of fused
attention kernels, which it does not hash.

``aten::_scaled_dot_product_efficient_attention`` and its flash and cuDNN siblings return the
philox seed and offset their dropout used, and their backward takes them back. With dropout 0 these
are tensors the kernel never writes (uninitialized memory): on one GPU, a strict run and a run with
determinism off differed in them alone at every attention op (``fill_uninitialized_memory`` fills
them in strict mode only). A trace writes them as ``rng-state``; dropout that used them shows in
the kernel's outputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import torch
import xxhash

#: Schema names of the dropout RNG state fused attention kernels pass on (not hashed: see above).
_RNG_STATE = frozenset({"philox_seed", "philox_offset", "rng_state", "unused"})


@cache
def _rng_state_slots(func: Any) -> tuple[tuple[int, str], ...] | None:
    """Where ``func``'s schema passes dropout RNG state: (position, name) of each such argument,
    and (-1 - position, name) of each such return; None when it passes none."""
    schema = func._schema
    slots = [(i, a.name) for i, a in enumerate(schema.arguments) if a.name in _RNG_STATE]
    slots += [(-1 - i, r.name) for i, r in enumerate(schema.returns) if r.name in _RNG_STATE]
    return tuple(slots) or None


def rng_state_inputs(func: Any, args: Any, kwargs: Mapping[str, Any]) -> set[int]:
    """The ids of the tensors that carry an attention kernel's dropout RNG state into ``func``."""
    found: set[int] = set()
    for position, name in _rng_state_slots(func) or ():
        value = (args[position] if position < len(args) else kwargs.get(name)) if position >= 0 else None
        if isinstance(value, torch.Tensor):
            found.add(id(value))
    return found


def rng_state_outputs(func: Any, out: Any) -> set[int]:
    """The ids of the tensors that carry an attention kernel's dropout RNG state out of ``func``."""
    values = out if isinstance(out, (tuple, list)) else (out,)
    found: set[int] = set()
    for position, _ in _rng_state_slots(func) or ():
        if position < 0 and -1 - position < len(values) and isinstance(values[-1 - position], torch.Tensor):
            found.add(id(values[-1 - position]))
    return found


def tensor_hash(t: torch.Tensor) -> str:
    """xxh3-128 of a tensor's bytes in row-major order (its values, not its strides or device); a
    lazy conjugate or negation counts as the values it stands for, a sparse tensor as its layout,
    indices and values (coalesced), a ZeroTensor as zeros."""
    data = t.detach()
    if data.layout != torch.strided:
        return _sparse_hash(data)
    if data._is_zerotensor():
        data = torch.zeros(data.shape, dtype=data.dtype)
    if data.device.type != "cpu":
        data = data.cpu()
    data = data.resolve_conj().resolve_neg().contiguous().reshape(-1)
    try:
        raw = data.view(torch.uint8).numpy()
    except (RuntimeError, TypeError):  # a layout without a byte view (quantized)
        return xxhash.xxh3_128_hexdigest(repr(data.tolist()).encode("utf-8"))
    return xxhash.xxh3_128_hexdigest(raw.data)


def _sparse_hash(data: torch.Tensor) -> str:
    """A sparse tensor's hash: its layout, then each of its index and value tensors' hashes."""
    if data.layout == torch.sparse_coo:
        data = data.coalesce()
        parts = [data.indices(), data.values()]
    elif data.layout in (torch.sparse_csr, torch.sparse_bsr):
        parts = [data.crow_indices(), data.col_indices(), data.values()]
    elif data.layout in (torch.sparse_csc, torch.sparse_bsc):
        parts = [data.ccol_indices(), data.row_indices(), data.values()]
    else:
        parts = [data.to_dense()]
    digest = xxhash.xxh3_128(str(data.layout).encode("utf-8"))
    for part in parts:
        digest.update(tensor_hash(part).encode("ascii"))
    return digest.hexdigest()


#: Ops that allocate without writing (their bytes are whatever the allocator's memory held): a
#: trace writes ``tracefile.UNINITIALIZED`` for what they make.
_ALLOCATING = frozenset(
    {
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::empty_permuted",
        "aten::new_empty",
        "aten::new_empty_strided",
    }
)


def allocates(func: Any) -> bool:
    """Whether ``func`` returns memory it has not written (``aten::empty`` and its siblings)."""
    return str(func._schema.name) in _ALLOCATING


@cache
def _written_slots(func: Any) -> tuple[tuple[int, str], ...]:
    """(position, name) of each argument ``func``'s schema says it writes (``Tensor(a!)``)."""
    arguments = func._schema.arguments
    return tuple(
        (i, a.name) for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write
    )


def written_tensors(func: Any, args: Any, kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
    """The tensors ``func`` writes in place (``self`` of ``uniform_``, ``out=`` arguments)."""
    found = []
    for position, name in _written_slots(func):
        value = args[position] if position < len(args) else kwargs.get(name)
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):  # the _foreach_ ops write lists of tensors
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


#: Random ops (or overloads) whose schema has no ``Generator?`` argument: they draw from the default
#: generator of their device.
_DRAWS_DEFAULT = frozenset(
    {
        "aten::native_dropout",
        "aten::dropout",
        "aten::alpha_dropout",
        "aten::feature_dropout",
        "aten::feature_alpha_dropout",
        "aten::rand",
        "aten::rand_like",
        "aten::randn",
        "aten::randn_like",
        "aten::randint",
        "aten::randint_like",
        "aten::randperm",
        # fused attention draws its dropout from its device's generator
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_scaled_dot_product_fused_attention_overrideable",
        "aten::_flash_attention_forward",
        "aten::_efficient_attention_forward",
    }
)


@cache
def _generator_slot(func: Any) -> tuple[int, str] | None:
    """(position, name) of ``func``'s ``Generator?`` argument, (-1, "") for an op that draws from its
    device's default generator without one; None when it draws no random numbers."""
    for i, a in enumerate(func._schema.arguments):
        if "Generator" in str(a.type):
            return (i, a.name)
    return (-1, "") if str(func._schema.name) in _DRAWS_DEFAULT else None


def generator_entry(func: Any, args: Any, kwargs: Mapping[str, Any]) -> tuple[str, ...] | None:
    """A random op's generator state going in, as one more input (``["", "generator", hash,
    "rng:cpu"]``): the generator passed, else the default one of the op's device. None for an op
    that draws nothing, or one whose generator cannot be read (another device type)."""
    slot = _generator_slot(func)
    if slot is None:
        return None
    position, name = slot
    generator = None
    if position >= 0:
        generator = args[position] if position < len(args) else kwargs.get(name)
    if generator is None:
        generator = _default_generator(_op_device(args, kwargs))
    if generator is None:
        return None
    device = generator.device
    where = device.type if device.index is None else f"{device.type}:{device.index}"
    return ("", "generator", tensor_hash(generator.get_state()), f"rng:{where}")


def _op_device(args: Any, kwargs: Mapping[str, Any]) -> torch.device:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device
    device = kwargs.get("device")
    return torch.device(device) if device is not None else torch.device("cpu")


def _default_generator(device: torch.device) -> torch.Generator | None:
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return None
