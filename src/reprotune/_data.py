"""Tables: load JSONL, CSV, Parquet, the embedded dataset or a ``datasets.Dataset``; hash rows.

A :class:`Table` is columnar: each column is a NumPy array (numbers, booleans without nulls) or a
Python list (anything else), so a split of ten million rows never builds ten million dicts.

Two identities are defined here (docs/manifest.md states them for users):

- **row hash**: the sha256 of the row's canonical form, the UTF-8 bytes of
  ``json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=True)``
  where ``row`` maps every column of the table to the row's value (``null`` where a JSONL line
  lacks the key). Values outside JSON are first converted by :func:`canonical_value`.
- **file sha256**: for a file, the sha256 of every byte of it. For data that is not a file (the
  embedded dataset, a ``Dataset``, in-memory columns), the sha256 of the table's row-hash
  encoding (:meth:`RowHashes.to_bytes`): each row hash covers every byte of its row, and the
  encoding fixes their order, so the digest covers the whole table.

Row hashes are computed once per *distinct* row and gathered, which is exact (equal canonical
forms have equal hashes by definition) and makes a table of few distinct rows cheap to hash.
"""

from __future__ import annotations

import base64
import csv
import datetime as _dt
import decimal
import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from reprotune._builtin_data import BUILTIN_NAMES, BUILTIN_PREFIX, CHATTERBOT_EN, load_chatterbot_columns
from reprotune._errors import InputError
from reprotune._jsonio import canonical_dumps, sha256_bytes

if TYPE_CHECKING:
    import pyarrow as pa

Column = Union[np.ndarray, list[Any]]  # noqa: UP007 - a runtime alias, and Python 3.10 is supported

FORMATS = ("auto", "jsonl", "csv", "parquet")
_SUFFIX_FORMATS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
ROWHASH_MAGIC = "reprotune-rowhashes"
ROWHASH_VERSION = 1
_DIGEST = 32
# Integer columns whose value range is below this are factorized with bincount (linear time).
_BINCOUNT_RANGE = 1 << 22


def canonical_value(value: Any) -> Any:
    """Convert ``value`` to the JSON value it has in a row's canonical form.

    JSON values pass through (tuples become lists, dict keys become strings). NumPy scalars
    and arrays become their Python values. ``bytes`` become ``{"$bytes": "<base64>"}``; dates and
    times their ISO 8601 text; ``Decimal`` its ``str``. Floats keep ``NaN`` and ``Infinity``
    (hashed as those JSON extensions), so they are not confused with ``null``.

    Raises:
        TypeError: a value with no stated conversion.
    """
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, np.generic):
        return canonical_value(value.item())
    if isinstance(value, np.ndarray):
        return canonical_value(value.tolist())
    if isinstance(value, (list, tuple)):
        return [canonical_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): canonical_value(v) for k, v in value.items()}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"no canonical JSON form for a value of type {type(value).__name__}: {value!r}")


def canonical_row_bytes(row: Mapping[str, Any]) -> bytes:
    """The canonical form of a row: compact sorted-key JSON as UTF-8 (see the module docstring)."""
    text = json.dumps(
        {str(k): canonical_value(v) for k, v in row.items()},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
        allow_nan=True,  # a float NaN in the data is a value, not an error
    )
    # surrogatepass: a JSONL line may hold a lone surrogate escape, which is still a distinct value.
    return text.encode("utf-8", errors="surrogatepass")


def row_sha256(row: Mapping[str, Any]) -> str:
    """Hex sha256 of the canonical form of ``row``."""
    return hashlib.sha256(canonical_row_bytes(row)).hexdigest()


def _index_dtype(n_distinct: int) -> np.dtype[Any]:
    for dtype in (np.uint8, np.uint16, np.uint32):
        if n_distinct <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype).newbyteorder("<")
    return np.dtype(np.uint64).newbyteorder("<")


