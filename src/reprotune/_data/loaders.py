"""Loading tables: JSONL, CSV, Parquet, the embedded dataset, a ``datasets.Dataset``, in-memory columns.

Every loader gives a :class:`reprotune._data.table.Table`; malformed input is an ``InputError``
naming the file, line and column.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from reprotune._builtins import BUILTIN_PREFIX
from reprotune._data.builtin import BUILTIN_NAMES, CHATTERBOT_EN, load_chatterbot_columns
from reprotune._data.table import Column, Table
from reprotune._errors import InputError
from reprotune._jsonio import path_kind, sha256_bytes

if TYPE_CHECKING:
    import pyarrow as pa


FORMATS = ("auto", "jsonl", "csv", "parquet")
_SUFFIX_FORMATS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}


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


CLI_FORMAT = "pass --format jsonl|csv|parquet"
CONFIG_FORMAT = "set data.format (jsonl, csv or parquet) in the config"


def _detect_format(path: Path, format_fix: str | None) -> str:
    fmt = _SUFFIX_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InputError(
            f"cannot tell the format of {path.name!r} from its extension {path.suffix!r}",
            source=str(path),
            fix=f"name the file with one of {sorted(_SUFFIX_FORMATS)}"
            + (f" or {format_fix}" if format_fix else ""),
        )
    return fmt


def load_table(source: str, format: str = "auto", *, format_fix: str | None = CLI_FORMAT) -> Table:
    """Load a JSONL, CSV or Parquet file, or the embedded dataset (``builtin:chatterbot-en``).

    Args:
        source: a file path or a builtin name.
        format: ``auto`` (from the file extension), ``jsonl``, ``csv`` or ``parquet``.
        format_fix: how the caller's user gives the format when the extension does not tell it
            (:data:`CLI_FORMAT`, :data:`CONFIG_FORMAT`; None: there is no way, rename the file).

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
    kind = path_kind(path)
    if kind != "file":
        what = "does not exist" if kind == "missing" else f"is a {kind}, not a data file"
        inside = ""
        if kind == "directory":
            found = sorted(p.name for p in path.iterdir() if p.suffix.lower() in _SUFFIX_FORMATS)
            inside = f"; in it: {', '.join(found[:3])}" if found else ""
        raise InputError(
            f"data file {source!r} {what}",
            source=source,
            fix=f"give a JSONL, CSV or Parquet file{inside} (paths are relative to {Path.cwd()}), "
            f"or use {CHATTERBOT_EN}",
        )
    fmt = _detect_format(path, format_fix) if format == "auto" else format
    implied = _SUFFIX_FORMATS.get(path.suffix.lower())
    if implied is not None and implied != fmt:
        raise InputError(
            f"format {fmt!r} was asked for {path.name!r}, whose extension {path.suffix!r} says {implied}",
            source=source,
            fix=f"leave the format as auto (or give {implied}); a file in another format needs its extension",
        )
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
        if lineno == 1:
            text = text.removeprefix("\ufeff")  # a byte order mark (Notepad's) is no content
        if not text.strip():
            continue  # blank lines (a trailing newline, spacing) hold no row
        try:
            row = json.loads(text)
            if isinstance(row, dict) and len(_KEY.findall(text)) != len(row):  # nested, or repeated
                json.loads(text, object_pairs_hook=_refuse_repeated_keys)
            if text.count("[") + text.count("{") > MAX_DEPTH and _depth(row) > MAX_DEPTH:
                raise RecursionError
        except RecursionError:
            raise InputError(
                f"line {lineno} nests values more than {MAX_DEPTH} levels deep",
                source=f"{source}:{lineno}",
                fix="make every line one flat JSON object of columns (values nest a few levels at most)",
            ) from None
        except _RepeatedKey as exc:
            raise InputError(
                f"line {lineno} gives key {exc.key!r} twice: JSON keeps only the last value, so the "
                "first would be lost without a word",
                source=f"{source}:{lineno}",
                fix=f"keep one {exc.key!r} in that object (or rename one)",
            ) from None
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
        if "\\u" in text and (column := _surrogate_column(row)) is not None:
            raise InputError(
                f"line {lineno}, column {column!r} holds a lone UTF-16 surrogate (a \\ud800-\\udfff "
                "escape that is half a character): no text can be hashed, tokenized or written with it",
                source=f"{source}:{lineno}",
                fix="write the character itself, or its full surrogate pair (e.g. \\ud83d\\ude00)",
            )
        for key in row:
            names.setdefault(key, None)
        rows.append(row)
    if rows and not names:
        raise InputError(
            f"every one of the {len(rows)} rows is an empty object {{}}: no row holds a column",
            source=source,
            fix='give each row its columns, e.g. {"prompt": ..., "response": ...}',
        )
    return {name: [row.get(name) for row in rows] for name in names}


