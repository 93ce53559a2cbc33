"""Check data against a split manifest: is it the same data, which rows changed, is there leakage.

Rows are compared by their content hashes (see :mod:`reprotune._data.table`), never by re-running the
split. Two files with the same rows but different bytes (reformatted JSON, reordered keys,
another format) are reported as a change in formatting only.

Leakage is checked on the data as it is now, at the manifest's indices: rows whose normalised
text (NFKC, case-folded, punctuation, symbols, separators and control characters made one space,
invisible format characters dropped; letters and their accent marks kept) is the same in two
splits, reported per split pair with counts and examples.
"""

from __future__ import annotations

import difflib
import functools
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from reprotune._data.manifest import LISTS, SPLITS, Manifest
from reprotune._data.row_hashes import RowHashes
from reprotune._data.table import Table
from reprotune._errors import InputError
from reprotune._jsonio import canonical_dumps

ChangeKind = Literal["edited", "added", "removed"]
# Rows differing in a stretch longer than this (after the common head and tail) are compared
# position by position rather than aligned, which would be quadratic.
_ALIGN_LIMIT = 5000
_ID_DIGITS = 12
_INNER_SPACE = re.compile(r"\S\s+\S")


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
class RowChange:
    """One changed row. ``index`` is its position in the manifest's data, ``new_index`` in the data
    checked; ``split`` is where the manifest put it (``none`` for an added row); ids are the
    first 12 hex digits of the row hash before and after."""

    kind: ChangeKind
    index: int | None
    new_index: int | None
    split: str
    old_id: str | None
    new_id: str | None

    def describe(self) -> str:
        """One line for humans."""
        if self.kind == "edited":
            return f"edited  row {self.index} ({self.split}): id {self.old_id} -> {self.new_id}" + (
                f" (now row {self.new_index})" if self.new_index != self.index else ""
            )
        if self.kind == "removed":
            return f"removed row {self.index} ({self.split}): id {self.old_id}"
        return f"added   row {self.new_index} (in no split): id {self.new_id}"


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


