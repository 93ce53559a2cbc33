"""Open a run directory for reading: its record, its ledger (every line checked), manifest, adapter.

This is the read side of the format in docs/run-directory.md, used by ``compare`` and ``report``.
It never imports torch: adapters are read with ``safetensors.numpy``. Nothing malformed is
tolerated silently: a bad or partial ledger line, an unknown record schema or a missing file is an
``InputError`` that names the file, the line and what to do.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from reprotune._errors import InputError
from reprotune._jsonio import sha256_bytes, sha256_file

RECORD_FILE = "record.json"
LEDGER_FILE = "ledger.jsonl"
MANIFEST_FILE = "split.json"
ADAPTER_FILE = Path("adapter") / "adapter_model.safetensors"

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
_LEDGER_FIX = (
    "the ledger was truncated or edited by hand; restore the run directory from a copy, "
    "or reproduce the run with `reprotune rerun RUN_DIR`"
)


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


@dataclass(frozen=True)
class SplitManifest:
    """What compare needs from a split manifest (``split.json``, docs/manifest.md).

    Attributes:
        path: the manifest file.
        sha256: sha256 of its bytes.
        splits: split name -> the dataset row indices in it, in manifest order.
        row_hashes: one content hash per dataset row (index -> hash).
        file_sha256: the dataset's sha256 as the manifest records it.
        n_rows: the dataset's row count.
    """

    path: Path
    sha256: str
    splits: Mapping[str, tuple[int, ...]]
    row_hashes: tuple[str, ...]
    file_sha256: str
    n_rows: int


@dataclass(frozen=True)
class RunDir:
    """An opened run directory.

    Attributes:
        path: the directory.
        record: ``record.json`` as a JSON object (validated by ``reprotune._record``).
        ledger: the checked ledger.
        manifest: the split manifest, or None when the directory has no ``split.json``.
        adapter_path: ``adapter/adapter_model.safetensors``, or None when it is missing
            (a run that failed before saving it).
    """

    path: Path
    record: Mapping[str, Any]
    ledger: Ledger
    manifest: SplitManifest | None
    adapter_path: Path | None

    @property
    def run_id(self) -> str:
        """The record's ``run_id``, or the directory name when the record has none."""
        value = self.record.get("run_id")
        return value if isinstance(value, str) and value else self.path.name

    @property
    def status(self) -> str:
        """The record's ``status`` (``running``, ``completed``, ``failed``), or ``unknown``."""
        value = self.record.get("status")
        return value if isinstance(value, str) else "unknown"

    def section(self, key: str) -> Mapping[str, Any]:
        """A top-level record section (``config``, ``seeds``, ...); empty when absent."""
        value = self.record.get(key)
        return value if isinstance(value, Mapping) else {}


def open_run_dir(path: str | Path) -> RunDir:
    """Open and check the run directory at ``path``.

    Args:
        path: a directory written by ``reprotune run`` (``runs/<run-id>/``).

    Returns:
        The record, ledger, manifest and adapter path, every one checked.

    Raises:
        InputError: ``path`` is not a run directory, or a file in it is missing or malformed
            (the message names the file, the line and the fix).
        SchemaVersionError: ``record.json`` is not a ``reprotune/record`` of schema version 1.
    """
    root = Path(path)
    _check_is_run_dir(root)
    record = load_record_json(root / RECORD_FILE)
    ledger_path = root / LEDGER_FILE
    if not ledger_path.is_file():
        raise InputError(
            f"the run directory has no {LEDGER_FILE}",
            source=str(root),
            fix="a run writes its ledger from the first step; copy the whole run directory, "
            "or rerun it with `reprotune rerun`",
        )
    ledger = read_ledger(ledger_path)
    manifest_path = root / MANIFEST_FILE
    manifest = read_manifest(manifest_path) if manifest_path.is_file() else None
    adapter = root / ADAPTER_FILE
    return RunDir(
        path=root,
        record=record,
        ledger=ledger,
        manifest=manifest,
        adapter_path=adapter if adapter.is_file() else None,
    )


def _check_is_run_dir(root: Path) -> None:
    """Raise an InputError saying what ``root`` is instead, when it is not a run directory."""
    fix = "pass the directory `reprotune run` wrote, e.g. runs/<run-id>/, which holds record.json"
    if not root.exists():
        raise InputError(f"no such directory: {root}", fix=fix)
    if not root.is_dir():
        raise InputError(f"{root} is a file, not a run directory", fix=fix)
    if (root / RECORD_FILE).is_file():
        return
    # A common slip is passing runs/ itself: name the run directories found inside.
    inside = sorted(p.name for p in root.iterdir() if (p / RECORD_FILE).is_file())
    if inside:
        shown = ", ".join(str(root / name) for name in inside[:3])
        fix = f"pass one of the run directories inside it, e.g. {shown}"
    raise InputError(f"{root} is not a run directory: it has no {RECORD_FILE}", fix=fix)


