"""The verdict rules shared by every verify (config, --command, --spot)."""

from __future__ import annotations

import pytest

from reprotune._proof.verification import (
    NO_CONTROL_PARTED,
    NO_DROPOUT_INCONCLUSIVE,
    Leg,
    inconclusive_without_dropout,
    outcome,
    why_lines,
)


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


def _leg(name: str, expected: str, passed: bool | None) -> Leg:
    verdict = None if passed is None else (expected if passed else "OTHER")
    return Leg(name, f"/v/{name}", expected, verdict, passed)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("legs", "verdict", "why"),
    [
        ([("rerun", "IDENTICAL", True), ("control", "DIVERGED", True)], "PASS", None),
        ([("rerun", "IDENTICAL", True), ("a", "DIVERGED", None), ("b", "DIVERGED", True)], "PASS", None),
        ([("rerun", "IDENTICAL", True), ("control", "DIVERGED", None)], "FAIL", NO_CONTROL_PARTED),
        ([("rerun", "IDENTICAL", True), ("control", "DIVERGED", False)], "FAIL", None),  # its mark says
        ([("rerun", "IDENTICAL", None), ("control", "DIVERGED", None)], "FAIL", "no leg could show"),
        ([("steps-0-4", "IDENTICAL", True)], "PASS", None),  # no control to require
    ],
)
def test_a_pass_needs_a_leg_that_passed_none_that_failed_and_a_control_that_parted(
    legs: list[tuple[str, str, bool | None]], verdict: str, why: str | None
) -> None:
    """A verification whose rerun was IDENTICAL but whose every negative control was inconclusive
    or not run is a FAIL, and its summary says why: no control showed the check able to fail."""
    made = [_leg(*leg) for leg in legs]
    assert outcome(made) == verdict
    lines = why_lines(made)
    if why is None:
        assert lines == []
    else:
        assert len(lines) == 1 and lines[0].startswith("  why FAIL: ") and why in lines[0]