@dataclass(frozen=True)
class CheckReport:
    """What :func:`check_split` found."""

    manifest_sha256: str
    data_sha256: str
    manifest_n_rows: int
    data_n_rows: int
    data_source: str
    rows_identical: bool
    changes: tuple[RowChange, ...]
    aligned: bool
    leak_columns: tuple[str, ...]
    leaks: tuple[Leak, ...]
    columns_added: tuple[str, ...] = ()
    """Columns the data has that the manifest's did not (a row hash covers every column, so one
    new column makes every row read as edited)."""
    columns_removed: tuple[str, ...] = ()

    @property
    def identical(self) -> bool:
        """Whether the data is exactly the data the manifest was made from (same bytes)."""
        return self.manifest_sha256 == self.data_sha256 and self.rows_identical

    @property
    def formatting_only(self) -> bool:
        """The file differs but every row is the same: the split still holds."""
        return self.rows_identical and self.manifest_sha256 != self.data_sha256

    def of_kind(self, kind: ChangeKind) -> list[RowChange]:
        """The changes of one kind."""
        return [c for c in self.changes if c.kind == kind]

    @property
    def leaked(self) -> bool:
        """Whether any text appears in more than one split."""
        return any(leak.n_texts for leak in self.leaks)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the whole report."""
        out = asdict(self)
        out.update(
            identical=self.identical,
            formatting_only=self.formatting_only,
            counts={kind: len(self.of_kind(kind)) for kind in ("edited", "added", "removed")},
        )
        return out

    def to_json(self) -> str:
        """The report as canonical JSON."""
        return canonical_dumps(self.to_dict())

    def format(self, max_rows: int = 20, *, all_rows: str = "--json lists all") -> str:
        """A report for humans, listing at most ``max_rows`` changed rows."""
        lines: list[str] = []
        if self.identical:
            lines.append(
                f"identical: {self.data_source} is the data of this manifest ({self.data_n_rows} rows)"
            )
        elif self.formatting_only:
            lines.append(
                f"formatting only: the file's sha256 changed ({self.manifest_sha256[:12]}... -> "
                f"{self.data_sha256[:12]}...) but all {self.data_n_rows} rows are the same; the split holds"
            )
        else:
            counts = ", ".join(f"{len(self.of_kind(k))} {k}" for k in ("edited", "added", "removed"))
            lines.append(
                f"changed: {counts} (manifest {self.manifest_n_rows} rows, sha256 "
                f"{self.manifest_sha256[:12]}...; data {self.data_n_rows} rows, "
                f"sha256 {self.data_sha256[:12]}...)"
            )
            if self.columns_added or self.columns_removed:
                added, removed = ", ".join(self.columns_added), ", ".join(self.columns_removed)
                which = (added and f"added {added}", removed and f"removed {removed}")
                lines.append(
                    f"  columns: {'; '.join(w for w in which if w)} (a row's hash covers every column, "
                    "null where a row lacks one: every row reads as edited)"
                )
            if not self.aligned:
                lines.append("  (many rows changed in one stretch: compared position by position)")
            for change in self.changes[:max_rows]:
                lines.append("  " + change.describe())
            if len(self.changes) > max_rows:
                lines.append(f"  ... and {len(self.changes) - max_rows} more ({all_rows})")
        columns = ", ".join(self.leak_columns)
        if not self.leak_columns:
            lines.append("leakage: not checked (no column of free text; name them with --leak-columns)")
        elif not self.leaked:
            lines.append(f"leakage: none (normalised text of {columns})")
        for leak in self.leaks:
            if not leak.n_texts:
                continue
            lines.append(
                f"leakage {leak.split_a}/{leak.split_b}: {leak.n_texts} text(s) in both "
                f"({leak.n_rows_a} {leak.split_a} rows, {leak.n_rows_b} {leak.split_b} rows; "
                f"columns {columns})"
            )
            for example in leak.examples:
                lines.append(
                    f"  {example.text[:70]!r}: {leak.split_a} rows {list(example.rows_a)[:5]}, "
                    f"{leak.split_b} rows {list(example.rows_b)[:5]}"
                )
        return "\n".join(lines)


def _common_ids(old: RowHashes, new: RowHashes) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Both tables' rows as ids into one shared dictionary of digests (and its hex ids)."""
    both = np.ascontiguousarray(np.concatenate([old.digests, new.digests])).view("S32").ravel()
    union, inverse = np.unique(both, return_inverse=True)
    k_old = old.digests.shape[0]
    old_ids = inverse[:k_old][old.codes] if len(old) else np.zeros(0, dtype=np.intp)
    new_ids = inverse[k_old:][new.codes] if len(new) else np.zeros(0, dtype=np.intp)
    hexes = [bytes(d).hex()[:_ID_DIGITS] for d in union.view(np.uint8).reshape(len(union), 32)]
    return old_ids, new_ids, hexes


