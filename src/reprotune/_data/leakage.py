"""Leakage across splits: the normalised text of a row's leak columns found in two splits.

A row's text is its leak columns' texts together (a leak is a whole example in two splits).
Normalised: NFKC, case-folded, punctuation, symbols, separators and control characters made one
space, invisible format characters dropped; letters and their accent marks kept. A list or
mapping (chat ``messages``) counts by the strings inside it.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from reprotune._data.manifest import SPLITS, Manifest
from reprotune._data.table import Table
from reprotune._errors import InputError

#: A time of day: ``17:32``, ``9:05:00.123``, ``10:05 PM``.
_TIME = r"\d{1,2}:\d\d(?::\d\d(?:[.,]\d+)?)?(?:\s?(?i:[ap]\.?m\.?))?"
#: A time zone after a time: ``Z``, a named zone (``UTC``, ``GMT``, ``CEST``, ``UTC+1``) or an
#: offset (``+0000``, ``-05:00``).
_ZONE = r"(?:Z|[A-Z]{2,5}(?:[+-]\d{1,2}(?::?\d\d)?)?|[+-]\d\d:?\d\d)"
_MONTH = (
    r"(?i:(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?)"
)
_WEEKDAY = r"(?i:(?:mon|tues?|wed(?:nes)?|thu(?:rs?)?|fri|sat(?:ur)?|sun)(?:day)?\.?,?)"
#: A date: numeric in Y-M-D, Y/M/D, D/M/Y or M/D/Y order (with -, / or . between), or with the
#: month's name (RFC 2822's ``Mon, 06 Dec 2024``, ``Dec 6, 2024``).
_DATE = (
    r"(?:\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4}"
    rf"|(?:{_WEEKDAY}\s+)?\d{{1,2}}\s+{_MONTH}\s+\d{{2,4}}"
    rf"|(?:{_WEEKDAY}\s+)?{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}})"
)
#: A date, a time or both, with a zone or none; or C's ``ctime`` (``Fri Dec  6 17:32:00 2024``,
#: and ``date``'s ``Fri Dec  6 17:32:00 UTC 2024``).
_STAMP = (
    rf"(?:{_DATE}(?:(?:T|,?\s+){_TIME}(?:\s*{_ZONE})?)?|{_TIME}(?:\s*{_ZONE})?"
    rf"|{_WEEKDAY}\s+{_MONTH}\s+\d{{1,2}}\s+{_TIME}\s+(?:{_ZONE}\s+)?\d{{4}})"
)
#: A value that names or counts rather than says: an id, a uuid, a number, a label, an e-mail or
#: URL, a date or time stamp in a common shape (:data:`_STAMP`; written with spaces, it would
#: otherwise be taken for words). Text in a script written without spaces (Chinese, Japanese,
#: Thai) is none of these.
_NAMING = re.compile(rf"\s*(?:[A-Za-z0-9_.:/+@#%=?&~-]*|{_STAMP})\s*")


@functools.cache
def _separators() -> dict[int, str | None]:
    """Every punctuation, symbol, separator and control character to a space; format characters
    (zero-width spaces, soft hyphens) to nothing. Accent and vowel marks (M*) are letters' own: kept."""
    table: dict[int, str | None] = {}
    # planes 4-13 are unassigned, 15-16 private use: only planes 0-3 and 14 (tags) hold any
    for code in (*range(0x40000), *range(0xE0000, 0xE1000)):
        category = unicodedata.category(chr(code))
        if category[0] in "PSZ" or category == "Cc":
            table[code] = " "
        elif category == "Cf":
            table[code] = None
    return table


def normalize_text(text: str) -> str:
    """Text as leakage sees it: NFKC, case-folded, every run of punctuation, symbols, whitespace
    and control characters one space, format characters dropped; accents and vowel marks kept."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().translate(_separators()).split())


def _strings_in(value: Any) -> list[str]:
    """The strings a cell holds: itself, or those inside a list or a mapping's values (a chat's
    ``messages``), in order."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings_in(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings_in(v)]
    return []