#: Where a key ends (a string, then its colon): never fewer than the keys of a line's objects.
_KEY = re.compile(r'"\s*:')


class _RepeatedKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s object hook: the object, or :class:`_RepeatedKey` for a key given twice."""
    row: dict[str, Any] = {}
    for key, value in pairs:
        if key in row:
            raise _RepeatedKey(key)
        row[key] = value
    return row


def _surrogate_column(row: dict[str, Any]) -> str | None:
    """The first column of ``row`` whose name or value holds a lone surrogate, or None."""
    for key, value in row.items():
        stack: list[Any] = [key, value]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                if not item.isascii() and any("\ud800" <= ch <= "\udfff" for ch in item):
                    return key
            elif isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
    return None


#: Deepest nesting of lists and objects accepted in a JSONL value (rows are hashed recursively).
MAX_DEPTH = 100


def _depth(value: Any) -> int:
    """How deep lists and dicts nest in ``value`` (a scalar is 0), without recursion."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level + 1)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


#: The longest CSV field read (characters): 16 Mi, where Python's csv stops at 128 Ki.
MAX_CSV_FIELD = 16 << 20


def _parse_csv(data: bytes, source: str) -> dict[str, Column]:
    # Decode per line first, so a bad byte is reported with its line.
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        for lineno, raw in enumerate(data.split(b"\n"), start=1):
            _decode_line(raw, source, lineno)
        raise
    # Python's csv refuses fields over 131,072 characters by default; a long document or a base64
    # image in one field is data, so the limit is the one reprotune states (process-wide, raised
    # only).
    csv.field_size_limit(max(csv.field_size_limit(), MAX_CSV_FIELD))
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        return {}
    except csv.Error as exc:
        raise InputError(f"bad CSV header: {exc}", source=f"{source}:1", fix="fix the header row") from exc
    if not header:
        raise InputError(
            "line 1, the header, is empty",
            source=f"{source}:1",
            fix="put the column names on the first line (remove the blank line above them)",
        )
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
    last_start = 1
    try:
        while True:
            start = reader.line_num + 1
            record = next(reader, None)
            if record is None:
                break
            last_start = start
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
        if "field larger than field limit" in str(exc):
            raise InputError(
                f"line {reader.line_num} has a field over {csv.field_size_limit()} characters",
                source=f"{source}:{reader.line_num}",
                fix="keep each field under that (a long text is fine; a whole file in one cell is not), "
                "or use JSONL",
            ) from exc
        raise InputError(
            f"line {reader.line_num} is not valid CSV: {exc}",
            source=f"{source}:{reader.line_num}",
            fix="check the quoting on that line",
        ) from exc
    opened = _unclosed_quote_line(text, last_start)
    if opened is not None:
        raise InputError(
            f"the quote opened on line {opened} is never closed: the rest of the file would be one value",
            source=f"{source}:{opened}",
            fix='close the quote on that line (write a quote inside a quoted field as "")',
        )
    return dict(zip(header, values, strict=True))


def _unclosed_quote_line(text: str, start_line: int) -> int | None:
    """The line where a quoted field of the record starting at ``start_line`` opens and never
    closes (the csv module reads such a field to the end of the file silently), or None.

    Only the last record can hold one (it swallows everything after it), so only its text is
    scanned.
    """
    # The start of line ``start_line`` is after its (start_line - 1)-th newline: found from the
    # end, so a file of millions of lines costs a few steps, not one per line.
    at = len(text)
    for _ in range(text.count("\n") - (start_line - 1) + 1):
        at = text.rfind("\n", 0, at)
        if at < 0:
            break
    tail = text[at + 1 :] if start_line > 1 else text
    in_quote, field_start, opened = False, True, 0
    i = 0
    while i < len(tail):
        char = tail[i]
        if in_quote:
            if char == '"':
                if tail.startswith('""', i):
                    i += 2
                    continue
                in_quote = False
        elif char == '"' and field_start:
            in_quote, opened = True, i
        field_start = not in_quote and char in ",\r\n"
        i += 1
    return start_line + tail.count("\n", 0, opened) if in_quote else None


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
