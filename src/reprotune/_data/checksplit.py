"""Check data against a split manifest: is it the same data, which rows changed, is there leakage.

Rows are compared by their content hashes (see :mod:`reprotune._data.table`), never by re-running the
split. Two files with the same rows but different bytes (reformatted JSON, reordered keys,
another format) are reported as a change in formatting only.

Leakage is checked on the data as it is now, at the manifest's indices (:mod:`reprotune._data.leakage`):
rows whose normalised text is the same in two splits, reported per split pair with counts and examples.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from reprotune._data.leakage import Leak, default_leak_columns, find_leaks, refuse_textless
from reprotune._data.manifest import LISTS, Manifest
from reprotune._data.row_hashes import RowHashes
from reprotune._data.table import Table
from reprotune._jsonio import canonical_dumps

ChangeKind = Literal["edited", "added", "removed"]
# Rows differing in a stretch longer than this (after the common head and tail) are compared
# position by position rather than aligned, which would be quadratic.
_ALIGN_LIMIT = 5000
_ID_DIGITS = 12


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
        leak_columns: columns whose normalised text is compared across splits; by default the
            columns of free text except the stratify and group columns.
        n_examples: examples kept per leaking split pair.

    Returns:
        The report: ``identical``, ``formatting_only``, the changed rows, the leaks.

    Raises:
        InputError: a leak column that does not exist, or holds no text.
    """
    columns = list(leak_columns) if leak_columns is not None else default_leak_columns(manifest, table)
    if leak_columns is not None:
        refuse_textless(table, columns)
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
        leaks=tuple(find_leaks(manifest, table, columns, n_examples, position)),
        columns_added=tuple(c for c in table.columns if c not in manifest.columns),
        columns_removed=tuple(c for c in manifest.columns if c not in table.columns),
    )
