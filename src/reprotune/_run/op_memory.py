"""What the op tracer knows of the memory a traced step's tensors live in: which op last wrote which
bytes of each storage (an input's ``src``), and which bytes of an allocation no op has written yet
(written ``uninitialized``, never hashed). Bytes, not tensors: a view reads and writes part of its
storage, a transposed or sliced view bytes that are not one run.

Storages are known by their address while they live (a weak reference to each says when one is
freed, so an address given to another tensor is not taken for the old one).
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import torch
from torch.multiprocessing.reductions import StorageWeakRef

#: Views spanning more runs of bytes than this are read as their whole extent (first to last byte)
#: and, written, mark nothing written (an in-place op on them then reads ``uninitialized``, never
#: leftover bytes): exact for what a step's ops write, bounded in cost.
MAX_RUNS = 256
#: The writes kept per storage, newest last (older ones are dropped: a step writes a buffer a few
#: times, a cache in place many).
MAX_WRITES = 256

Runs = list[tuple[int, int]]


def address(t: torch.Tensor) -> int:
    """The address of a tensor's storage (0 for one without: sparse, meta)."""
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return 0


def byte_range(t: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage ``t`` spans, [start, end): every element its strides can reach."""
    size = int(t.element_size())
    start = int(t.storage_offset()) * size
    if t.numel() == 0:
        return start, start
    reach = sum((int(n) - 1) * abs(int(stride)) for n, stride in zip(t.shape, t.stride(), strict=True))
    return start, start + (reach + 1) * size


def byte_runs(t: torch.Tensor) -> Runs | None:
    """The runs of bytes ``t``'s elements occupy in its storage, each [start, end); None when there
    are more than :data:`MAX_RUNS` (or its strides are negative or zero: an expanded view)."""
    if t.numel() == 0:
        return []
    dims = [(int(n), int(s)) for n, s in zip(t.shape, t.stride(), strict=True) if n != 1]
    if any(s <= 0 for _, s in dims):
        return None
    run = 1  # elements per run: the innermost dims that lie one after the other
    while dims and dims[-1][1] == run:
        run *= dims.pop()[0]
    if math.prod(n for n, _ in dims) > MAX_RUNS:
        return None
    starts = [int(t.storage_offset())]
    for n, stride in dims:
        starts = [b + i * stride for b in starts for i in range(n)]
    size = int(t.element_size())
    return [(b * size, (b + run) * size) for b in sorted(starts)]


def _overlaps(runs: Runs, start: int, end: int) -> bool:
    return any(s < end and start < e for s, e in runs)


def _merged(runs: Runs) -> Runs:
    """``runs`` sorted, overlapping or touching ones joined."""
    merged: Runs = []
    for start, end in sorted(runs):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


class Memory:
    """The writes the tracer saw, by storage (see the module docstring)."""

    def __init__(self) -> None:
        # an allocation no op has written all of: its storage, and the byte runs written so far
        self._fresh: dict[int, tuple[StorageWeakRef, Runs]] = {}
        # every storage an op wrote: its writes (start, end, op position), newest last
        self._writes: dict[int, tuple[StorageWeakRef, list[tuple[int, int, int]]]] = {}

    def allocated(self, t: torch.Tensor) -> None:
        """``t`` is an allocation no op has written (``aten::empty``'s output)."""
        if where := address(t):
            self._fresh[where] = (StorageWeakRef(t.untyped_storage()), [])

    def unwritten(self, t: torch.Tensor) -> bool:
        """Whether every byte ``t`` spans is of a live allocation no op has written there."""
        held = live(self._fresh, address(t))
        return held is not None and not any(_overlaps(held[1], start, end) for start, end in _reads(t))

    def wrote(self, t: torch.Tensor, op: int) -> None:
        """Op ``op`` wrote (or made) ``t``: its bytes are written, and it is their writer."""
        where = address(t)
        if not where:
            return
        runs = byte_runs(t)
        fresh = live(self._fresh, where)
        if fresh is not None and runs is not None:  # a view of too many runs marks nothing written
            merged = _merged([*fresh[1], *runs])
            if merged and merged[0][0] <= 0 and merged[0][1] >= t.untyped_storage().nbytes():
                del self._fresh[where]
            else:
                self._fresh[where] = (fresh[0], merged)
        held = live(self._writes, where)
        if held is None:
            held = self._writes[where] = (StorageWeakRef(t.untyped_storage()), [])
        held[1].extend((start, end, op) for start, end in (runs if runs is not None else [byte_range(t)]))
        del held[1][:-MAX_WRITES]

    def writer(self, t: torch.Tensor) -> int | None:
        """The position of the op that last wrote bytes ``t`` spans, while its storage lives."""
        held = live(self._writes, address(t))
        if held is None:
            return None
        reads = _reads(t)
        return next((op for start, end, op in reversed(held[1]) if _overlaps(reads, start, end)), None)


_Held = TypeVar("_Held", bound=tuple[StorageWeakRef, Any])


def live(table: dict[int, _Held], where: int) -> _Held | None:
    """What ``table`` holds for the storage at ``where`` while that storage lives (an entry of a
    freed one, whose address another tensor may have now, is dropped)."""
    held = table.get(where) if where else None
    if held is not None and held[0].expired():
        del table[where]
        return None
    return held


def _reads(t: torch.Tensor) -> Runs:
    """The bytes ``t`` spans, as runs (its whole extent for a view of too many)."""
    runs = byte_runs(t)
    return runs if runs is not None else [byte_range(t)]
