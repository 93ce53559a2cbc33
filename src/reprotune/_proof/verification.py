"""What ``reprotune verify`` found: its legs and its verdict, and ``verification.json``'s format
(one result for a config's verification and a command's: :class:`Verification`)."""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from reprotune._config.secrets import mask_command
from reprotune._errors import InputError
from reprotune._formats import COMMAND_VERIFICATION, VERIFICATION
from reprotune._proof.compare import compare_runs
from reprotune._proof.differences import Comparison, Verdict
from reprotune._run.layout import RunLayout
from reprotune._run.record import read_record

Mode = Literal["fast", "thorough", "spot", "command"]
Outcome = Literal["PASS", "FAIL"]
Expected = Literal["IDENTICAL", "DIVERGED"]
#: What a leg showed: a comparison's verdict with the reference, or FAILED (its process failed).
LegVerdict = Literal["IDENTICAL", "WITHIN_TOLERANCE", "DIVERGED", "INCOMPARABLE", "FAILED"]
_JUDGED: dict[Verdict, LegVerdict] = {
    Verdict.IDENTICAL: "IDENTICAL",
    Verdict.WITHIN_TOLERANCE: "WITHIN_TOLERANCE",
    Verdict.DIVERGED: "DIVERGED",
    Verdict.INCOMPARABLE: "INCOMPARABLE",
}


@dataclass(frozen=True)
class Leg:
    """One leg of the verification and what it had to show: a value, judged and timed by making
    a new one (:func:`judge_leg`, ``dataclasses.replace``), never changed where it stands."""

    name: str
    run_dir: str
    expected: Expected
    verdict: LegVerdict | None = None
    passed: bool | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    note: str | None = None
    wall_s: float = 0.0
    """Wall time of the leg's processes (start, imports, model load, training, writing)."""
    train_s: float | None = None
    """The part of it spent in optimizer steps, from the leg's record."""
    prefix: bool = False
    """Compared over the steps both ledgers hold: a control that stops once it parts, by design."""


@dataclass
class Verification:
    """The outcome of ``reprotune verify``: of a config (``fast``, ``thorough``), of a run's sampled
    intervals (``spot``), or of a user's command (``command``, with or without ``spot``)."""

    verdict: Outcome
    directory: str
    config_sha256: str
    legs: list[Leg]
    mode: Mode = "fast"
    reference: str = ""
    """The reference run's directory (``reference/`` inside, or the ``--reference`` given)."""
    reference_s: float | None = None
    """The reference run's own duration (its record), the unit the cost is measured in."""
    machine: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    """Elapsed time from the first leg's start to the last verdict: legs that ran side by side
    count once. What the user waited for beyond the reference, and the cost's numerator."""
    spot: dict[str, Any] | None = None
    """``--spot``: the budget, the seed, the intervals chosen and what their replay proves."""
    command: str | None = None
    """``verify --command``: the user's command (its file is ``reprotune/command-verification``)."""
    resume_at: int | None = None
    """``verify --command --resume-at``: the step the resume leg stopped after."""

    @property
    def legs_s(self) -> float:
        """The legs' process wall times added up (more than ``wall_s`` when legs overlapped)."""
        return sum(leg.wall_s for leg in self.legs)

    @property
    def cost(self) -> float | None:
        """The verification's time over the reference run's (``wall_s / reference_s``)."""
        return self.wall_s / self.reference_s if self.reference_s else None

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["legs_s"] = round(self.legs_s, 3)
        body["wall_s"] = wall_s = round(self.wall_s, 3)
        # From the wall time as written, so that the file agrees with itself: cost is
        # wall_s / reference_s of the values a reader sees, rounded once.
        body["cost"] = round(wall_s / self.reference_s, 3) if self.reference_s else None
        if self.command is not None:
            return COMMAND_VERIFICATION.stamp(body)
        del body["command"], body["resume_at"]
        return VERIFICATION.stamp(body)

    def format(self) -> str:
        if self.command is None:
            lines = [f"verify: {self.verdict}  ({self.mode}, {self.directory})", *leg_lines(self.legs, 15)]
        else:
            lines = [f"verify: {self.verdict}  ({self.directory})", f"  command: {self.command}"]
            lines += leg_lines(self.legs, 17)
        lines += why_lines(self.legs)
        lines += coverage_lines(self.spot)
        if self.cost is not None:
            lines.append(
                f"  cost: {self.wall_s:.0f} s of legs for a {self.reference_s:.0f} s run ({self.cost:.2f}x)"
                + (
                    f"; {self.legs_s:.0f} s of leg processes, some side by side"
                    if self.legs_s > self.wall_s + 1
                    else ""
                )
            )
        return "\n".join(lines)


