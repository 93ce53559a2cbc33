"""The ledger: one canonical JSON line per optimizer step, exact bits for every number that matters.

Format in docs/run-directory.md. Lines are appended, so a crash leaves at worst one partial last
line; ``read_ledger(..., repair=True)`` drops it, and resume truncates the
ledger back to the checkpoint's step before recomputing what came after.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from reprotune import _faults as faults
from reprotune._errors import InputError
from reprotune._jsonio import canonical_dumps, fsync_dir

LEDGER_FILE = "ledger.jsonl"


def hexf(value: float) -> str:
    """A float as its exact bits (``float.hex``), the way the ledger stores numbers."""
    return float(value).hex()


def batch_sha256(row_ids: list[int]) -> str:
    """sha256 of the dataset row indices of one optimizer step, in order, as ``"i,j,k"``."""
    return hashlib.sha256(",".join(map(str, row_ids)).encode("ascii")).hexdigest()


Entry = Mapping[str, Any] | Callable[[], Mapping[str, Any]]


class LedgerWriter:
    """Appends ledger lines to ``path``, handing them to the OS at least every ``flush_interval_s``.

    Entries queue in memory and are turned into lines and written together at each flush. An entry
    may be a callable that builds it: the training loop queues each step's line that way, so the
    formatting (hashing the batch's row ids, exact floats, canonical JSON) runs once per interval
    for many lines with warm caches, rather than in every step right after the backward pass has
    evicted them (where it cost about 80 us a line on the tiny model instead of under 10 us).

    A line not yet flushed when the process is killed is lost, which costs nothing: resume drops
    every line past its checkpoint and recomputes it. A Python exception still writes every queued
    line (``close`` runs). ``sync()`` (at each checkpoint, and on close) makes every line written
    so far durable.

    Args:
        path: the ledger file; created if missing, appended to otherwise.
        flush_interval_s: longest time a written entry stays in this process.
    """

    def __init__(self, path: Path, *, flush_interval_s: float = 0.5) -> None:
        self.path = path
        self._handle: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self._flush_interval_s = flush_interval_s
        self._last_flush = time.monotonic()
        self._queued: list[Entry] = []

    def write(self, entry: Entry) -> None:
        """Queue one entry (a mapping, or a callable returning one, called at the next flush)."""
        self._queued.append(entry)
        now = time.monotonic()
        if faults.ARMED or now - self._last_flush >= self._flush_interval_s:
            self.flush()

    def flush(self) -> None:
        """Write every queued entry, in order, as canonical JSON lines, and hand them to the OS."""
        queued, self._queued = self._queued, []
        for entry in queued:
            line = canonical_dumps(dict(entry() if callable(entry) else entry), indent=None)
            if faults.ARMED:  # crash tests: die with half a line on disk
                self._handle.write(line[: len(line) // 2])
                self._handle.flush()
                faults.kill_point("ledger-append")
                line = line[len(line) // 2 :]
            self._handle.write(line)
        self._handle.flush()
        self._last_flush = time.monotonic()

    def sync(self) -> None:
        """Make every entry written so far durable."""
        self.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        """Sync and close the file."""
        if not self._handle.closed:
            self.sync()
            self._handle.close()

    def __enter__(self) -> LedgerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_ledger(path: Path, *, repair: bool = False) -> Iterator[dict[str, Any]]:
    """Yield the ledger's entries in order.

    Args:
        path: the ledger file.
        repair: tolerate one partial last line (a crash mid-append) by ignoring it.

    Raises:
        InputError: a line that is not a JSON object (with its line number), or a partial last line
            when ``repair`` is false.
    """
    with open(path, "rb") as handle:
        lines = handle.read().split(b"\n")
    last = len(lines) - 1
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw)
            if not isinstance(entry, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            is_partial_tail = number - 1 == last  # no newline after it: an interrupted append
            if repair and is_partial_tail:
                return
            raise InputError(
                f"ledger line {number} is not a complete JSON object ({exc})",
                source=f"{path}:{number}",
                fix="the ledger was truncated or edited; resume the run or rerun it",
            ) from None
        yield entry


def truncate_ledger(path: Path, *, keep_through_step: int) -> int:
    """Rewrite the ledger keeping only entries with ``step <= keep_through_step``; return how many.

    Used on resume: what the lost steps wrote is dropped and recomputed. The rewrite is atomic.
    """
    kept = [e for e in iter_ledger(path, repair=True) if int(e.get("step", 0)) <= keep_through_step]
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for entry in kept:
            handle.write(canonical_dumps(entry, indent=None))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return len(kept)