class RowHashes:
    """Per-row sha256 digests, dictionary-encoded: the distinct digests and, per row, which one.

    Args:
        digests: ``(k, 32)`` uint8 array of distinct digests, sorted ascending, no repeats.
        codes: ``(n,)`` unsigned array; row ``i`` has digest ``digests[codes[i]]``.
    """

    def __init__(self, digests: np.ndarray, codes: np.ndarray) -> None:
        self.digests = digests
        self.codes = codes

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    @classmethod
    def from_digests(cls, distinct: Sequence[bytes], row_codes: np.ndarray) -> RowHashes:
        """Build from (possibly unsorted, repeated) digests and row codes into them."""
        # Sorting by bytes makes the encoding independent of how the rows were factorized.
        keys = np.array([bytes(d) for d in distinct], dtype=f"S{_DIGEST}")
        uniq, inverse = np.unique(keys, return_inverse=True)
        digests = np.frombuffer(uniq.tobytes(), dtype=np.uint8).reshape(len(uniq), _DIGEST)
        dtype = _index_dtype(len(uniq))
        remap = inverse.astype(dtype)
        codes = remap[row_codes] if len(row_codes) else np.zeros(0, dtype=dtype)
        return cls(digests, codes.astype(dtype, copy=False))

    @classmethod
    def from_hex(cls, hexes: Sequence[str]) -> RowHashes:
        """Build from one hex digest per row."""
        index: dict[str, int] = {}
        codes = np.fromiter(
            (index.setdefault(h, len(index)) for h in hexes), dtype=np.int64, count=len(hexes)
        )
        return cls.from_digests([bytes.fromhex(h) for h in index], codes)

    def hex_list(self) -> list[str]:
        """One hex digest per row, in row order."""
        table = [bytes(row).hex() for row in self.digests]
        return [table[c] for c in self.codes.tolist()]

    def hex_at(self, i: int) -> str:
        """Hex digest of row ``i``."""
        return bytes(self.digests[int(self.codes[i])]).hex()

    def to_bytes(self) -> bytes:
        """The row-hash file layout (docs/manifest.md): a JSON header line, digests, row codes."""
        header = {
            "digest": "sha256",
            "format": ROWHASH_MAGIC,
            "index_bytes": int(self.codes.dtype.itemsize),
            "n_distinct": int(self.digests.shape[0]),
            "n_rows": len(self),
            "version": ROWHASH_VERSION,
        }
        head = canonical_dumps(header, indent=None).encode("utf-8")
        codes = self.codes.astype(self.codes.dtype.newbyteorder("<"), copy=False)
        return b"".join((head, self.digests.tobytes(), codes.tobytes()))

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str) -> RowHashes:
        """Parse the row-hash file layout.

        Raises:
            InputError: the bytes are not a row-hash file this version can read.
        """
        fix = "make the manifest again with `reprotune split`"
        end = data.find(b"\n")
        try:
            header = json.loads(data[: end + 1]) if end >= 0 else None
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("format") != ROWHASH_MAGIC:
            raise InputError("not a reprotune row-hash file (bad header line)", source=source, fix=fix)
        if header.get("version") != ROWHASH_VERSION:
            raise InputError(
                f"row-hash file version {header.get('version')!r} is not supported (this reads "
                f"{ROWHASH_VERSION})",
                source=source,
                fix="use the reprotune version that wrote it, or make the manifest again",
            )
        try:
            n_rows, k, width = int(header["n_rows"]), int(header["n_distinct"]), int(header["index_bytes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"row-hash header is missing a field: {exc}", source=source, fix=fix) from exc
        if width not in (1, 2, 4, 8) or end + 1 + k * _DIGEST + n_rows * width != len(data):
            raise InputError(
                f"row-hash file size {len(data)} does not match its header {header}", source=source, fix=fix
            )
        start = end + 1
        digests = np.frombuffer(data, dtype=np.uint8, count=k * _DIGEST, offset=start).reshape(k, _DIGEST)
        dtype = np.dtype(f"<u{width}")
        codes = np.frombuffer(data, dtype=dtype, count=n_rows, offset=start + k * _DIGEST)
        if n_rows and int(codes.max()) >= k:
            raise InputError("a row code points past the digest table", source=source, fix=fix)
        return cls(digests, codes)

    def sha256(self) -> str:
        """Hex sha256 of :meth:`to_bytes`."""
        return sha256_bytes(self.to_bytes())


def _smallest_codes(codes: np.ndarray, k: int) -> np.ndarray:
    return codes.astype(_index_dtype(k).newbyteorder("="), copy=False)


def factorize(column: Column) -> tuple[list[Any], np.ndarray]:
    """Distinct values of ``column`` and, per row, the position of its value among them.

    Two values are the same exactly when their canonical JSON is the same (so ``1`` and ``1.0``
    and ``True`` stay apart, and every NaN is one value). The order of the distinct values is an
    implementation detail; callers that need an order sort them by a stated key.

    Returns:
        ``(uniques, codes)``: Python values, and an unsigned array of length ``len(column)``.
    """
    if isinstance(column, np.ndarray) and column.ndim == 1 and column.dtype.kind in "biuf":
        return _factorize_numeric(column)
    if isinstance(column, np.ndarray) and column.ndim == 1 and column.dtype.kind in "US":
        uniq, inverse = np.unique(column, return_inverse=True)
        return uniq.tolist(), _smallest_codes(inverse, len(uniq))
    index: dict[Any, int] = {}
    uniques: list[Any] = []
    codes = np.empty(len(column), dtype=np.int64)
    for i, value in enumerate(column.tolist() if isinstance(column, np.ndarray) else column):
        # str is its own key; anything else is keyed by its canonical JSON, so 1, 1.0 and True
        # (equal in Python) stay distinct and unhashable lists work.
        key = value if type(value) is str else ("\0json", json.dumps(canonical_value(value), sort_keys=True))
        code = index.get(key)
        if code is None:
            code = index[key] = len(uniques)
            uniques.append(value)
        codes[i] = code
    return uniques, _smallest_codes(codes, len(uniques))


def _factorize_numeric(column: np.ndarray) -> tuple[list[Any], np.ndarray]:
    if column.size == 0:
        return [], np.zeros(0, dtype=np.uint8)
    if column.dtype.kind == "f":
        values = column.astype(np.float64)
        values = np.where(np.isnan(values), np.float64("nan"), values)  # one NaN bit pattern
        # By bits, so -0.0 and 0.0 (different JSON) stay apart.
        uniq_bits, inverse = np.unique(values.view(np.int64), return_inverse=True)
        return uniq_bits.view(np.float64).tolist(), _smallest_codes(inverse, len(uniq_bits))
    if column.dtype.kind == "b":
        as_int = column.astype(np.uint8)
        present = np.bincount(as_int, minlength=2) > 0
        lookup = np.cumsum(present) - 1
        return [bool(v) for v in np.flatnonzero(present)], _smallest_codes(lookup[as_int], int(present.sum()))
    lo, hi = int(column.min()), int(column.max())
    if hi - lo < _BINCOUNT_RANGE:
        # Linear time: the class columns of large tables are small integers.
        shifted = (column - lo).astype(np.intp) if lo else column.astype(np.intp, copy=False)
        present = np.bincount(shifted, minlength=hi - lo + 1) > 0
        lookup = np.cumsum(present) - 1
        k = int(present.sum())
        codes = _smallest_codes(lookup, k)[shifted]
        return [int(v) + lo for v in np.flatnonzero(present)], codes
    uniq, inverse = np.unique(column, return_inverse=True)
    return uniq.tolist(), _smallest_codes(inverse, len(uniq))


def _python_value(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


class Table:
    """A loaded dataset: named columns of equal length, where it came from, and its identity.

    Args:
        columns: column name -> NumPy array or list, all of the same length.
        source: where the data came from (a file path, ``builtin:...``, ``datasets.Dataset``).
        format: ``jsonl``, ``csv``, ``parquet``, ``builtin``, ``dataset`` or ``memory``.
        file_sha256: sha256 of the file's bytes; ``None`` for data that is not a file, whose
            identity is then the sha256 of its row-hash encoding.

    Raises:
        InputError: the columns differ in length.
    """

    def __init__(
        self,
        columns: Mapping[str, Column],
        *,
        source: str,
        format: str,
        file_sha256: str | None = None,
    ) -> None:
        lengths = {name: len(col) for name, col in columns.items()}
        if len(set(lengths.values())) > 1:
            raise InputError(
                f"columns differ in length: {lengths}",
                source=source,
                fix="give columns of equal length",
            )
        self._columns: dict[str, Column] = dict(columns)
        self.source = source
        self.format = format
        self._file_sha256 = file_sha256
        self.n_rows: int = next(iter(lengths.values())) if lengths else 0
        self._factorized: dict[str, tuple[list[Any], np.ndarray]] = {}

    @property
    def columns(self) -> list[str]:
        """Column names, in the order the source gave them."""
        return list(self._columns)

    def __len__(self) -> int:
        return self.n_rows

    def __repr__(self) -> str:
        return f"Table(source={self.source!r}, n_rows={self.n_rows}, columns={self.columns})"

    @property
    def file_sha256(self) -> str:
        """sha256 of the file's bytes, or of the row-hash encoding for data that is not a file."""
        if self._file_sha256 is None:
            self._file_sha256 = self.row_hash_table().sha256()
        return self._file_sha256

    @property
    def is_file(self) -> bool:
        """Whether the data came from a file (its identity is then the file's bytes)."""
        return self.format in ("jsonl", "csv", "parquet")

    def require_column(self, name: str, option: str) -> Column:
        """The column ``name``, or an error naming ``option``, the columns there are, and the fix.

        Raises:
            InputError: no such column.
        """
        if name not in self._columns:
            raise InputError(
                f"column {name!r} (given by {option}) does not exist; the columns are {self.columns}",
                source=self.source,
                fix=f"pass one of {self.columns} to {option}",
            )
        return self._columns[name]

    def column(self, name: str) -> Column:
        """The values of column ``name`` (a NumPy array or a list).

        Raises:
            InputError: no such column.
        """
        return self.require_column(name, "column()")

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as a dict of Python values, every column present.

        Raises:
            IndexError: ``i`` is out of range.
        """
        if not -self.n_rows <= i < self.n_rows:
            raise IndexError(f"row {i} out of range for a table of {self.n_rows} rows")
        return {name: _python_value(col[i]) for name, col in self._columns.items()}

    def factorize(self, name: str) -> tuple[list[Any], np.ndarray]:
        """:func:`factorize` of column ``name``, computed once per table."""
        if name not in self._factorized:
            self._factorized[name] = factorize(self.column(name))
        return self._factorized[name]

    def row_hashes(self) -> list[str]:
        """One hex sha256 per row, of the row's canonical form."""
        return self.row_hash_table().hex_list()

    def row_hash_table(self) -> RowHashes:
        """Per-row hashes, dictionary-encoded; computed once."""
        return self._row_hash_table

    @cached_property
    def _row_hash_table(self) -> RowHashes:
        names = self.columns
        if self.n_rows == 0:
            return RowHashes(np.zeros((0, _DIGEST), dtype=np.uint8), np.zeros(0, dtype=np.uint8))
        factors = [self.factorize(name) for name in names]
        if len(names) == 1:
            uniques, codes = factors[0]
            distinct = [hashlib.sha256(canonical_row_bytes({names[0]: value})).digest() for value in uniques]
            return RowHashes.from_digests(distinct, codes)
        key = np.zeros(self.n_rows, dtype=np.int64)
        span = 1
        for uniques, codes in factors:
            k = max(len(uniques), 1)
            if span * k >= 1 << 62:  # keep the combined key in int64: compress it first
                _, key = np.unique(key, return_inverse=True)
                span = int(key.max()) + 1
            key = key * k + codes
            span *= k
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        distinct = [hashlib.sha256(canonical_row_bytes(self.row(int(i)))).digest() for i in first]
        return RowHashes.from_digests(distinct, inverse)

    def canonical_rows(self, indices: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """The rows at ``indices`` as dicts of Python values."""
        return [self.row(int(i)) for i in indices]


def table_from_columns(columns: Mapping[str, Column | Sequence[Any]], *, source: str = "memory") -> Table:
    """A :class:`Table` over in-memory columns (lists or 1-D NumPy arrays), not copied.

    Its ``file_sha256`` is the sha256 of its row-hash encoding.

    Raises:
        InputError: the columns differ in length, or one is not 1-D.
    """
    cols: dict[str, Column] = {}
    for name, values in columns.items():
        if isinstance(values, np.ndarray):
            if values.ndim != 1:
                raise InputError(
                    f"column {name!r} has shape {values.shape}; columns are 1-D",
                    source=source,
                    fix="pass one 1-D array per column",
                )
            cols[str(name)] = values
        else:
            cols[str(name)] = list(values)
    return Table(cols, source=source, format="memory")


def _arrow_columns(table: pa.Table) -> dict[str, Column]:
    import pyarrow as pa

    cols: dict[str, Column] = {}
    for name in table.column_names:
        chunked = table.column(name)
        kind = chunked.type
        simple = pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
        if simple and chunked.null_count == 0:
            cols[name] = chunked.to_numpy()
        else:
            cols[name] = chunked.to_pylist()
    return cols


def table_from_dataset(dataset: Any, *, source: str = "datasets.Dataset") -> Table:
    """A :class:`Table` over the rows of a Hugging Face ``datasets.Dataset`` (in its current order).

    Its ``file_sha256`` is the sha256 of its row-hash encoding, so the same rows give the same
    identity whether they come from a ``Dataset``, the embedded corpus or memory.

    Raises:
        InputError: ``dataset`` is not a ``datasets.Dataset``.
    """
    if not (hasattr(dataset, "with_format") and hasattr(dataset, "column_names")):
        raise InputError(
            f"expected a datasets.Dataset, got {type(dataset).__name__}",
            source=source,
            fix="pass a datasets.Dataset (a DatasetDict must be indexed by split first)",
        )
    if len(dataset) == 0:
        return Table({name: [] for name in dataset.column_names}, source=source, format="dataset")
    arrow = dataset.with_format("arrow")[:]  # honours select/shuffle index mappings
    return Table(_arrow_columns(arrow), source=source, format="dataset")


def _check_format(format: str, source: str) -> None:
    if format not in FORMATS:
        raise InputError(
            f"unknown data format {format!r}",
            source=source,
            fix=f"use one of {list(FORMATS)}",
        )


def _detect_format(path: Path) -> str:
    fmt = _SUFFIX_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InputError(
            f"cannot tell the format of {path.name!r} from its extension {path.suffix!r}",
            source=str(path),
            fix=f"name the file with one of {sorted(_SUFFIX_FORMATS)} or pass --format jsonl|csv|parquet",
        )
    return fmt


def load_table(source: str, format: str = "auto") -> Table:
    """Load a JSONL, CSV or Parquet file, or the embedded dataset (``builtin:chatterbot-en``).

    Args:
        source: a file path or a builtin name.
        format: ``auto`` (from the file extension), ``jsonl``, ``csv`` or ``parquet``.

    Returns:
        The table; for a file, ``file_sha256`` is the sha256 of the exact bytes parsed.

    Raises:
        InputError: a missing file, an unknown format or builtin name, or malformed content
            (naming the line and column).

    Example:
        >>> table = load_table("builtin:chatterbot-en")
        >>> table.n_rows, table.columns
        (2026, ['prompt', 'response', 'category'])
    """
    source = str(source)
    if source.startswith(BUILTIN_PREFIX):
        if source != CHATTERBOT_EN:
            raise InputError(
                f"unknown builtin dataset {source!r}",
                source=source,
                fix=f"use one of {list(BUILTIN_NAMES)}",
            )
        return Table(load_chatterbot_columns(), source=source, format="builtin")
    _check_format(format, source)
    path = Path(source)
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise InputError(
            f"data file {source!r} {what}",
            source=source,
            fix=f"check the path (from {Path.cwd()}), or use {CHATTERBOT_EN}",
        )
    fmt = _detect_format(path) if format == "auto" else format
    if fmt == "parquet":
        return _load_parquet(path)
    data = path.read_bytes()
    digest = sha256_bytes(data)
    columns = _parse_jsonl(data, source) if fmt == "jsonl" else _parse_csv(data, source)
    return Table(columns, source=source, format=fmt, file_sha256=digest)


def _decode_line(raw: bytes, source: str, lineno: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"line {lineno} is not UTF-8 (byte {exc.start + 1}: {raw[exc.start : exc.start + 1]!r})",
            source=f"{source}:{lineno}:{exc.start + 1}",
            fix="save the file as UTF-8",
        ) from exc


def _parse_jsonl(data: bytes, source: str) -> dict[str, Column]:
    rows: list[dict[str, Any]] = []
    names: dict[str, None] = {}  # insertion-ordered set: columns in order of first appearance
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        text = _decode_line(raw, source, lineno)
        if not text.strip():
            continue  # blank lines (a trailing newline, spacing) hold no row
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"line {lineno} is not valid JSON: {exc.msg} (line {lineno}, column {exc.colno}): "
                f"{text[:80]!r}",
                source=f"{source}:{lineno}:{exc.colno}",
                fix="make every non-blank line one JSON object",
            ) from exc
        if not isinstance(row, dict):
            raise InputError(
                f"line {lineno} is a JSON {type(row).__name__}, not an object: {text[:80]!r}",
                source=f"{source}:{lineno}:1",
                fix='make every non-blank line one JSON object such as {"prompt": ..., "response": ...}',
            )
        for key in row:
            names.setdefault(key, None)
        rows.append(row)
    return {name: [row.get(name) for row in rows] for name in names}


def _parse_csv(data: bytes, source: str) -> dict[str, Column]:
    # Decode per line first, so a bad byte is reported with its line.
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        for lineno, raw in enumerate(data.split(b"\n"), start=1):
            _decode_line(raw, source, lineno)
        raise
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        return {}
    except csv.Error as exc:
        raise InputError(f"bad CSV header: {exc}", source=f"{source}:1", fix="fix the header row") from exc
    seen: dict[str, int] = {}
    for position, name in enumerate(header, start=1):
        if not name or name in seen:
            problem = "is empty" if not name else f"repeats column {seen[name]}"
            raise InputError(
                f"header column {position} ({name!r}) {problem}",
                source=f"{source}:1:{position}",
                fix="give every column a distinct, non-empty name in the first row",
            )
        seen[name] = position
    values: list[list[str]] = [[] for _ in header]
    try:
        for record in reader:
            if not record:
                continue
            if len(record) != len(header):
                raise InputError(
                    f"line {reader.line_num} has {len(record)} fields; the header has {len(header)}",
                    source=f"{source}:{reader.line_num}",
                    fix="quote fields that contain commas, and give every row one value per column",
                )
            for column, value in zip(values, record, strict=True):
                column.append(value)
    except csv.Error as exc:
        raise InputError(
            f"line {reader.line_num} is not valid CSV: {exc}",
            source=f"{source}:{reader.line_num}",
            fix="check the quoting on that line",
        ) from exc
    return dict(zip(header, values, strict=True))


def _load_parquet(path: Path) -> Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = path.read_bytes()
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(
            f"not a readable Parquet file: {exc}",
            source=str(path),
            fix="check that the file is Parquet, or pass --format for its real format",
        ) from exc
    return Table(_arrow_columns(table), source=str(path), format="parquet", file_sha256=sha256_bytes(data))
