"""Golden values: an algorithm change made without bumping its version fails here.

The manifest bytes of a fixed small table (random, stratified, grouped) and the data order of a
fixed seed are pinned. If one of these fails, the algorithm changed: bump ``ALGORITHM_VERSION``
(``_data/manifest_format.py``) or ``ORDER_VERSION`` (``_data/order.py``), say so in the changelog of the
commit, and only then update the pinned value. The derived seeds are pinned in
``tests/determinism/test_seeds.py``.
"""

from __future__ import annotations

import hashlib
import warnings

import pytest

from reprotune._data.loaders import table_from_columns
from reprotune._data.manifest import ALGORITHM_VERSION, manifest_bytes
from reprotune._data.order import ORDER_VERSION, DataOrder
from reprotune._data.split import RareClassWarning, split_table
from reprotune._data.table import Table

N_ROWS = 40


def _table() -> Table:
    """40 rows: classes x (20 rows), y (12), z (7) and one 'rare' row; 9 groups."""
    labels = ["x"] * 20 + ["y"] * 12 + ["z"] * 7 + ["rare"]
    return table_from_columns(
        {
            "prompt": [f"q{i}" for i in range(N_ROWS)],
            "response": [f"a{i}" for i in range(N_ROWS)],
            "label": labels,
            "group": [f"g{i % 9}" for i in range(N_ROWS)],
        },
        source="golden",
    )


GOLDEN = {
    # strategy: (options, manifest sha256, validation rows, test rows)
    "random": (
        {},
        "2d0a03c0ce4b859e151a04672ba6782b0bb2770aabe534d47b0e1199f757b908",
        [5, 7, 8, 38],
        [1, 16, 19, 27],
    ),
    "stratified": (
        {"stratify_by": "label"},
        "63bb4e7f64a4d563df7c8f4d3719945cfa4dd4dd2be334ee1f58db60282ce77a",
        [1, 5, 28, 34],
        [16, 19, 27, 38],
    ),
    "grouped": (
        {"group_by": "group"},
        "7cb9ca1e5a54674608d3b1fdeb912f14c85fbf2f5d868b7868e7c962cbf6fc21",
        [5, 14, 23, 32],
        [1, 10, 19, 28, 37],
    ),
}


@pytest.mark.parametrize("strategy", sorted(GOLDEN))
def test_manifest_bytes_are_pinned(strategy: str) -> None:
    """A fixed table, seed 7, 80/10/10: the exact manifest bytes of each strategy."""
    options, sha, validation, test = GOLDEN[strategy]
    assert ALGORITHM_VERSION == 1, "the algorithm version moved: re-pin GOLDEN for the new version"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RareClassWarning)
        manifest = split_table(_table(), ratios=(0.8, 0.1, 0.1), seed=7, **options)
    assert manifest.indices["validation"] == validation
    assert manifest.indices["test"] == test
    assert hashlib.sha256(manifest_bytes(manifest)).hexdigest() == sha


def test_data_order_is_pinned() -> None:
    """Seed 123 over rows 100..109, 3 rows a step: the exact permutations and step rows."""
    assert ORDER_VERSION == 1, "the order version moved: re-pin these values for the new version"
    order = DataOrder(123, list(range(100, 110)), 3)
    assert order.permutation(0).tolist() == [7, 4, 0, 2, 1, 5, 6, 8, 3, 9]
    assert order.permutation(5).tolist() == [4, 0, 3, 8, 1, 9, 2, 5, 7, 6]
    assert order.step_rows(4) == [109, 108, 104]  # positions 9 (epoch 0), then 0 and 1 of epoch 1
    assert order.position(4) == (0, 9)
