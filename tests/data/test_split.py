"""Tests for reprotune._data.split: allocation, exact rank labelling, strategies, policies, determinism."""

from __future__ import annotations

import subprocess
import sys
import warnings
from fractions import Fraction

import numpy as np
import pytest

from reprotune._data.loaders import table_from_columns
from reprotune._data.manifest import manifest_bytes
from reprotune._data.split import RareClassWarning, allocate, materialize, rank_labels, split_table
from reprotune._errors import InputError


def labels_table(sizes: dict[str, int], seed: int = 0) -> tuple[list[str], object]:
    rng = np.random.default_rng(seed)
    values = [name for name, n in sizes.items() for _ in range(n)]
    values = [values[i] for i in rng.permutation(len(values))]
    return values, table_from_columns({"text": [f"row {i}" for i in range(len(values))], "label": values})


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 9, 10, 11, 37, 105, 1000])
@pytest.mark.parametrize("ratios", [(0.8, 0.1, 0.1), (0.7, 0.2, 0.1), (0.5, 0.5, 0.0), (1 / 3, 1 / 3, 1 / 3)])
def test_allocate_within_one_row(n: int, ratios: tuple[float, float, float]) -> None:
    """Counts sum to n and each is within one row of exact; every split is reached when possible."""
    counts, reaches_all = allocate(n, ratios)
    exact = [n * Fraction(repr(r)) / sum(Fraction(repr(x)) for x in ratios) for r in ratios]
    assert sum(counts) == n
    assert all(abs(c - e) < 1 for c, e in zip(counts, exact, strict=True))
    positive = [i for i, r in enumerate(ratios) if r > 0]
    assert reaches_all == all(counts[i] >= 1 for i in positive)


def test_allocate_gives_small_splits_a_row_first() -> None:
    """4 rows at 70/20/10: 2/1/1 reaches every split (largest remainder alone would give 3/1/0)."""
    assert allocate(4, (0.7, 0.2, 0.1)) == ((2, 1, 1), True)
    assert allocate(5, (0.8, 0.1, 0.1)) == ((4, 1, 0), False)


