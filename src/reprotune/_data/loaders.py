"""Loading tables: JSONL, CSV, Parquet, the embedded dataset, a ``datasets.Dataset``, in-memory columns.

Every loader gives a :class:`reprotune._data.table.Table`; malformed input is an ``InputError``
naming the file, line and column.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from reprotune._builtins import BUILTIN_PREFIX
from reprotune._data.builtin import BUILTIN_NAMES, CHATTERBOT_EN, load_chatterbot_columns
from reprotune._data.jsonl import decode_line, parse_jsonl
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
        InputError: a missing file, an unknown format or builtin name, a format that
            contradicts the file's extension or is given for builtin data, or malformed content
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
        _check_format(format, source)
        if format != "auto":
            raise InputError(
                f"format {format!r} was asked for {source}, which is the embedded dataset, not a file",
                source=source,
                fix="leave the format as auto for builtin data (a format is for a file whose extension "
                "says none)",
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
    columns = parse_jsonl(data, source) if fmt == "jsonl" else _parse_csv(data, source)
    return Table(columns, source=source, format=fmt, file_sha256=digest)


#: The longest CSV field read (characters): 16 Mi, where Python's csv stops at 128 Ki.
MAX_CSV_FIELD = 16 << 20


def _parse_csv(data: bytes, source: str) -> dict[str, Column]:
    # Decode per line first, so a bad byte is reported with its line.
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        for lineno, raw in enumerate(data.split(b"\n"), start=1):
            decode_line(raw, source, lineno)
        raise
    # Python's csv refuses fields over 131,072 characters by default; a long document or a base64
    # image in one field is data, so the limit is the one reprotune states (process-wide, raised
    # only).
    csv.field_size_limit(max(csv.field_size_limit(), MAX_CSV_FIELD))
    lines = _NewlineCounted(text)
    reader = csv.reader(lines)
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
            start = lines.next_line
            record = next(reader, None)
            if record is None:
                break
            last_start = start
            if not record:
                continue
            if len(record) != len(header):
                raise InputError(
                    f"line {lines.line} has {len(record)} fields; the header has {len(header)}",
                    source=f"{source}:{lines.line}",
                    fix="quote fields that contain commas, and give every row one value per column",
                )
            for column, value in zip(values, record, strict=True):
                column.append(value)
    except csv.Error as exc:
        if "field larger than field limit" in str(exc):
            raise InputError(
                f"line {lines.line} has a field over {csv.field_size_limit()} characters",
                source=f"{source}:{lines.line}",
                fix="keep each field under that (a long text is fine; a whole file in one cell is not), "
                "or use JSONL",
            ) from exc
        raise InputError(
            f"line {lines.line} is not valid CSV: {exc}",
            source=f"{source}:{lines.line}",
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


class _NewlineCounted:
    """``csv.reader``'s input: the text's lines as Python's csv splits them (at ``\\r``, ``\\n`` and
    ``\\r\\n``, so a file with old Mac line ends still reads), numbered as editors and
    :func:`_unclosed_quote_line` number them, at ``\\n`` only. ``reader.line_num`` counts a bare
    ``\\r`` inside a quoted field as a line: a valid file was refused and errors named later lines.
    """

    def __init__(self, text: str) -> None:
        self._text = text
        self.line = 0  # the line of the last piece read (a piece holds no \n but at its end)
        self.next_line = 1  # the line of the next piece

    def __iter__(self) -> Iterator[str]:
        # a generator, not __next__: a method call per line cost 40% of csv's own reading time
        for piece in io.StringIO(self._text, newline=""):
            self.line = self.next_line
            if piece[-1] == "\n":  # a piece is never empty
                self.next_line += 1
            yield piece


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
