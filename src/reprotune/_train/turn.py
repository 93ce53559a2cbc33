"""Training one at a time: processes that start side by side (verify's negative controls) load
their models together, then train in turns, so that no two of them run their threads on the same
cores at once (two runs of 2 threads each on 2 cores trained about ten times slower, measured)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: verify runs its legs one after another there (TURNS_POSSIBLE)
    fcntl = None  # type: ignore[assignment]

#: Whether this platform can take turns (verify runs side by side only where it can).
TURNS_POSSIBLE = fcntl is not None


@contextlib.contextmanager
def training_turn(lock: Path | None) -> Iterator[None]:
    """Wait for, then hold, an exclusive lock on the file ``lock`` (created if missing) for the
    block; ``None``: no lock, no wait. The operating system drops the lock when the process ends,
    however it ends."""
    if lock is None:
        yield
        return
    if fcntl is None:
        raise OSError(f"cannot take turns on {lock}: this platform has no fcntl.flock")
    with open(lock, "ab") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
