"""The ledger (``ledger.jsonl``): its line schema, the writer and the reader, in one place.

One canonical JSON line per optimizer step (``train``), one before the first step (``init``: the
LoRA weights as created) and one per validation pass (``val``), with exact bits for every number
that matters (``float.hex``). Two ledgers compared line by line tell where two runs part and
whether the data order or the numbers parted first. Fields: docs/run-directory.md.

Lines are appended, so a kill leaves at worst one partial last line; :func:`read_ledger` with
``repair=True`` drops it. What a resume keeps of a ledger (up to its checkpoint's step, past a
damaged unsynced line too) is ``_run.ledger_resume``'s.

This module is over 400 lines on purpose: it is the format's one owner (schema, builders, writer,
strict reader), so that what is written and what is accepted can never drift apart. It never
imports torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from reprotune._errors import InputError
from reprotune._jsonio import canonical_dumps, sha256_bytes

EntryKind = Literal["init", "train", "val"]

_SHA256 = re.compile(r"[0-9a-f]{64}")
# What float.hex() writes: finite numbers, signed infinities and nan. A decimal such as "0.5"
# would also parse with float.fromhex (as 5/16), so the shape is checked, not just parsed.
_HEX_FLOAT = re.compile(r"-?(0x[0-9a-f]+(\.[0-9a-f]*)?p[+-][0-9]+|inf)|nan")

# The fields each ledger kind must carry, and the shape of each (docs/run-directory.md).
_FieldType = Literal["int", "sha256", "hexfloat"]
_LEDGER_FIELDS: dict[str, dict[str, _FieldType]] = {
    "init": {"step": "int", "weights_sha256": "sha256"},
    "train": {
        "step": "int",
        "epoch": "int",
        "batch_sha256": "sha256",
        "n_rows": "int",
        "n_tokens": "int",
        "loss": "hexfloat",
        "lr": "hexfloat",
        "grad_norm": "hexfloat",
        "weights_sha256": "sha256",
    },
    "val": {"step": "int", "loss": "hexfloat", "n_rows": "int", "n_tokens": "int"},
}
# Fields a line carries only in some runs, checked when present: each rank's batch hash, by rank,
# in the train lines of a distributed run (absent from single-process ledgers, which stay as they were).
RANK_BATCHES = "rank_batch_sha256"
_LEDGER_FIX = (
    "the ledger was truncated or edited by hand; restore the run directory from a copy, "
    "or reproduce the run with `reprotune rerun RUN_DIR`"
)


# -- building lines ----------------------------------------------------------------------------


def hexf(value: float) -> str:
    """A float as its exact bits (``float.hex``), the way the ledger stores numbers."""
    return float(value).hex()


def batch_sha256(row_ids: list[int]) -> str:
    """sha256 of the dataset row indices of one optimizer step, in order, as ``"i,j,k"``."""
    return hashlib.sha256(",".join(map(str, row_ids)).encode("ascii")).hexdigest()


def init_line(weights_sha256: str) -> dict[str, Any]:
    """The first line: the trainable weights as created, before any step."""
    return {"kind": "init", "step": 0, "weights_sha256": weights_sha256}


def train_line(
    step: int,
    epoch: int,
    rows: list[int],
    n_tokens: int,
    loss: float,
    lr: float,
    grad_norm: float,
    weights_sha256: str,
    rank_rows: list[list[int]] | None = None,
) -> dict[str, Any]:
    """One optimizer step's line: which rows, how many tokens, loss, lr, grad norm, weights after.

    ``rank_rows`` (distributed runs): each rank's rows, by rank; their hashes go in
    ``rank_batch_sha256``. Without it the line has no such key.
    """
    line: dict[str, Any] = {
        "kind": "train",
        "step": step,
        "epoch": epoch,
        "batch_sha256": batch_sha256(rows),
        "n_rows": len(rows),
        "n_tokens": n_tokens,
        "loss": hexf(loss),
        "lr": hexf(lr),
        "grad_norm": hexf(grad_norm),
        "weights_sha256": weights_sha256,
    }
    if rank_rows is not None:
        line[RANK_BATCHES] = [batch_sha256(rows) for rows in rank_rows]
    return line


def val_line(step: int, loss: float, n_rows: int, n_tokens: int) -> dict[str, Any]:
    """One validation pass after optimizer step ``step``: the mean token loss."""
    return {"kind": "val", "step": step, "loss": hexf(loss), "n_rows": n_rows, "n_tokens": n_tokens}


# -- writing -----------------------------------------------------------------------------------

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
        if now - self._last_flush >= self._flush_interval_s:
            self.flush()

    def flush(self) -> None:
        """Write every queued entry, in order, as canonical JSON lines, and hand them to the OS."""
        queued, self._queued = self._queued, []
        for entry in queued:
            line = canonical_dumps(dict(entry() if callable(entry) else entry), indent=None)
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


# -- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerEntry:
    """One ledger line, checked.

    Attributes:
        kind: ``init``, ``train`` or ``val``.
        step: the optimizer step the line belongs to (0 for ``init``).
        line: its 1-based line number in ``ledger.jsonl``, for messages.
        fields: the whole JSON object, every key (known or not), as read.
    """

    kind: EntryKind
    step: int
    line: int
    fields: Mapping[str, Any]

    def number(self, key: str) -> float:
        """The float stored as ``float.hex`` under ``key``."""
        return float.fromhex(self.fields[key])


def val_by_place(lines: Iterable[LedgerEntry]) -> dict[tuple[int, int], LedgerEntry]:
    """Val lines by (step, place among that step's val lines, from 0): a Trainer's dict of eval
    datasets writes one a set at each evaluation, always in one order."""
    places: dict[int, int] = {}
    keyed = {}
    for entry in lines:
        places[entry.step] = places.get(entry.step, -1) + 1
        keyed[(entry.step, places[entry.step])] = entry
    return keyed


def differing_fields(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys, sorted, whose values differ between two ledger lines' fields (a key one line
    lacks counts as null there)."""
    return tuple(sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)))


