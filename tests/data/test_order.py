"""The data order is a pure function of (seed, epoch, position)."""

from __future__ import annotations

import pytest

from reprotune._data.order import DataOrder


def test_same_seed_same_order() -> None:
    """Two orders built from the same seed give the same rows at every step."""
    a = DataOrder(seed=7, row_ids=list(range(100, 137)), rows_per_step=5)
    b = DataOrder(seed=7, row_ids=list(range(100, 137)), rows_per_step=5)
    assert [a.step_rows(s) for s in range(1, 30)] == [b.step_rows(s) for s in range(1, 30)]


def test_other_seed_other_order() -> None:
    """A different seed changes the rows of the first step."""
    a = DataOrder(seed=7, row_ids=list(range(50)), rows_per_step=4)
    b = DataOrder(seed=8, row_ids=list(range(50)), rows_per_step=4)
    assert a.step_rows(1) != b.step_rows(1)


def test_random_access_equals_sequential() -> None:
    """Asking for step 17 first gives what a loop from step 1 would have seen (resume needs it)."""
    sequential = DataOrder(seed=3, row_ids=list(range(23)), rows_per_step=4)
    seen = [sequential.step_rows(s) for s in range(1, 20)]
    fresh = DataOrder(seed=3, row_ids=list(range(23)), rows_per_step=4)
    assert fresh.step_rows(17) == seen[16]


def test_each_epoch_is_a_permutation() -> None:
    """Every training row is seen exactly once per epoch, also across step boundaries."""
    rows = list(range(10, 31))  # 21 rows, 4 per step: steps straddle epochs
    order = DataOrder(seed=1, row_ids=rows, rows_per_step=4)
    stream = [r for s in range(1, 22) for r in order.step_rows(s)]  # 84 rows = 4 epochs
    for epoch in range(4):
        assert sorted(stream[epoch * 21 : (epoch + 1) * 21]) == rows
    assert stream[:21] != stream[21:42]  # epochs are reshuffled


def test_position_and_epochs() -> None:
    """position() says where a step starts; steps_for_epochs rounds up."""
    order = DataOrder(seed=0, row_ids=list(range(10)), rows_per_step=4)
    assert order.position(1) == (0, 0)
    assert order.position(3) == (0, 8)
    assert order.position(4) == (1, 2)
    assert order.steps_for_epochs(1) == 3
    assert order.steps_for_epochs(2.5) == 7


def test_shards_are_slices_of_one_order() -> None:
    """Two shards of a step's rows are slices of the single-process order, not a new order."""
    order = DataOrder(seed=5, row_ids=list(range(40)), rows_per_step=8)
    rows = order.step_rows(3)
    assert rows[:4] + rows[4:] == DataOrder(seed=5, row_ids=list(range(40)), rows_per_step=8).step_rows(3)


@pytest.mark.parametrize("bad", [0, -1], ids=["zero", "negative"])
def test_rejects_bad_step(bad: int) -> None:
    """Steps count from 1."""
    with pytest.raises(ValueError, match="count from 1"):
        DataOrder(seed=0, row_ids=[1, 2], rows_per_step=1).step_rows(bad)
