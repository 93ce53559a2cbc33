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
import datetime as _dt
import decimal
import hashlib
import json
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any, Union

import numpy as np

from reprotune._data.row_hashes import DIGEST_SIZE, RowHashes, smallest_codes
from reprotune._errors import InputError

Column = Union[np.ndarray, list[Any]]  # noqa: UP007 - a runtime alias, and Python 3.10 is supported

# Integer columns whose value range is below this are factorized with bincount (linear time).
_BINCOUNT_RANGE = 1 << 22


class NoCanonicalForm(TypeError):
    """A value :func:`canonical_value` has no stated conversion for (a duration, an interval)."""

    def __init__(self, value: Any) -> None:
        super().__init__(f"no canonical JSON form for a value of type {type(value).__name__}: {value!r}")
        self.value = value


def canonical_value(value: Any) -> Any:
    """Convert ``value`` to the JSON value it has in a row's canonical form.

    JSON values pass through (tuples become lists, dict keys become strings). NumPy scalars
    and arrays become their Python values. ``bytes`` become ``{"$bytes": "<base64>"}``; dates and
    times their ISO 8601 text; ``Decimal`` its ``str``. Floats keep ``NaN`` and ``Infinity``
    (hashed as those JSON extensions), so they are not confused with ``null``.

    Raises:
        NoCanonicalForm: a value with no stated conversion (a ``TypeError``).
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
    raise NoCanonicalForm(value)


def not_text(value: Any) -> str:
    """What a field that should hold text holds instead, in JSON's words, for messages:
    ``"missing"`` for None, else e.g. ``"a number (3), not text"``."""
    if value is None:
        return "missing"
    if isinstance(value, bool):
        kind = f"a boolean ({str(value).lower()})"
    elif isinstance(value, (int, float)):
        kind = f"a number ({value!r})"
    elif isinstance(value, Mapping):
        kind = "an object"
    elif isinstance(value, (list, tuple)):
        kind = "a list"
    else:
        kind = f"a {type(value).__name__}"
    return f"{kind}, not text"


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
        return uniq.tolist(), smallest_codes(inverse, len(uniq))
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
    return uniques, smallest_codes(codes, len(uniques))


def _factorize_numeric(column: np.ndarray) -> tuple[list[Any], np.ndarray]:
    if column.size == 0:
        return [], np.zeros(0, dtype=np.uint8)
    if column.dtype.kind == "f":
        values = column.astype(np.float64)
        values = np.where(np.isnan(values), np.float64("nan"), values)  # one NaN bit pattern
        # By bits, so -0.0 and 0.0 (different JSON) stay apart.
        uniq_bits, inverse = np.unique(values.view(np.int64), return_inverse=True)
        return uniq_bits.view(np.float64).tolist(), smallest_codes(inverse, len(uniq_bits))
    if column.dtype.kind == "b":
        as_int = column.astype(np.uint8)
        present = np.bincount(as_int, minlength=2) > 0
        lookup = np.cumsum(present) - 1
        return [bool(v) for v in np.flatnonzero(present)], smallest_codes(lookup[as_int], int(present.sum()))
    lo, hi = int(column.min()), int(column.max())
    if hi - lo < _BINCOUNT_RANGE:
        # Linear time: the class columns of large tables are small integers.
        shifted = (column - lo).astype(np.intp) if lo else column.astype(np.intp, copy=False)
        present = np.bincount(shifted, minlength=hi - lo + 1) > 0
        lookup = np.cumsum(present) - 1
        k = int(present.sum())
        codes = smallest_codes(lookup, k)[shifted]
        return [int(v) + lo for v in np.flatnonzero(present)], codes
    uniq, inverse = np.unique(column, return_inverse=True)
    return uniq.tolist(), smallest_codes(inverse, len(uniq))


def _has_no_canonical_form(value: Any) -> bool:
    try:
        canonical_value(value)
    except NoCanonicalForm:
        return True
    return False


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
        """:func:`factorize` of column ``name``, computed once per table.

        Raises:
            InputError: the column holds a value with no canonical form (a Parquet duration),
                naming the column, the first such row and the fix.
        """
        if name not in self._factorized:
            column = self.column(name)
            try:
                self._factorized[name] = factorize(column)
            except NoCanonicalForm as exc:
                raise self._no_canonical_form(name, column, exc) from None
        return self._factorized[name]

    def _no_canonical_form(self, name: str, column: Column, exc: NoCanonicalForm) -> InputError:
        """The refusal of a column whose values have no row-hash form: its first such row named."""
        row = next(i for i, value in enumerate(column) if _has_no_canonical_form(value))
        shown = repr(exc.value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return InputError(
            f"column {name!r} holds a {type(exc.value).__name__} ({shown}), first in row {row}, which "
            "has no JSON form to hash the row by",
            source=f"{self.source}, column {name!r}",
            fix="cast it to text or a number (a duration to its seconds, say) before splitting, or drop "
            "the column",
        )

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
            return RowHashes(np.zeros((0, DIGEST_SIZE), dtype=np.uint8), np.zeros(0, dtype=np.uint8))
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
