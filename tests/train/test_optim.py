"""Learning-rate schedules."""

from __future__ import annotations

import pytest

from reprotune._train.optim import lr_factor


@pytest.mark.parametrize(
    ("schedule", "step", "expected"),
    [
        ("constant", 0, 0.5),  # warmup: (0 + 1) / 2
        ("constant", 9, 1.0),
        ("linear", 2, 1.0),  # first step after warmup
        ("linear", 7, 0.375),  # (7 - 2) / 8 of the way down
        ("linear", 10, 0.0),
        ("cosine", 6, 0.5),  # half way: cos(pi / 2) = 0
    ],
    ids=["const-0", "const-9", "linear-start", "linear-mid", "linear-end", "cosine-mid"],
)
def test_schedules(schedule: str, step: int, expected: float) -> None:
    """Each schedule after a 2-step warmup over 10 steps."""
    assert lr_factor(step, schedule=schedule, warmup_steps=2, total_steps=10) == pytest.approx(
        expected, abs=1e-12
    )


def test_warmup_is_linear() -> None:
    """Warmup ramps up to the base rate."""
    assert [lr_factor(s, schedule="linear", warmup_steps=4, total_steps=10) for s in range(4)] == [
        0.25,
        0.5,
        0.75,
        1.0,
    ]
