"""The verification engine: a leg is a value, :class:`LegPlan` (what to launch, in what order,
what each launch must leave behind, what the leg must show), made by the factory of what is
verified (a config's legs: ``_proof.verify``; a user's command: ``_proof.verify_command`` and
``_proof.spot_command``). Two ways to run them, the same legs and the same outcome:

- :func:`run_legs`: one leg after the other, each step through a launcher (``reprotune verify
  --thorough``: ``python -m reprotune ...``; ``verify --command``: ``command_legs.Runner.leg``);
- :func:`run_legs_side_by_side`: every leg's steps started as soon as the step before them (and
  the step of another leg they wait for) has ended, through ``processes.LegProcesses``
  (``reprotune verify``'s fast mode: the controls beside the rerun, training in turns).

A leg whose process fails, or runs past its time, or leaves less than its next step needs,
becomes a FAILED leg that says why; a leg that waits for one that failed, or comes after one that
ran past its time, is not run (``n/a``). Either way the verification still gets its verdict and
``verification.json`` its evidence. Bad input (:class:`InputError`) stops the verification.
Never imports torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from reprotune._errors import InputError, RunFailedError
from reprotune._proof.processes import LegProcesses
from reprotune._proof.verification import Expected, Leg, train_seconds
from reprotune._run.layout import RunLayout
from reprotune._run.signals import raise_if_interrupted

Launch = TypeVar("Launch")
Launch_contra = TypeVar("Launch_contra", contravariant=True)


class LegNotRun(RunFailedError):
    """A leg not run: an earlier one ran past its time, or the leg it waits for failed."""


@dataclass(frozen=True)
class Step(Generic[Launch]):
    """One process of a leg."""

    launch: Launch
    """What the launcher starts (``reprotune`` CLI arguments; for a command, its controls)."""
    label: str | None = None
    """What the progress lines call it."""
    before: Callable[[], None] | None = None
    """What to prepare first (the copy of the checkpoint a control or a replay resumes)."""
    after: Callable[[], None] | None = None
    """What it must have left for the next step or the judge (a stopped run's checkpoint); raises
    :class:`RunFailedError` saying what is missing."""
    waits_for: tuple[str, int] | None = None
    """Side by side: (another leg, how many of its steps) that must have ended before this starts."""


@dataclass(frozen=True)
class LegPlan(Generic[Launch]):
    """A leg before it runs: its steps, and what it must show."""

    name: str
    run_dir: Path
    expected: Expected
    steps: tuple[Step[Launch], ...]
    judge: Callable[[Leg], Leg]
    """The leg (its name, run directory, what it must show, its note) compared with the reference."""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    """Facts of the leg that are kept whether it ran or failed (the step a resume stops after)."""
    note: str | None = None
    """What the leg is, before it is judged (the seed a control perturbs)."""
    trains_from: int = 0
    """The step its training starts after (a resumed control's checkpoint, a replay's interval
    start): its ``train_s`` counts the optimizer steps after it."""

    @property
    def leg(self) -> Leg:
        """The leg, not yet judged."""
        return Leg(self.name, str(self.run_dir.resolve()), self.expected, note=self.note)


class Launcher(Protocol[Launch_contra]):
    """Runs one step of a leg to its end; raises :class:`RunFailedError` when it fails (or
    :class:`LegNotRun` when it is not run) and :class:`InputError` on bad input."""

    def __call__(self, leg: str, launch: Launch_contra, /, *, label: str | None = None) -> object: ...


def run_legs(plans: Sequence[LegPlan[Launch]], launcher: Launcher[Launch]) -> list[Leg]:
    """Each leg's steps launched in order and the leg judged, one leg after the other; each leg's
    ``wall_s`` is its steps' time (a failed step's included), its ``train_s`` the part its record
    says was optimizer steps."""
    return [_run_leg(plan, launcher) for plan in plans]


def _run_leg(plan: LegPlan[Launch], launcher: Launcher[Launch]) -> Leg:
    wall, failure = 0.0, None
    try:
        for step in plan.steps:
            if step.before is not None:
                step.before()
            started = time.perf_counter()
            try:
                launcher(plan.name, step.launch, label=step.label)
            finally:
                wall += time.perf_counter() - started
            if step.after is not None:
                step.after()
    except RunFailedError as exc:
        failure = exc
    return _outcome(plan, failure, wall)


def _outcome(plan: LegPlan[Launch], failure: RunFailedError | None, wall: float) -> Leg:
    """The leg judged, or, when it failed or was not run, a leg that says so, its evidence kept."""
    if isinstance(failure, LegNotRun):
        leg = replace(plan.leg, evidence=dict(plan.evidence), note=failure.message)
    elif failure is not None:
        leg = replace(
            plan.leg, verdict="FAILED", passed=False, evidence=dict(plan.evidence), note=failure.message
        )
    else:
        try:
            judged = plan.judge(plan.leg)
        except RunFailedError as exc:
            return _outcome(plan, exc, wall)
        except InputError as exc:  # what the leg left cannot be read: the leg failed, not the input
            words = "; ".join(str(exc).splitlines())
            return _outcome(plan, RunFailedError(f"its run could not be judged: {words}"), wall)
        leg = replace(judged, evidence={**plan.evidence, **judged.evidence})
    trained = RunLayout(plan.run_dir).is_run_dir()  # a failed leg's run may hold steps too
    train_s = train_seconds(plan.run_dir, since=plan.trains_from) if trained else None
    return replace(leg, wall_s=round(wall, 3), train_s=train_s)


@dataclass
class _Progress:
    """A leg running side by side: its next step, the process of the one running, its time."""

    plan: LegPlan[Sequence[str]]
    next: int = 0
    number: int | None = None
    started_at: float = 0.0
    wall: float = 0.0
    failure: RunFailedError | None = None

    @property
    def finished(self) -> bool:
        return self.failure is not None or (self.number is None and self.next == len(self.plan.steps))


def run_legs_side_by_side(
    plans: Sequence[LegPlan[Sequence[str]]], processes: LegProcesses, progress: Callable[[str], None]
) -> list[Leg]:
    """The legs' ``reprotune`` processes started through ``processes`` as soon as each may (the
    step before it ended, and the step it waits for), in the order of ``plans``; then each leg
    judged in that order. One at a time (``processes.together`` false) each process runs to its
    end when started. Each leg's ``wall_s`` is its processes' time, start to end."""
    legs = {plan.name: _Progress(plan) for plan in plans}
    while not all(leg.finished for leg in legs.values()):
        raise_if_interrupted()
        for leg in legs.values():
            if leg.number is None and not leg.finished:
                _start_if_ready(leg, legs, processes, progress)
        for leg in legs.values():
            if leg.number is not None and processes.ended(leg.number):
                _collect(leg, processes)
        if processes.together and not all(leg.finished for leg in legs.values()):
            time.sleep(0.05)
    return [_outcome(leg.plan, leg.failure, leg.wall) for leg in legs.values()]


def _start_if_ready(
    leg: _Progress, legs: Mapping[str, _Progress], processes: LegProcesses, progress: Callable[[str], None]
) -> None:
    step = leg.plan.steps[leg.next]
    if step.waits_for is not None:
        other = legs[step.waits_for[0]]
        if other.failure is not None and other.next < step.waits_for[1]:
            leg.failure = LegNotRun(f"not run: the {other.plan.name} leg it starts from failed")
            return
        if other.next < step.waits_for[1]:
            return
    try:
        if step.before is not None:
            step.before()
    except RunFailedError as exc:
        leg.failure = exc
        return
    if step.label is not None:
        progress(step.label)
    leg.started_at = time.perf_counter()
    try:
        leg.number = processes.start(step.launch)
    except RunFailedError as exc:  # one at a time: the process ran, and failed
        leg.failure = exc
        leg.wall += time.perf_counter() - leg.started_at


def _collect(leg: _Progress, processes: LegProcesses) -> None:
    number, leg.number = leg.number, None
    assert number is not None
    step = leg.plan.steps[leg.next]
    try:
        leg.wall += processes.wait(number)
    except RunFailedError as exc:  # the process failed: its time, start to end, counts too
        leg.failure, leg.wall = exc, leg.wall + processes.wall(number)
        return
    try:
        if step.after is not None:
            step.after()
    except RunFailedError as exc:  # it did not leave what comes next needs: not counted as ended
        leg.failure = exc
        return
    leg.next += 1
