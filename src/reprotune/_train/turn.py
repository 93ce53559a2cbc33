"""Training in turns: processes that verify starts side by side (its controls beside the rerun's
processes) load their models together, then train one at a time, so that no two of them run
their threads on the same cores at once (two runs of 2 threads each on 2 cores trained about ten
times slower, measured)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from reprotune._run.lock import UNSUPPORTED

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
    however it ends. On a filesystem that cannot lock, the block runs without a turn: the same
    numbers, only slower while others train beside it."""
    if lock is None:
        yield
        return
    if fcntl is None:
        raise OSError(f"cannot take turns on {lock}: this platform has no fcntl.flock")
    with open(lock, "ab") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            locked = True
        except OSError as exc:
            if exc.errno not in UNSUPPORTED:
                raise
            locked = False
        try:
            yield
        finally:
            if locked:
                fcntl.flock(handle, fcntl.LOCK_UN)
