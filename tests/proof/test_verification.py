"""The verdict rules shared by every verify (config, --command, --spot)."""

from __future__ import annotations

import pytest

from reprotune._proof.verification import NO_DROPOUT_INCONCLUSIVE, Leg, inconclusive_without_dropout


@pytest.mark.parametrize(
    ("passed", "dropout", "note", "judged", "after"),
    [
        (False, 0.0, None, True, (None, NO_DROPOUT_INCONCLUSIVE)),
        (False, None, "resumed at 4", True, (None, f"resumed at 4; {NO_DROPOUT_INCONCLUSIVE}")),
        (False, 0.05, None, False, (False, None)),
        (True, 0.0, None, False, (True, None)),
    ],
    ids=["no-dropout", "unrecorded-dropout-spot-note", "dropout-fails", "parted-passes"],
)  # fmt: skip
def test_an_rng_skip_control_that_could_not_part_is_inconclusive_only_without_dropout(
    passed: bool, dropout: float | None, note: str | None, judged: bool, after: tuple[bool | None, str | None]
) -> None:
    """verify and verify --spot judge the RNG-skip control by this one rule: a control that did not
    part counts as inconclusive only when nothing draws from the RNG after the checkpoint."""
    leg = Leg("control-resume", "legs/control-resume", "DIVERGED", passed=passed, note=note)
    inconclusive = inconclusive_without_dropout(leg, dropout)
    assert (inconclusive is not None) is judged
    judged_leg = inconclusive or leg
    assert (judged_leg.passed, judged_leg.note) == after
    assert (leg.passed, leg.note) == (passed, note)  # a leg is a value: the rule makes a new one


def test_a_leg_is_a_value() -> None:
    """A leg is never changed where it stands (verify, --command and --spot build new ones)."""
    import dataclasses

    leg = Leg("rerun", "legs/rerun", "IDENTICAL")
    with pytest.raises(dataclasses.FrozenInstanceError):
        leg.passed = True  # type: ignore[misc]