def _cell_text(value: Any) -> str:
    """A cell's normalised text ("" when it holds none)."""
    return " ".join(filter(None, (normalize_text(s) for s in _strings_in(value))))


@dataclass(frozen=True)
class LeakExample:
    """A normalised text found in both splits of a pair, with the rows holding it in each."""

    text: str
    rows_a: tuple[int, ...]
    rows_b: tuple[int, ...]


@dataclass(frozen=True)
class Leak:
    """Texts shared by two splits: how many distinct texts, how many rows in each, examples."""

    split_a: str
    split_b: str
    n_texts: int
    n_rows_a: int
    n_rows_b: int
    examples: tuple[LeakExample, ...]


def default_leak_columns(manifest: Manifest, table: Table) -> list[str]:
    """The columns of text (a value that is more than a name or a number, in a string or inside a
    list or mapping, as chat ``messages``), except the stratify and group columns. A column whose
    every value names or counts (ids, uuids, numbers, one-word labels, dates and times) is left
    out: a unique id in the compared text would make every row unique, and no copy be found."""
    skip = {manifest.stratify_by, manifest.group_by}
    return [name for name in table.columns if name not in skip and _holds_free_text(table.column(name))]


def _holds_free_text(column: Any) -> bool:
    if isinstance(column, np.ndarray) and column.dtype.kind != "U":
        return False
    return any(not _NAMING.fullmatch(s) for value in column for s in _strings_in(value))


def refuse_textless(table: Table, columns: Sequence[str]) -> None:
    """A leak column named that holds no text anywhere compares nothing: refused, not "none"."""
    for name in columns:
        column = table.require_column(name, "--leak-columns")
        if not any(_strings_in(value) for value in column):
            raise InputError(
                f"leak column {name!r} (given by --leak-columns) holds no text: it would compare nothing",
                source=table.source,
                fix="name the columns whose text is the example, e.g. --leak-columns prompt,response",
            )


def _row_texts(table: Table, columns: Sequence[str], rows: np.ndarray) -> list[str]:
    data = [table.column(c) for c in columns]
    texts = []
    for i in rows.tolist():
        parts = [_cell_text(col[i]) for col in data]
        texts.append("\x1f".join(parts) if any(parts) else "")
    return texts


def find_leaks(
    manifest: Manifest, table: Table, columns: Sequence[str], n_examples: int, position: np.ndarray
) -> list[Leak]:
    """Texts in two splits, over each split's rows where they are in the data now (``position``:
    a manifest row's index now, -1 when removed; added rows are in no split). Rows are numbered
    as in the data checked."""
    by_split: dict[str, dict[str, list[int]]] = {}
    for name in SPLITS:
        rows = position[manifest.index_arrays[name]]
        rows = np.sort(rows[rows >= 0])  # rows removed since the split cannot leak
        groups: dict[str, list[int]] = {}
        for row, text in zip(rows.tolist(), _row_texts(table, columns, rows), strict=True):
            if text:
                groups.setdefault(text, []).append(row)
        by_split[name] = groups
    leaks = []
    for a, b in (("train", "validation"), ("train", "test"), ("validation", "test")):
        shared = by_split[a].keys() & by_split[b].keys()
        # Examples in a stable order: by the first row holding the text in the first split.
        ordered = sorted(shared, key=lambda t: (by_split[a][t][0], t))
        examples = tuple(
            LeakExample(t.replace("\x1f", " | "), tuple(by_split[a][t]), tuple(by_split[b][t]))
            for t in ordered[:n_examples]
        )
        leaks.append(
            Leak(
                a,
                b,
                len(shared),
                sum(len(by_split[a][t]) for t in shared),
                sum(len(by_split[b][t]) for t in shared),
                examples,
            )
        )
    return leaks