NO_CONTROL_PARTED = (
    "no negative control parted (each was inconclusive or not run), so the check was not shown able "
    "to fail: a PASS would prove nothing"
)


def outcome(legs: list[Leg]) -> Outcome:
    """PASS when no leg failed, at least one passed and, where the verification has negative
    controls (legs that must be DIVERGED), at least one of them parted: a check no control showed
    able to fail proves nothing. An inconclusive leg counts neither way."""
    return "PASS" if unproven(legs) is None and all(leg.passed is not False for leg in legs) else "FAIL"


def unproven(legs: list[Leg]) -> str | None:
    """Why legs of which none failed still make no PASS (every leg inconclusive, or no control
    parted), for the summary; None when they do make one, or when a leg failed (its mark says)."""
    if any(leg.passed is False for leg in legs):
        return None
    if not any(leg.passed for leg in legs):
        return "no leg could show what it had to (each was inconclusive or not run)"
    controls = [leg for leg in legs if leg.expected == "DIVERGED"]
    return NO_CONTROL_PARTED if controls and not any(leg.passed for leg in controls) else None


def judge_leg(leg: Leg, reference: Path, *, prefix: bool = False) -> tuple[Leg, Comparison]:
    """Compare ``leg``'s run with the reference: the leg with the verdict, whether that is what it
    had to show, and the evidence (steps compared, first divergence, its own adapter's sha256);
    ``prefix``: over the steps both ledgers hold (a control that stops once it parts)."""
    cmp = compare_runs(reference, Path(leg.run_dir), prefix=prefix)
    evidence: dict[str, Any] = {"steps": cmp.where.steps_compared}
    if cmp.where.first_divergence_step is not None:
        evidence["first_divergence"] = cmp.where.first_divergence_step
    if cmp.adapter is not None and cmp.adapter.sha256_b:
        evidence["adapter_sha256"] = cmp.adapter.sha256_b
    judged = replace(
        leg,
        prefix=prefix,
        verdict=_JUDGED[cmp.verdict],
        passed=cmp.verdict == leg.expected,
        evidence=evidence,
    )
    return judged, cmp


def judge_data_order_control(leg: Leg, reference: Path, *, prefix: bool = False) -> tuple[Leg, Comparison]:
    """Judge a control that perturbs the data-order seed (``verify --command``'s): as
    :func:`judge_leg`, and when it parted before its batches did, it is inconclusive (``passed``
    None): the data order cannot part two runs before it changes a batch, so something else did
    (an unseeded LoRA init, nondeterminism), and its DIVERGED proves nothing about the check."""
    leg, cmp = judge_leg(leg, reference, prefix=prefix)
    where = cmp.where
    at, batch = where.first_divergence_step, where.first_batch_step
    note = f"why: {cmp.causes[0]}" if cmp.verdict != "IDENTICAL" and cmp.causes else None
    if leg.passed and at is not None and (batch is None or batch > at):
        parted = "step 0 (the initial weights)" if at == 0 else f"step {at}"
        inconclusive = (
            f"inconclusive, not counted: it parted at {parted}, before its batches differed "
            f"({'never' if batch is None else f'step {batch}'}), so the data order did not part it; "
            "something that differs from run to run did (`reprotune compare` of the reference and "
            "this leg says what)" + (f"; {note}" if note else "")
        )
        return replace(leg, passed=None, note=inconclusive), cmp
    return replace(leg, note=note), cmp


NO_DROPOUT_INCONCLUSIVE = (
    "inconclusive: with lora.dropout 0 nothing draws from the RNG after the checkpoint, so "
    "skipping its restore cannot show"
)


def inconclusive_without_dropout(leg: Leg, dropout: float | None) -> Leg | None:
    """The one rule for an RNG-skip control (``verify``'s and ``verify --spot``'s): one that did
    not part, in a run whose LoRA dropout is 0 (or unrecorded), could not show a skipped restore
    (nothing draws from the RNG after the checkpoint): it is inconclusive (``passed`` None, the
    reason added to its note), not failed. Returns that leg, or None when the rule does not apply."""
    if leg.passed or dropout:
        return None
    note = f"{leg.note}; {NO_DROPOUT_INCONCLUSIVE}" if leg.note else NO_DROPOUT_INCONCLUSIVE
    return replace(leg, passed=None, note=note)


