"""The verification engine: a leg is a value, :class:`LegPlan` (what to launch, in what order,
what each launch must leave behind, what the leg must show), made by the factory of what is
verified (a user's command: ``_proof.verify_command.command_legs`` and
``_proof.spot_command.interval_legs``); :func:`run_legs` launches and judges the legs one after
the other through a launcher (for a command: ``_proof.command_legs.Runner.leg``).

A leg whose process fails, or runs past its time, becomes a FAILED leg that says why; a leg after
one that ran past its time is not run (``n/a``). Either way the verification still gets its verdict
and ``verification.json`` its evidence. Bad input (:class:`InputError`) stops the verification.
Never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from reprotune._errors import RunFailedError
from reprotune._proof.verification import Expected, Leg

Launch = TypeVar("Launch")
Launch_contra = TypeVar("Launch_contra", contravariant=True)


class LegNotRun(RunFailedError):
    """A leg not run, because an earlier one ran past its time."""


@dataclass(frozen=True)
class Step(Generic[Launch]):
    """One process of a leg."""

    launch: Launch
    """What the launcher starts (for a command: the controls it runs under)."""
    label: str | None = None
    """Its name in the progress lines (default: the leg's)."""
    before: Callable[[], None] | None = None
    """What to prepare first (the copy of the checkpoint a replay resumes)."""
    after: Callable[[], None] | None = None
    """What it must have left for the next step or the judge (a stopped run's checkpoint); raises
    :class:`RunFailedError` saying what is missing."""


@dataclass(frozen=True)
class LegPlan(Generic[Launch]):
    """A leg before it runs: its steps, and what it must show."""

    name: str
    run_dir: Path
    expected: Expected
    steps: tuple[Step[Launch], ...]
    judge: Callable[[Leg], Leg]
    """The leg (its name, run directory and what it must show) compared with the reference."""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    """Facts of the leg that are kept whether it ran or failed (the step a resume stops after)."""

    @property
    def leg(self) -> Leg:
        """The leg, not yet judged."""
        return Leg(self.name, str(self.run_dir.resolve()), self.expected)


class Launcher(Protocol[Launch_contra]):
    """Runs one step of a leg to its end; raises :class:`RunFailedError` when it fails (or
    :class:`LegNotRun` when it is not run) and :class:`InputError` on bad input."""

    def __call__(self, leg: str, launch: Launch_contra, /, *, label: str | None = None) -> object: ...


def run_legs(plans: Sequence[LegPlan[Launch]], launcher: Launcher[Launch]) -> list[Leg]:
    """Each leg's steps launched in order and the leg judged, one leg after the other."""
    return [_run_leg(plan, launcher) for plan in plans]


def _run_leg(plan: LegPlan[Launch], launcher: Launcher[Launch]) -> Leg:
    try:
        for step in plan.steps:
            if step.before is not None:
                step.before()
            launcher(plan.name, step.launch, label=step.label)
            if step.after is not None:
                step.after()
        judged = plan.judge(plan.leg)
    except LegNotRun as exc:
        return replace(plan.leg, evidence=dict(plan.evidence), note=exc.message)
    except RunFailedError as exc:
        return replace(
            plan.leg, verdict="FAILED", passed=False, evidence=dict(plan.evidence), note=exc.message
        )
    return replace(judged, evidence={**plan.evidence, **judged.evidence})