def reference_labels(codes: np.ndarray, keys: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Rank by (key, row) inside each class with a full sort: the definition, slowly."""
    labels = np.empty(codes.shape[0], dtype=np.int8)
    for c in range(bounds.shape[0]):
        rows = np.flatnonzero(codes == c)
        ranked = rows[np.lexsort((rows, keys[rows]))]
        labels[ranked] = np.where(
            np.arange(rows.size) < bounds[c, 0], 0, np.where(np.arange(rows.size) < bounds[c, 1], 1, 2)
        )
    return labels


@pytest.mark.parametrize("n_classes", [1, 3, 50, 900])
@pytest.mark.parametrize("ties", [False, True], ids=["raw-keys", "tied-keys"])
def test_rank_labels_equals_full_sort(n_classes: int, ties: bool) -> None:
    """The bucketed labelling is exactly the full-sort definition, ties broken by row index."""
    rng = np.random.default_rng(n_classes)
    n = 20_000
    codes = rng.integers(0, n_classes, n).astype(np.uint16)
    keys = np.random.PCG64(7).random_raw(n)
    if ties:  # few distinct keys, most in the same top-bit bucket: the tie-break decides
        keys = (keys % np.uint64(5)) << np.uint64(60)
    sizes = np.bincount(codes, minlength=n_classes)
    bounds = np.stack([sizes * 7 // 10, sizes * 9 // 10], axis=1).astype(np.int64)
    assert np.array_equal(rank_labels(codes, keys, bounds), reference_labels(codes, keys, bounds))


def test_stratified_proportions_within_one_row() -> None:
    """Every class's split counts are within one row of exact, and the manifest records them."""
    _, table = labels_table({"a": 503, "b": 97, "c": 40, "d": 11})
    m = split_table(table, seed=3, stratify_by="label")  # type: ignore[arg-type]
    labels = table.column("label")  # type: ignore[attr-defined]
    for summary in m.classes:
        got = [
            sum(1 for i in m.indices[s] if labels[i] == summary.value)
            for s in ("train", "validation", "test")
        ]
        assert got == [summary.train, summary.validation, summary.test]
        assert all(abs(g - summary.n_rows * r) < 1 for g, r in zip(got, (0.8, 0.1, 0.1), strict=True))
    assert sorted(m.indices["train"] + m.indices["validation"] + m.indices["test"]) == list(range(651))


def test_same_inputs_same_bytes_other_seed_differs() -> None:
    """The same table, options and seed give byte-identical manifests; another seed does not."""
    _, table = labels_table({"a": 300, "b": 50})
    one = manifest_bytes(split_table(table, seed=11, stratify_by="label"))  # type: ignore[arg-type]
    two = manifest_bytes(split_table(table, seed=11, stratify_by="label"))  # type: ignore[arg-type]
    other = manifest_bytes(split_table(table, seed=12, stratify_by="label"))  # type: ignore[arg-type]
    assert one == two and one != other


def test_byte_identical_in_another_process() -> None:
    """A fresh interpreter (other hash seed) writes the same manifest bytes."""
    code = (
        "import hashlib; from reprotune._data.loaders import table_from_columns;"
        "from reprotune._data.manifest import manifest_bytes; from reprotune._data.split import split_table;"
        "t = table_from_columns({'k': [str(i % 7) for i in range(500)], 'v': list(range(500))});"
        "print(hashlib.sha256(manifest_bytes(split_table(t, seed=5, stratify_by='k'))).hexdigest())"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout
        for seed in ("1", "2")
    }
    table = table_from_columns({"k": [str(i % 7) for i in range(500)], "v": list(range(500))})
    import hashlib

    here = hashlib.sha256(manifest_bytes(split_table(table, seed=5, stratify_by="k"))).hexdigest()
    assert runs == {here + "\n"}


def test_rare_class_default_train_warns_and_records() -> None:
    """A 1-row class goes to train with a warning naming it and its count; the manifest says so."""
    _, table = labels_table({"big": 100, "solo": 1, "pair": 2})
    with pytest.warns(RareClassWarning, match=r"'pair' \(2 rows\), 'solo' \(1 row\)"):
        m = split_table(table, seed=0, stratify_by="label")  # type: ignore[arg-type]
    rare = {c.value: (c.n_rows, c.decision, c.train) for c in m.rare_classes}
    assert rare == {"solo": (1, "train", 1), "pair": (2, "train", 2)}
    assert m.to_json_obj()["rare_classes"] == [
        {"value": "pair", "n_rows": 2, "decision": "train"},
        {"value": "solo", "n_rows": 1, "decision": "train"},
    ]
    labels = table.column("label")  # type: ignore[attr-defined]
    assert {labels[i] for i in m.indices["validation"] + m.indices["test"]} == {"big"}


def test_rare_class_drop_and_error() -> None:
    """drop puts rare rows in no split (listed as dropped); error refuses with the classes."""
    values, table = labels_table({"big": 100, "solo": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RareClassWarning)
        m = split_table(table, seed=0, stratify_by="label", rare_class_policy="drop")  # type: ignore[arg-type]
    assert m.dropped == [values.index("solo")]
    assert m.sizes == {"train": 80, "validation": 10, "test": 10, "dropped": 1}
    with pytest.raises(InputError, match=r"'solo' \(1 row\)"):
        split_table(table, seed=0, stratify_by="label", rare_class_policy="error")  # type: ignore[arg-type]


def test_rare_classes_kept_in_a_train_split_the_ratios_leave_empty_are_refused() -> None:
    """Ratios 0/0.5/0.5 (no train) with the train policy: refused, naming the classes and the fix
    (before, the rare rows were the only train rows of a split asked to have none)."""
    _, table = labels_table({"big": 100, "solo": 1})
    with pytest.raises(InputError, match=r"which the ratios \[0\.0, 0\.5, 0\.5\] leave empty: 'solo'"):
        split_table(table, seed=0, ratios=(0.0, 0.5, 0.5), stratify_by="label")  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RareClassWarning)
        m = split_table(table, seed=0, ratios=(0.0, 0.5, 0.5), stratify_by="label", rare_class_policy="drop")  # type: ignore[arg-type]
    assert m.sizes["train"] == 0 and m.sizes["dropped"] == 1


def test_grouped_keeps_groups_together() -> None:
    """No group straddles two splits, every row is placed, sizes are near the ratios."""
    groups = [f"thread{i // 4}" for i in range(400)]  # 100 groups of 4
    table = table_from_columns({"g": groups, "x": list(range(400))})
    m = split_table(table, seed=9, group_by="g")
    where = {}
    for split, rows in m.indices.items():
        for i in rows:
            assert where.setdefault(groups[i], split) == split
    assert sum(m.sizes[s] for s in ("train", "validation", "test")) == 400
    assert m.groups == {
        "train": m.sizes["train"] // 4,
        "validation": m.sizes["validation"] // 4,
        "test": m.sizes["test"] // 4,
    }
    assert abs(m.sizes["train"] - 320) <= 4


def test_random_split_sizes_exact() -> None:
    """A random split of 1,000 rows is exactly 800/100/100."""
    m = split_table(table_from_columns({"x": list(range(1000))}), seed=1)
    assert m.sizes == {"train": 800, "validation": 100, "test": 100, "dropped": 0}
    assert m.strategy == "random"


def test_materialize_table_and_dataset() -> None:
    """Rows come back per split for a table and a Dataset; other data is refused."""
    table = table_from_columns({"x": list(range(20)), "y": [str(i) for i in range(20)]})
    m = split_table(table, seed=2)
    rows = materialize(m, table)
    assert [r["x"] for r in rows["test"]] == m.indices["test"]
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"x": list(range(20)), "y": [str(i) for i in range(20)]})
    parts = materialize(m, ds)
    assert parts["validation"]["x"] == m.indices["validation"]
    with pytest.raises(InputError, match="not the data the manifest was made from"):
        materialize(m, table_from_columns({"x": list(range(20)), "y": ["?"] * 20}))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ratios": (0.8, 0.3, -0.1)}, "negative"),
        ({"ratios": (0.8, 0.1, 0.2)}, "not 1"),
        ({"ratios": (0.8, 0.2)}, "not 3"),
        ({"seed": -1}, r"seed must be an integer in \[0, 2\*\*63\) \(got -1\)"),
        ({"seed": 1.5}, r"seed must be an integer in \[0, 2\*\*63\) \(got 1.5\)"),
        ({"stratify_by": "nope"}, r"column 'nope' .* the columns are \['x'\]"),
        ({"group_by": "nope"}, r"column 'nope' .* the columns are \['x'\]"),
        ({"stratify_by": "x", "group_by": "x"}, "choose one"),
        ({"rare_class_policy": "keep"}, "unknown rare-class policy"),
    ],
    ids=["negative", "sum", "count", "seed-neg", "seed-float", "stratify", "group", "both", "policy"],
)
def test_bad_options(kwargs: dict[str, object], match: str) -> None:
    """Each bad option raises InputError naming the value."""
    options: dict[str, object] = {"seed": 0, **kwargs}
    with pytest.raises(InputError, match=match):
        split_table(table_from_columns({"x": [1, 2, 3]}), **options)  # type: ignore[arg-type]