@dataclass(frozen=True)
class Ledger:
    """A run's ledger, split by kind; ``train[i]`` is optimizer step ``i + 1``.

    Attributes:
        path: the file read.
        init: the ``init`` line (LoRA weights before training), or None for an empty ledger.
        train: the ``train`` lines, steps 1, 2, ... in order.
        val: the ``val`` lines in file order.
        sha256: sha256 of the file's bytes.
    """

    path: Path
    init: LedgerEntry | None
    train: tuple[LedgerEntry, ...]
    val: tuple[LedgerEntry, ...]
    sha256: str
    lines: tuple[LedgerEntry, ...] = ()

    def entries(self) -> tuple[LedgerEntry, ...]:
        """Every line in file order."""
        return self.lines


def read_ledger(path: Path, *, repair: bool = False) -> Ledger:
    """Read ``ledger.jsonl`` and check every line against docs/run-directory.md.

    Args:
        path: the ledger file.
        repair: drop a partial last line (an append cut short by a crash) instead of refusing it.

    Returns:
        The checked ledger.

    Raises:
        InputError: naming the line (and column, for broken JSON) of the first problem: a partial
            last line (no newline after it), a blank or non-JSON line, an unknown ``kind``, a
            missing or ill-typed field, steps out of order.
    """
    return ledger_from_bytes(path, path.read_bytes(), repair=repair)


def ledger_from_bytes(path: Path, data: bytes, *, repair: bool) -> Ledger:
    """:func:`read_ledger` of ``data``, the bytes of ``path`` (or the first lines of them)."""
    lines = data.split(b"\n")
    if lines[-1] and repair:
        data = data[: len(data) - len(lines[-1])]
        lines[-1] = b""
    if lines[-1]:
        # Every line is written with its newline in one flush: bytes after the last newline are
        # an append cut short, even if they happen to parse.
        raise InputError(
            f"line {len(lines)} is incomplete (the file does not end with a newline): "
            "the run was interrupted mid-write or the file was truncated",
            source=f"{path}:{len(lines)}",
            fix=_LEDGER_FIX,
        )
    init: LedgerEntry | None = None
    train: list[LedgerEntry] = []
    val: list[LedgerEntry] = []
    entries = _parse_entries(path, lines[:-1])
    for entry in entries:
        number = entry.line
        where = f"{path}:{number}"
        if entry.kind == "init":
            if number != 1 or entry.step != 0:
                raise InputError(
                    f"the 'init' line must be line 1 with step 0, found on line {number} with "
                    f"step {entry.step}",
                    source=where,
                    fix=_LEDGER_FIX,
                )
            init = entry
            continue
        if init is None:
            raise InputError(
                f"line 1 is a {entry.kind!r} line; the ledger must start with its 'init' line",
                source=where,
                fix=_LEDGER_FIX,
            )
        if entry.kind == "train":
            expected = len(train) + 1
            if entry.step != expected:
                raise InputError(
                    f"train step {entry.step} where step {expected} was expected "
                    "(train steps run 1, 2, 3, ... with none missing or repeated)",
                    source=f"{where} (key 'step')",
                    fix=_LEDGER_FIX,
                )
            train.append(entry)
        else:
            if entry.step > len(train):
                raise InputError(
                    f"val line for step {entry.step} comes before train step {entry.step}",
                    source=f"{where} (key 'step')",
                    fix=_LEDGER_FIX,
                )
            val.append(entry)
    return Ledger(
        path=path,
        init=init,
        train=tuple(train),
        val=tuple(val),
        sha256=sha256_bytes(data),
        lines=tuple(entries),
    )


def _parse_entries(path: Path, lines: list[bytes]) -> list[LedgerEntry]:
    """Parse and check every ledger line, fast when all is well, precise when it is not.

    The fast path parses the whole file in one ``json.loads`` and checks each field's shape over
    all lines at once (one regular expression per shape). Anything it does not accept sends the
    ledger through the line-by-line path, which finds and names the first bad line.
    """
    try:
        objs = json.loads(b"[" + b",".join(lines) + b"]")
    except (json.JSONDecodeError, UnicodeDecodeError):
        objs = None
    # A line holding "1, 2" would add two items: the count guards the one-item-per-line mapping.
    if isinstance(objs, list) and len(objs) == len(lines) and _all_well_formed(objs):
        return [
            LedgerEntry(kind=obj["kind"], step=obj["step"], line=number, fields=obj)
            for number, obj in enumerate(objs, start=1)
        ]
    return [parse_entry(path, number, raw) for number, raw in enumerate(lines, start=1)]