def why_lines(legs: list[Leg]) -> list[str]:
    """The summary's line on why legs none of which failed make a FAIL (none otherwise)."""
    why = unproven(legs)
    return [] if why is None else [f"  why FAIL: {why}"]


def progress_line(leg: Leg) -> str:
    """The line printed as a leg is judged; a leg that could not show what it had to (``passed``
    None) says it is not counted, instead of reading as a failure."""
    if leg.verdict is None:  # not compared: a refused input, its note says why
        return f"  {leg.name}: FAIL, {leg.note}" if leg.passed is False else f"  {leg.name}: {leg.note}"
    line = f"  {leg.name}: {leg.verdict} (must be {leg.expected})"
    return line + (": inconclusive, not counted (the summary says why)" if leg.passed is None else "")


def leg_lines(legs: list[Leg], width: int) -> list[str]:
    """One line per leg (mark, name, verdict, what it had to show, evidence; hashes cut to 12
    characters), and its note below it."""
    lines = []
    for leg in legs:
        mark = "ok  " if leg.passed else ("n/a " if leg.passed is None else "FAIL")
        detail = ", ".join(f"{k} {_shown(k, v)}" for k, v in leg.evidence.items())
        lines.append(
            f"  [{mark}] {leg.name:<{width}} {leg.verdict or '-':<11} (must be {leg.expected}) {detail}"
        )
        if leg.note:
            lines.append(f"         {leg.note}")
    return lines


def _shown(key: str, value: Any) -> str:
    """An evidence value in a leg's line: a hash cut to 12 characters, a mapping (an eval pair's
    evidence) as ``(key value, ...)``."""
    if isinstance(value, dict):
        return "(" + ", ".join(f"{k} {_shown(k, v)}" for k, v in value.items()) + ")"
    return str(value)[:12] if key.endswith("sha256") else str(value)


def machine_summary() -> dict[str, Any]:
    """The machine a verification ran on, as ``verification.json`` records it."""
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }


def coverage_lines(spot: dict[str, Any] | None) -> list[str]:
    """What a spot check covered and proves, for people (none without one)."""
    if spot is None:
        return []
    return [
        f"  covered: {spot['intervals_replayed']} of {spot['intervals_available']} intervals, "
        f"{spot['steps_replayed']} of {spot['total_steps']} steps "
        f"(budget {spot['budget']:g}, seed {spot['seed']})",
        f"  proves: {spot['proves']}",
    ]


def recorded_total_steps(run_dir: Path) -> int:
    """The run's optimizer steps, from its record's data order.

    Raises:
        InputError: the record holds no ``data.order.total_steps`` (a run made by another tool).
    """
    total = read_record(RunLayout(run_dir).record).total_steps
    if total is None:
        raise InputError(
            f"the record of {run_dir} holds no data.order.total_steps",
            source=str(RunLayout(run_dir).record),
            fix="the record was edited or written by another tool; rerun to regenerate it",
        )
    return total


def run_seconds(run_dir: Path) -> float | None:
    """A run's own duration (its record): the unit a verification's cost is measured in."""
    return read_record(RunLayout(run_dir).record).timings.duration_s


def command_verification(
    legs: list[Leg],
    directory: Path,
    command: str,
    reference: Path,
    *,
    wall_s: float,
    resume_at: int | None = None,
    spot: dict[str, Any] | None = None,
) -> Verification:
    """The outcome of ``verify --command`` (legs judged after its ``reference`` leg, in ``wall_s``):
    its config sha256 and duration read from the reference leg's record."""
    record = read_record(RunLayout(reference).record)
    return Verification(
        outcome(legs),
        str(directory),
        record.config_sha256,
        legs,
        mode="command",
        reference=str(reference),
        reference_s=record.timings.duration_s,
        machine=machine_summary(),
        wall_s=wall_s,
        spot=spot,
        command=mask_command(command),  # verification.json may be sent: no secret of the command line
        resume_at=resume_at,
    )


def train_seconds(run_dir: Path, *, since: int = 0) -> float | None:
    """A leg's seconds in optimizer steps after step ``since`` (mean step time x steps, from its
    record): a leg that resumes a copied checkpoint did not run the steps before it."""
    timings = read_record(RunLayout(run_dir).record).timings
    mean, steps = timings.step_time_s_mean, timings.steps_done
    return round(mean * max(0, steps - since), 3) if mean is not None and steps else None
