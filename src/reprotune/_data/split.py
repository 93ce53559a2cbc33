"""Seeded train/validation/test splits: random, stratified by a column, or grouped by a column.

The algorithm (version 1; docs/manifest.md states it for users):

1. Every row ``i`` gets a 64-bit key, the ``i``-th output of ``numpy.random.PCG64(seed)``'s raw
   stream (``random_raw``). NumPy keeps raw bit-generator streams stable across versions and
   platforms, and nothing else random is used, so the split depends on the seed and the data only.
2. Units are rows (random, stratified) or groups (grouped). A stratified split handles each class
   on its own; a random split is one class of all rows.
3. Each class of ``c`` rows gets per-split counts within one row of exact (``|n_s - c * r_s| < 1``):
   splits whose exact share is below one row get one first when the class can afford it, then
   the remaining rows go by largest remainder, ties to the earlier split. A class that cannot
   reach every split with a positive ratio this way is *rare* and follows the rare-class policy.
4. Within a class, rows are ordered by (key, row index); the first ``n_train`` go to train, the
   next ``n_validation`` to validation, the rest to test.
5. Grouped: each group's key is the key of its first row; groups are ordered by (key, first row)
   and laid end to end; a group goes to the split whose row range (cut at the exact counts for
   all rows) holds the middle of the group. All rows of a group share a split.

Each split's indices are stored ascending; the order rows are trained in is another seed's job.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from reprotune._data.loaders import load_table, table_from_dataset
from reprotune._data.manifest import LISTS, SPLITS, ClassSummary, Manifest, Strategy
from reprotune._data.split_options import check_options, check_ratios
from reprotune._data.table import Table, canonical_value
from reprotune._determinism.seeds import check_seed
from reprotune._errors import InputError

DEFAULT_RATIOS = (0.8, 0.1, 0.1)


class RareClassWarning(UserWarning):
    """A stratified split met classes too small to reach every split; the policy was applied."""


def allocate(n: int, ratios: Sequence[float]) -> tuple[tuple[int, int, int], bool]:
    """Split ``n`` rows into per-split counts within one row of exact.

    Returns:
        ``(counts, reaches_all)``: counts per split, and whether every split with a positive
        ratio got at least one row.
    """
    # Exact decimal values of the ratios (0.1 is 1/10, not its binary float), normalised.
    exact_ratios = [Fraction(repr(float(r))) for r in ratios]
    total = sum(exact_ratios)
    exact = [n * r / total for r in exact_ratios]
    counts = [math.floor(e) for e in exact]
    left = n - sum(counts)
    wanting = [s for s in range(3) if exact_ratios[s] > 0 and counts[s] == 0]
    reaches_all = len(wanting) <= left
    if reaches_all:
        for s in wanting:  # a split whose exact share is under one row gets its row first
            counts[s] += 1
        left -= len(wanting)
    bumped = set(wanting) if reaches_all else set()
    by_remainder = sorted(
        (s for s in range(3) if s not in bumped and exact[s] > counts[s]),
        key=lambda s: (-(exact[s] - counts[s]), s),
    )
    for s in by_remainder[:left]:
        counts[s] += 1
    return (counts[0], counts[1], counts[2]), reaches_all


def _sort_key(value: Any) -> str:
    """The stable order of class and group values: their canonical JSON text."""
    return json.dumps(canonical_value(value), sort_keys=True, ensure_ascii=False, allow_nan=True)


def _ordered_codes(table: Table, column: str, option: str) -> tuple[list[Any], np.ndarray]:
    """Factorize ``column`` with the distinct values in their stable order (by :func:`_sort_key`)."""
    table.require_column(column, option)
    uniques, codes = table.factorize(column)
    order = sorted(range(len(uniques)), key=lambda u: _sort_key(uniques[u]))
    rank = np.empty(len(uniques), dtype=codes.dtype)
    rank[np.asarray(order, dtype=np.intp)] = np.arange(len(uniques), dtype=codes.dtype)
    return [uniques[u] for u in order], rank[codes]


def rank_labels(codes: np.ndarray, keys: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Split labels by rank within class: 0 (train) below ``bounds[c, 0]``, 1 (validation) below
    ``bounds[c, 1]``, else 2 (test), where a row's rank is its position in its class ordered by
    (key, row index).

    Exact, in linear time without sorting every row: rows are bucketed by their key's top bits
    per class; only rows in the one bucket of each class that holds a boundary are sorted.

    Args:
        codes: ``(n,)`` class of each row, ``0 .. k-1``.
        keys: ``(n,)`` uint64 key of each row.
        bounds: ``(k, 2)`` integer rank bounds per class (``0 <= b0 <= b1 <= class size``).
    """
    n, k = codes.shape[0], bounds.shape[0]
    labels = np.full(n, 2, dtype=np.int8)
    if n == 0:
        return labels
    # Buckets per class: enough to make boundary buckets small, few enough that k * buckets
    # stays within a few times n.
    bits = int(min(12, max(0, math.floor(math.log2(max(n // max(k, 1), 1))))))
    width = 1 << bits
    # The key's top 16 bits, read in place (fresh large arrays are what costs time here).
    top = keys.view(np.uint16)[3::4] if sys.byteorder == "little" else keys.view(np.uint16)[0::4]
    bucket = top >> np.uint16(16 - bits)
    cell = codes.astype(np.intp) * width + bucket
    inclusive = np.cumsum(np.bincount(cell, minlength=k * width).reshape(k, width), axis=1)
    exclusive = inclusive - np.diff(inclusive, axis=1, prepend=0)
    # For each class and bound, the bucket holding that rank (width when past the class's end).
    holding = [(inclusive <= bounds[:, j : j + 1]).sum(axis=1).astype(np.uint16) for j in (0, 1)]
    low, high = holding[0][codes], holding[1][codes]
    labels[bucket < high] = 1
    labels[bucket < low] = 0
    pending = np.flatnonzero((bucket == low) | (bucket == high))
    if pending.size:
        order = np.lexsort((pending, keys[pending], cell[pending]))
        rows, cells = pending[order], cell[pending][order]
        run_start = np.flatnonzero(np.r_[True, cells[1:] != cells[:-1]])
        position = np.arange(rows.size) - np.repeat(run_start, np.diff(np.r_[run_start, rows.size]))
        rank = exclusive.ravel()[cells] + position
        klass = codes[rows]
        labels[rows] = np.where(rank < bounds[klass, 0], 0, np.where(rank < bounds[klass, 1], 1, 2))
    return labels


def split_table(
    table: Table,
    *,
    ratios: Sequence[float] = DEFAULT_RATIOS,
    seed: int,
    stratify_by: str | None = None,
    group_by: str | None = None,
    rare_class_policy: str = "train",
) -> Manifest:
    """Split ``table`` into train, validation and test; return the manifest (nothing is written).

    Args:
        table: the data (see :func:`reprotune._data.table.load_table`).
        ratios: train, validation, test shares; non-negative, summing to 1.
        seed: non-negative integer; the same table, options and seed give the same manifest.
        stratify_by: column whose classes keep their proportions in every split.
        group_by: column whose values keep all their rows in one split (exclusive with
            ``stratify_by``).
        rare_class_policy: for stratified splits, what happens to a class too small to reach
            every split: ``train`` (all its rows go to train, with a :class:`RareClassWarning`),
            ``drop`` (its rows go in no split, with a warning) or ``error``.

    Returns:
        The manifest, with per-row hashes and every decision recorded.

    Raises:
        InputError: an empty table, a missing column (listing the columns), bad ratios, seed or
            policy, both stratify_by and group_by, or rare classes under the ``error`` policy.

    Example:
        >>> from reprotune._data.loaders import table_from_columns
        >>> table = table_from_columns({"label": ["a"] * 8 + ["b"] * 2})
        >>> split_table(table, seed=0, stratify_by="label", rare_class_policy="train").sizes
        {'train': 8, 'validation': 1, 'test': 1, 'dropped': 0}
    """
    ratio_values = check_ratios(ratios)
    seed = check_seed(seed, source="seed")
    check_options(table, stratify_by, group_by, rare_class_policy)
    # One key per row from the raw PCG64 stream; see the module docstring.
    keys = np.random.PCG64(seed).random_raw(table.n_rows)
    notes: list[str] = []
    classes: tuple[ClassSummary, ...] = ()
    groups: dict[str, int] | None = None
    strategy: Strategy
    if group_by is not None:
        strategy = "grouped"
        labels, groups = _split_grouped(table, group_by, keys, ratio_values)
    elif stratify_by is not None:
        strategy = "stratified"
        labels, classes = _split_stratified(table, stratify_by, keys, ratio_values, rare_class_policy, notes)
    else:
        strategy = "random"
        counts, _ = allocate(table.n_rows, ratio_values)
        bounds = np.array([[counts[0], counts[0] + counts[1]]], dtype=np.int64)
        labels = rank_labels(np.zeros(table.n_rows, dtype=np.uint8), keys, bounds)
    notes.extend(_no_value_note(table, group_by or stratify_by, strategy))
    arrays = {name: np.flatnonzero(labels == position) for position, name in enumerate(LISTS)}
    for name, ratio in zip(SPLITS, ratio_values, strict=True):
        if ratio > 0 and arrays[name].size == 0:
            notes.append(f"split {name!r} is empty (ratio {ratio} of {table.n_rows} rows)")
    for note in notes:
        warnings.warn(note, RareClassWarning, stacklevel=2)
    return Manifest(
        dataset_source=_portable_source(table),
        dataset_format=table.format,
        dataset_sha256=table.file_sha256,
        n_rows=table.n_rows,
        columns=tuple(table.columns),
        seed=seed,
        ratios=ratio_values,
        strategy=strategy,
        stratify_by=stratify_by,
        group_by=group_by,
        rare_class_policy=rare_class_policy,
        index_arrays=arrays,
        row_hashes=table.row_hash_table(),
        classes=classes,
        groups=groups,
        warnings=tuple(notes),
    )


def _portable_source(table: Table) -> str:
    """The file's name without its directory, so the manifest is the same wherever the data is."""
    if table.is_file:
        return table.source.replace("\\", "/").rsplit("/", 1)[-1]
    return table.source


def _split_stratified(
    table: Table,
    column: str,
    keys: np.ndarray,
    ratios: tuple[float, float, float],
    policy: str,
    notes: list[str],
) -> tuple[np.ndarray, tuple[ClassSummary, ...]]:
    values, codes = _ordered_codes(table, column, "--stratify-by")
    _refuse_non_finite_classes(table, column, values, codes)
    sizes = np.bincount(codes, minlength=len(values))
    bounds = np.zeros((len(values), 2), dtype=np.int64)
    dropped = np.zeros(len(values), dtype=bool)
    summaries: list[ClassSummary] = []
    rare: list[tuple[Any, int]] = []
    for position, (value, size) in enumerate(zip(values, sizes.tolist(), strict=True)):
        counts, reaches_all = allocate(size, ratios)
        if reaches_all:
            bounds[position] = (counts[0], counts[0] + counts[1])
            summaries.append(ClassSummary(value, size, *counts, decision="split"))
        elif policy == "drop":
            rare.append((value, size))
            dropped[position] = True
            summaries.append(ClassSummary(value, size, 0, 0, 0, decision="drop"))
        else:
            rare.append((value, size))
            bounds[position] = (size, size)  # every rank below the train bound: all in train
            summaries.append(ClassSummary(value, size, size, 0, 0, decision="train"))
    if rare:
        listed = ", ".join(f"{v!r} ({n} row{'s' if n != 1 else ''})" for v, n in rare)
        if policy == "error":
            raise InputError(
                f"{len(rare)} class(es) of {column!r} are too small to appear in every split at "
                f"ratios {list(ratios)}: {listed}",
                source=f"--stratify-by {column}",
                fix="pass --rare-class-policy train (keep them in train) or drop, or merge small classes",
            )
        if policy == "train" and ratios[0] == 0:
            raise InputError(
                f"{len(rare)} class(es) of {column!r} are too small for every split, and the rare-class "
                f"policy keeps them in train, which the ratios {list(ratios)} leave empty: {listed}",
                source=f"--stratify-by {column}",
                fix="pass --rare-class-policy drop (or error), or give train a share of the ratios",
            )
        where = "kept in train only" if policy == "train" else "dropped from every split"
        notes.append(f"{len(rare)} class(es) of {column!r} too small for every split, {where}: {listed}")
    labels = rank_labels(codes, keys, bounds)
    if dropped.any():
        labels[dropped[codes]] = 3
    return labels, tuple(summaries)


def _refuse_non_finite_classes(table: Table, column: str, values: list[Any], codes: np.ndarray) -> None:
    """A class must be a value the manifest can record: NaN and infinity, alone or anywhere inside
    a list or an object, are refused, naming the rows."""
    bad = [u for u, v in enumerate(values) if _holds_non_finite(canonical_value(v))]
    if bad:
        rows = np.flatnonzero(np.isin(codes, np.asarray(bad, dtype=codes.dtype)))
        raise InputError(
            f"the stratify column {column!r} holds {[values[u] for u in bad]} in {rows.size} row(s), "
            f"first row {int(rows[0])}; a class must be a value JSON can write (NaN is not equal to "
            "itself, and neither it nor infinity is JSON)",
            source=f"{table.source}, column {column!r}",
            fix="give those rows a class (e.g. 'unknown') or a null, or drop them",
        )


def _holds_non_finite(value: Any) -> bool:
    """Whether a canonical value is, or holds at any depth, a NaN or an infinity."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list):
        return any(_holds_non_finite(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_non_finite(v) for v in value.values())
    return False


def _split_grouped(
    table: Table, column: str, keys: np.ndarray, ratios: tuple[float, float, float]
) -> tuple[np.ndarray, dict[str, int]]:
    _, codes = _ordered_codes(table, column, "--group-by")
    n_groups = int(codes.max()) + 1
    sizes = np.bincount(codes, minlength=n_groups)
    first = np.full(n_groups, table.n_rows, dtype=np.int64)
    np.minimum.at(first, codes, np.arange(table.n_rows, dtype=np.int64))  # each group's first row
    group_keys = keys[first]
    order = np.lexsort((first, group_keys))  # by key, then by first row
    ends = np.cumsum(sizes[order])
    middles = 2 * ends - sizes[order]  # twice the middle, to stay in integers
    counts, _ = allocate(table.n_rows, ratios)
    cut_train, cut_validation = 2 * counts[0], 2 * (counts[0] + counts[1])
    group_label = np.empty(n_groups, dtype=np.int8)
    group_label[order] = np.where(middles <= cut_train, 0, np.where(middles <= cut_validation, 1, 2))
    labels = group_label[codes]
    per_split = np.bincount(group_label, minlength=3)
    return labels, {name: int(per_split[i]) for i, name in enumerate(SPLITS)}


def _no_value_note(table: Table, column: str | None, strategy: str) -> list[str]:
    """Rows without a value in the grouping or stratifying column (null, or the key absent) are
    kept together as one group or class: said, so that it is not a silent choice."""
    if column is None:
        return []
    values = table.column(column)
    if isinstance(values, np.ndarray) and values.dtype != object:
        return []  # a typed column holds a value in every row
    missing = sum(value is None for value in values)
    if not missing:
        return []
    unit = "group" if strategy == "grouped" else "class"
    return [f"{missing} row(s) have no {column!r} (null or absent): they are split as one {unit}"]


def holds_same_rows(table: Table, manifest: Manifest) -> bool:
    """Whether ``table`` is the data ``manifest`` was made from: the same file, or the same rows
    in a reformatted file (another key order, line ending or format), which split the same way."""
    return table.n_rows == manifest.n_rows and (
        table.file_sha256 == manifest.dataset_sha256
        or table.row_hash_table().sha256() == manifest.row_hashes.sha256()
    )


def materialize(
    manifest: Manifest, data: Table | Any, *, verify: bool = True
) -> dict[str, list[dict[str, Any]] | Any]:
    """The rows of each split: lists of row dicts for a table or file, ``Dataset``\\ s for a ``Dataset``.

    Args:
        manifest: the split.
        data: a :class:`Table`, a path or builtin name, or a ``datasets.Dataset``.
        verify: check first that ``data`` is the data the manifest was made from.

    Returns:
        ``{"train": ..., "validation": ..., "test": ...}``.

    Raises:
        InputError: the data is not the data of the manifest (run ``reprotune check-split``).
    """
    is_dataset = hasattr(data, "select") and hasattr(data, "column_names")
    if isinstance(data, Table):
        table = data
    elif is_dataset:
        table = table_from_dataset(data)
    else:
        table = load_table(str(data))
    if verify and not holds_same_rows(table, manifest):
        raise InputError(
            f"the data ({table.n_rows} rows, sha256 {table.file_sha256[:12]}...) is not the data the "
            f"manifest was made from ({manifest.n_rows} rows, sha256 {manifest.dataset_sha256[:12]}...)",
            source=table.source,
            fix="run `reprotune check-split MANIFEST DATA` to see what changed",
        )
    if is_dataset:
        dataset: Any = data
        return {name: dataset.select(manifest.indices[name]) for name in SPLITS}
    return {name: table.canonical_rows(manifest.index_arrays[name]) for name in SPLITS}