# One pattern per shape, matched against all values of that shape joined by newlines.
_JOINED = {
    "sha256": re.compile(r"(?:[0-9a-f]{64}\n)*[0-9a-f]{64}"),
    "hexfloat": re.compile(rf"(?:(?:{_HEX_FLOAT.pattern})\n)*(?:{_HEX_FLOAT.pattern})"),
}


def _all_well_formed(objs: list[Any]) -> bool:
    """Whether every object has a known kind and every required field the right shape."""
    values: dict[str, list[Any]] = {"int": [], "sha256": [], "hexfloat": []}
    for obj in objs:
        if type(obj) is not dict:
            return False
        fields = _LEDGER_FIELDS.get(obj.get("kind"))  # type: ignore[arg-type]
        if fields is None:
            return False
        for key, shape in fields.items():
            if key not in obj:
                return False
            values[shape].append(obj[key])
        if RANK_BATCHES in obj and (obj["kind"] != "train" or _rank_batches_problem(obj[RANK_BATCHES])):
            return False
    if not all(type(v) is int and v >= 0 for v in values["int"]):
        return False
    for shape in ("sha256", "hexfloat"):
        strings = values[shape]
        if not strings:
            continue
        if not all(type(v) is str for v in strings):
            return False
        joined = "\n".join(strings)
        # A value holding a newline would pass as two: the count of separators rules that out.
        if joined.count("\n") != len(strings) - 1 or _JOINED[shape].fullmatch(joined) is None:
            return False
    return True


def parse_entry(path: Path, number: int, raw: bytes) -> LedgerEntry:
    """Parse and check one ledger line."""
    where = f"{path}:{number}"
    if not raw.strip():
        raise InputError(f"line {number} is blank", source=where, fix=_LEDGER_FIX)
    if b"\0" in raw:  # json.loads would take the bytes for UTF-32 and say so
        raise InputError(
            f"line {number} holds zero bytes (a block of zeros: what a crash can leave of a write)",
            source=where,
            fix=_LEDGER_FIX,
        )
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        column = f":{exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise InputError(
            f"line {number} is not valid JSON ({exc})", source=where + column, fix=_LEDGER_FIX
        ) from None
    if not isinstance(obj, dict):
        raise InputError(
            f"line {number} is a JSON {type(obj).__name__}, not an object", source=where, fix=_LEDGER_FIX
        )
    kind = obj.get("kind")
    if kind not in _LEDGER_FIELDS:
        raise InputError(
            f"line {number} has kind {kind!r}; expected one of {sorted(_LEDGER_FIELDS)}",
            source=f"{where} (key 'kind')",
            fix=_LEDGER_FIX,
        )
    for key, shape in _LEDGER_FIELDS[kind].items():
        if key not in obj:
            raise InputError(f"the {kind!r} line {number} has no key {key!r}", source=where, fix=_LEDGER_FIX)
        problem = _shape_problem(obj[key], shape)
        if problem:
            raise InputError(
                f"key {key!r} of the {kind!r} line {number} is {obj[key]!r}, {problem}",
                source=f"{where} (key {key!r})",
                fix=_LEDGER_FIX,
            )
    if RANK_BATCHES in obj:
        value = obj[RANK_BATCHES]
        problem = _rank_batches_problem(value) if kind == "train" else "only train lines carry it"
        if problem:
            raise InputError(
                f"key {RANK_BATCHES!r} of the {kind!r} line {number} is {value!r:.200}, {problem}",
                source=f"{where} (key {RANK_BATCHES!r})",
                fix=_LEDGER_FIX,
            )
    return LedgerEntry(kind=kind, step=obj["step"], line=number, fields=obj)


def _rank_batches_problem(value: Any) -> str | None:
    """Why ``value`` is not a non-empty list of sha256 digests, or None when it is."""
    if not isinstance(value, list) or not value:
        return "not a non-empty list of sha256 digests (one per rank)"
    bad = next((v for v in value if _shape_problem(v, "sha256")), None)
    return None if bad is None else f"holds {bad!r}, not a sha256 (64 lowercase hex digits)"


def _shape_problem(value: Any, shape: _FieldType) -> str | None:
    """Why ``value`` does not have ``shape``, or None when it does."""
    if shape == "int":
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return None if ok else "not a non-negative integer"
    if shape == "sha256":
        ok = isinstance(value, str) and _SHA256.fullmatch(value) is not None
        return None if ok else "not a sha256 (64 lowercase hex digits)"
    ok = isinstance(value, str) and _HEX_FLOAT.fullmatch(value) is not None
    return None if ok else "not a float written by float.hex() (like '0x1.8p-1')"