def test_empty_table_refused() -> None:
    """An empty dataset cannot be split."""
    with pytest.raises(InputError, match="no rows"):
        split_table(table_from_columns({"x": []}), seed=0)


@pytest.mark.parametrize(("option", "unit"), [("group_by", "group"), ("stratify_by", "class")])
def test_rows_without_a_value_in_the_column_are_said_to_be_one_group(option: str, unit: str) -> None:
    """Rows whose grouping or stratifying value is null or absent are split as one group or class,
    and said so in a warning and the manifest (it was silent)."""
    thread = [f"t{i // 4}" for i in range(32)] + [None] * 8
    table = table_from_columns({"prompt": [f"p{i}" for i in range(40)], "thread": thread})
    with pytest.warns(RareClassWarning) as caught:
        manifest = split_table(table, seed=0, **{option: "thread"})
    note = f"8 row(s) have no 'thread' (null or absent): they are split as one {unit}"
    assert note in [str(w.message) for w in caught] and note in manifest.warnings
    missing = set(range(32, 40))
    if unit == "group":  # together, in one split
        assert sum(bool(missing & set(rows)) for rows in manifest.indices.values()) == 1


def test_the_split_table_example_runs() -> None:
    """The docstring example of split_table imports what it uses and shows what it returns (before:
    it imported table_from_columns from a module that has none, and showed 10 train rows, not 8)."""
    import doctest

    from reprotune._data import split as split_module

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RareClassWarning)
        result = doctest.testmod(split_module, verbose=False)
    assert result.attempted == 3 and result.failed == 0