def _diff_rows(manifest: Manifest, table: Table) -> tuple[list[RowChange], bool, np.ndarray]:
    """The changed rows, whether they were aligned, and where each of the manifest's rows is in
    the data now (-1: removed), edited rows included."""
    old_ids, new_ids, hexes = _common_ids(manifest.row_hashes, table.row_hash_table())
    where = manifest.assignment()
    split_of = [*LISTS]
    n_old, n_new = len(old_ids), len(new_ids)
    # Strip the common head and tail, so one inserted row does not look like every row edited.
    limit = min(n_old, n_new)
    head_diff = np.flatnonzero(old_ids[:limit] != new_ids[:limit])
    head = int(head_diff[0]) if head_diff.size else limit
    tail_diff = np.flatnonzero(old_ids[::-1][: limit - head] != new_ids[::-1][: limit - head])
    tail = int(tail_diff[0]) if tail_diff.size else limit - head
    old_mid = old_ids[head : n_old - tail].tolist()
    new_mid = new_ids[head : n_new - tail].tolist()
    changes: list[RowChange] = []
    position = np.full(n_old, -1, dtype=np.int64)
    position[:head] = np.arange(head)
    position[n_old - tail :] = np.arange(n_new - tail, n_new)

    def edited(i: int, j: int) -> None:
        changes.append(RowChange("edited", i, j, split_of[where[i]], hexes[old_ids[i]], hexes[new_ids[j]]))

    def removed(i: int) -> None:
        changes.append(RowChange("removed", i, None, split_of[where[i]], hexes[old_ids[i]], None))

    def added(j: int) -> None:
        changes.append(RowChange("added", None, j, "none", None, hexes[new_ids[j]]))

    aligned = max(len(old_mid), len(new_mid)) <= _ALIGN_LIMIT
    if aligned:
        matcher = difflib.SequenceMatcher(None, old_mid, new_mid, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            paired = min(i2 - i1, j2 - j1) if tag in ("replace", "equal") else 0
            position[head + i1 : head + i1 + paired] = np.arange(head + j1, head + j1 + paired)
            for offset in range(paired if tag == "replace" else 0):
                edited(head + i1 + offset, head + j1 + offset)
            if tag in ("replace", "delete"):
                for i in range(i1 + paired, i2):
                    removed(head + i)
            if tag in ("replace", "insert"):
                for j in range(j1 + paired, j2):
                    added(head + j)
    else:
        common = min(len(old_mid), len(new_mid))
        position[head : head + common] = np.arange(head, head + common)
        differ = np.flatnonzero(np.asarray(old_mid[:common]) != np.asarray(new_mid[:common]))
        for offset in differ.tolist():
            edited(head + offset, head + offset)
        for i in range(head + common, n_old - tail):
            removed(i)
        for j in range(head + common, n_new - tail):
            added(j)
    changes.sort(key=lambda c: (c.index if c.index is not None else c.new_index or 0, c.kind))
    return changes, aligned, position


def default_leak_columns(manifest: Manifest, table: Table) -> list[str]:
    """The columns of free text (a value of two words or more, in a string or inside a list or
    mapping, as chat ``messages``), except the stratify and group columns. A column of one-word
    values (ids, uuids, dates, numbers, labels) is left out: a unique id in the compared text
    would make every row unique, and no copy would be found."""
    skip = {manifest.stratify_by, manifest.group_by}
    return [name for name in table.columns if name not in skip and _holds_free_text(table.column(name))]


def _holds_free_text(column: Any) -> bool:
    if isinstance(column, np.ndarray) and column.dtype.kind != "U":
        return False
    return any(_INNER_SPACE.search(s) for value in column for s in _strings_in(value))


def _refuse_textless(table: Table, columns: Sequence[str]) -> None:
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


def _find_leaks(
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


def check_split(
    manifest: Manifest,
    table: Table,
    *,
    leak_columns: Sequence[str] | None = None,
    n_examples: int = 3,
) -> CheckReport:
    """Compare ``table`` with the data ``manifest`` was made from, and look for leakage.

    Args:
        manifest: the split (from :func:`reprotune._data.manifest.load_manifest`).
        table: the data as it is now.
        leak_columns: columns whose normalised text is compared across splits; by default every
            text column except the stratify and group columns.
        n_examples: examples kept per leaking split pair.

    Returns:
        The report: ``identical``, ``formatting_only``, the changed rows, the leaks.

    Raises:
        InputError: a leak column that does not exist, or holds no text.
    """
    columns = list(leak_columns) if leak_columns is not None else default_leak_columns(manifest, table)
    if leak_columns is not None:
        _refuse_textless(table, columns)
    new_hashes = table.row_hash_table()
    rows_identical = new_hashes.sha256() == manifest.row_hashes.sha256()
    changes: list[RowChange] = []
    aligned, position = True, np.arange(manifest.n_rows)
    if not rows_identical:
        changes, aligned, position = _diff_rows(manifest, table)
    return CheckReport(
        manifest_sha256=manifest.dataset_sha256,
        data_sha256=table.file_sha256,
        manifest_n_rows=manifest.n_rows,
        data_n_rows=table.n_rows,
        data_source=table.source,
        rows_identical=rows_identical,
        changes=tuple(changes),
        aligned=aligned,
        leak_columns=tuple(columns),
        leaks=tuple(_find_leaks(manifest, table, columns, n_examples, position)),
        columns_added=tuple(c for c in table.columns if c not in manifest.columns),
        columns_removed=tuple(c for c in manifest.columns if c not in table.columns),
    )
