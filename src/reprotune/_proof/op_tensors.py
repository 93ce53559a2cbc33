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
RNG_STATE_HASH = "rng-state"


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
    """xxh3-128 of a tensor's bytes in row-major order (its values, not its strides or device)."""
    data = t.detach()
    if data.device.type != "cpu":
        data = data.cpu()
    data = data.contiguous().reshape(-1)
    try:
        raw = data.view(torch.uint8).numpy()
    except (RuntimeError, TypeError):  # a layout without a byte view (sparse, quantized)
        return xxhash.xxh3_128_hexdigest(repr(data.tolist()).encode("utf-8"))
    return xxhash.xxh3_128_hexdigest(raw.data)