def load_record_json(path: Path) -> dict[str, Any]:
    """Read ``record.json``, validated against the record schema (``reprotune._record``).

    Args:
        path: the record file.

    Returns:
        The record as a JSON object, exactly as on disk.

    Raises:
        InputError: the file is unreadable, not JSON (with line and column) or not a valid record.
        SchemaVersionError: ``schema`` is not ``reprotune/record`` or ``schema_version`` is not 1.
    """
    from reprotune._record import load_record

    return load_record(path)


def read_ledger(path: Path) -> Ledger:
    """Read ``ledger.jsonl`` and check every line against docs/run-directory.md.

    Args:
        path: the ledger file.

    Returns:
        The checked ledger.

    Raises:
        InputError: naming the line (and column, for broken JSON) of the first problem: a partial
            last line (no newline after it), a blank or non-JSON line, an unknown ``kind``, a
            missing or ill-typed field, steps out of order.
    """
    data = path.read_bytes()
    lines = data.split(b"\n")
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
    for entry in _parse_entries(path, lines[:-1]):
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
    return Ledger(path=path, init=init, train=tuple(train), val=tuple(val), sha256=sha256_bytes(data))


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
    return [_parse_entry(path, number, raw) for number, raw in enumerate(lines, start=1)]


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


def _parse_entry(path: Path, number: int, raw: bytes) -> LedgerEntry:
    """Parse and check one ledger line."""
    where = f"{path}:{number}"
    if not raw.strip():
        raise InputError(f"line {number} is blank", source=where, fix=_LEDGER_FIX)
    try:
        obj = json.loads(raw)
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
    return LedgerEntry(kind=kind, step=obj["step"], line=number, fields=obj)


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


def read_manifest(path: Path) -> SplitManifest:
    """Read the parts of a split manifest that compare needs, validated by ``load_manifest``.

    Args:
        path: the manifest file (``split.json``); a row-hash sidecar it names is read too.

    Returns:
        The split indices (``dropped`` included), one content hash per row, dataset hash and size.

    Raises:
        InputError: the manifest or its sidecar is missing, malformed or inconsistent.
        SchemaVersionError: a manifest schema version this reprotune cannot read.
    """
    from reprotune._manifest import LISTS, load_manifest

    manifest = load_manifest(path)
    return SplitManifest(
        path=path,
        sha256=sha256_file(path),
        splits={name: tuple(manifest.index_arrays[name].tolist()) for name in LISTS},
        row_hashes=tuple(manifest.row_hashes.hex_list()),
        file_sha256=manifest.dataset_sha256,
        n_rows=manifest.n_rows,
    )


def load_adapter(path: Path) -> dict[str, np.ndarray]:
    """The adapter's tensors as numpy arrays (bfloat16 widened to float32), by name.

    Args:
        path: an ``adapter_model.safetensors`` file.

    Raises:
        InputError: the file is not a readable safetensors file.
    """
    from safetensors.numpy import load_file

    try:
        return dict(load_file(str(path)))
    except TypeError:
        # numpy has no bfloat16, so safetensors.numpy refuses it: widen by hand (exact).
        return _load_safetensors_widening(path)
    except Exception as exc:  # safetensors raises its own error types for a broken file
        raise InputError(
            f"cannot read the adapter: {exc}",
            source=str(path),
            fix="restore adapter/ from a copy of the run directory",
        ) from None


def _load_safetensors_widening(path: Path) -> dict[str, np.ndarray]:
    """Read a safetensors file whose dtypes numpy lacks (BF16), widening them to float32."""
    dtypes = {
        "F64": np.float64,
        "F32": np.float32,
        "F16": np.float16,
        "I64": np.int64,
        "I32": np.int32,
        "I16": np.int16,
        "I8": np.int8,
        "U8": np.uint8,
        "BOOL": np.bool_,
    }
    data = path.read_bytes()
    try:
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + size])
    except (struct.error, ValueError) as exc:
        raise InputError(f"not a safetensors file ({exc})", source=str(path)) from None
    body = data[8 + size :]
    tensors: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        chunk = body[start:end]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(chunk, dtype="<u2").astype(np.uint32) << 16
            array = bits.view(np.float32)
        elif info["dtype"] in dtypes:
            array = np.frombuffer(chunk, dtype=np.dtype(dtypes[info["dtype"]]).newbyteorder("<"))
        else:
            raise InputError(
                f"tensor {name!r} has dtype {info['dtype']}, which compare cannot read", source=str(path)
            )
        tensors[name] = array.reshape(info["shape"])
    return tensors


def adapter_sha256(run: RunDir) -> str | None:
    """sha256 of the run's adapter file, or None when it has none."""
    return sha256_file(run.adapter_path) if run.adapter_path else None
