"""``_proof.legs``: the verification engine. A leg is a value (its steps, what each must leave, its
judge); ``run_legs`` runs each leg's steps in order through a launcher and judges it, and turns a
failed or not-run leg into one that says so, its evidence kept; bad input stops the verification."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from reprotune._errors import InputError, RunFailedError
from reprotune._proof.legs import LegNotRun, LegPlan, Step, run_legs
from reprotune._proof.verification import Leg


class Launcher:
    """Records every launch; fails the ones it is told to."""

    def __init__(self, fail: dict[str, Exception] | None = None) -> None:
        self.calls: list[tuple[str, str, str | None]] = []
        self.fail = fail or {}

    def __call__(self, leg: str, launch: str, /, *, label: str | None = None) -> None:
        self.calls.append((leg, launch, label))
        if launch in self.fail:
            raise self.fail[launch]


def _judged(leg: Leg) -> Leg:
    return replace(leg, verdict="IDENTICAL", passed=leg.expected == "IDENTICAL", evidence={"steps": 6})


def test_steps_run_in_order_with_what_comes_before_and_after_each(tmp_path: Path) -> None:
    events: list[str] = []
    steps = (
        Step("stop", label="stop after 3", after=lambda: events.append("stopped?")),
        Step("resume", before=lambda: events.append("copy"), after=lambda: events.append("done?")),
    )
    launcher = Launcher()
    plan = LegPlan("resume", tmp_path / "r", "IDENTICAL", steps, _judged, evidence={"resumed_at": 3})
    [leg] = run_legs([plan], launcher)
    assert launcher.calls == [("resume", "stop", "stop after 3"), ("resume", "resume", None)]
    assert events == ["stopped?", "copy", "done?"]
    assert (leg.name, leg.run_dir, leg.verdict, leg.passed) == (
        "resume",
        str(tmp_path / "r"),
        "IDENTICAL",
        True,
    )
    assert leg.evidence == {"resumed_at": 3, "steps": 6}


def test_a_failed_step_makes_a_failed_leg_and_the_legs_after_it_still_run(tmp_path: Path) -> None:
    """A process that fails, or a step that finds its run did not leave what it must, fails its
    leg (FAILED, not passed, the message as its note, its evidence kept) and skips its later steps
    and judge; the next leg runs."""
    launcher = Launcher(fail={"a1": RunFailedError("the a leg's command failed with exit code 3")})

    def missing() -> None:
        raise RunFailedError("the stopped run left no Trainer checkpoint")

    def never(leg: Leg) -> Leg:
        raise AssertionError("a failed leg is not judged")

    plans = [
        LegPlan("a", tmp_path / "a", "IDENTICAL", (Step("a1"), Step("a2")), never, evidence={"k": 1}),
        LegPlan("b", tmp_path / "b", "DIVERGED", (Step("b1", after=missing), Step("b2")), never),
        LegPlan("c", tmp_path / "c", "IDENTICAL", (Step("c1"),), _judged),
    ]
    a, b, c = run_legs(plans, launcher)
    assert [call[1] for call in launcher.calls] == ["a1", "b1", "c1"]
    assert (a.verdict, a.passed, a.note, a.evidence) == (
        "FAILED",
        False,
        "the a leg's command failed with exit code 3",
        {"k": 1},
    )
    assert (b.verdict, b.passed, b.note) == ("FAILED", False, "the stopped run left no Trainer checkpoint")
    assert (c.verdict, c.passed) == ("IDENTICAL", True)


def test_a_leg_not_run_is_neither_passed_nor_failed(tmp_path: Path) -> None:
    launcher = Launcher(fail={"x": LegNotRun("not run: the rerun leg ran past its time")})
    [leg] = run_legs([LegPlan("x", tmp_path / "x", "DIVERGED", (Step("x"),), _judged)], launcher)
    assert (leg.verdict, leg.passed, leg.note) == (None, None, "not run: the rerun leg ran past its time")


def test_bad_input_stops_the_verification(tmp_path: Path) -> None:
    launcher = Launcher(fail={"x": InputError("the command wrote no run directory")})
    plans = [LegPlan(n, tmp_path / n, "IDENTICAL", (Step("x"),), _judged) for n in ("x", "y")]
    with pytest.raises(InputError, match="wrote no run directory"):
        run_legs(plans, launcher)
    assert len(launcher.calls) == 1


def test_a_run_its_judge_cannot_read_fails_its_leg_and_the_next_leg_still_runs(tmp_path: Path) -> None:
    """A leg whose processes ended well but left a run its judge cannot read (a ledger cut short,
    a record of another schema): FAILED, with the reader's words, file and fix as its note; not bad
    input, which would stop the verification and leave no verdict."""

    def unreadable(leg: Leg) -> Leg:
        if leg.name == "x":
            raise InputError("ledger is empty", source="x/ledger.jsonl", fix="rerun it")
        return _judged(leg)

    launcher = Launcher()
    plans = [LegPlan(n, tmp_path / n, "IDENTICAL", (Step(n),), unreadable, evidence={"e": 1}) for n in "xy"]
    x, y = run_legs(plans, launcher)
    assert (x.verdict, x.passed, x.evidence) == ("FAILED", False, {"e": 1})
    assert x.note == "its run could not be judged: x/ledger.jsonl: ledger is empty; fix: rerun it"
    assert (y.verdict, y.passed, len(launcher.calls)) == ("IDENTICAL", True, 2)


class Processes:
    """A stand-in for ``processes.LegProcesses`` side by side: a process ends when the test says."""

    together = True

    def __init__(self, fail: set[str] | None = None) -> None:
        self.started: list[str] = []
        self.fail = fail or set()

    def start(self, args: list[str]) -> int:
        self.started.append(args[0])
        return len(self.started) - 1

    def ended(self, number: int) -> bool:
        return True  # every process ends at its first poll

    def wait(self, number: int) -> float:
        if self.started[number] in self.fail:
            raise RunFailedError(f"`reprotune {self.started[number]}` failed with exit code 1")
        return 0.5

    def wall(self, number: int) -> float:
        return 0.25  # a failed process's own time, start to end


def test_side_by_side_a_step_starts_once_the_step_it_waits_for_has_ended(tmp_path: Path) -> None:
    """Side by side (verify's fast mode): the legs' first steps start together in plan order; a
    step that waits for another leg's first step starts only after that step ended and its
    ``after`` ran (the copy it resumes), and each leg's time adds up its own processes."""
    from reprotune._proof.legs import run_legs_side_by_side

    events: list[str] = []
    processes = Processes()
    real_start = processes.start

    def start(args: list[str]) -> int:
        events.append(f"start {args[0]}")
        return real_start(args)

    processes.start = start  # type: ignore[method-assign]
    plans = [
        LegPlan(
            "rerun",
            tmp_path / "r",
            "IDENTICAL",
            (Step(["r1"], after=lambda: events.append("copy")), Step(["r2"])),
            _judged,
        ),
        LegPlan("seed", tmp_path / "s", "DIVERGED", (Step(["s1"]),), _judged),
        LegPlan("skip", tmp_path / "k", "DIVERGED", (Step(["k1"], waits_for=("rerun", 1)),), _judged),
    ]
    lines: list[str] = []
    legs = run_legs_side_by_side(plans, processes, lines.append)  # type: ignore[arg-type]
    assert events == ["start r1", "start s1", "copy", "start r2", "start k1"]
    assert [leg.name for leg in legs] == ["rerun", "seed", "skip"]
    assert [leg.wall_s for leg in legs] == [1.0, 0.5, 0.5]


def test_side_by_side_a_leg_that_waits_for_a_failed_one_is_not_run(tmp_path: Path) -> None:
    from reprotune._proof.legs import run_legs_side_by_side

    processes = Processes(fail={"r1"})
    plans = [
        LegPlan("rerun", tmp_path / "r", "IDENTICAL", (Step(["r1"]), Step(["r2"])), _judged),
        LegPlan("seed", tmp_path / "s", "DIVERGED", (Step(["s1"]),), _judged),
        LegPlan("skip", tmp_path / "k", "DIVERGED", (Step(["k1"], waits_for=("rerun", 1)),), _judged),
    ]
    rerun, seed, skip = run_legs_side_by_side(plans, processes, lambda _: None)  # type: ignore[arg-type]
    assert processes.started == ["r1", "s1"]
    assert (rerun.verdict, rerun.passed, rerun.note) == (
        "FAILED",
        False,
        "`reprotune r1` failed with exit code 1",
    )
    assert rerun.wall_s == 0.25  # the failed process's own time, not until it was collected
    assert (seed.verdict, seed.passed) == ("IDENTICAL", False)  # judged: it had to diverge
    assert (skip.verdict, skip.passed, skip.note) == (
        None,
        None,
        "not run: the rerun leg it starts from failed",
    )


def test_side_by_side_a_step_that_did_not_leave_what_it_must_fails_its_leg_and_its_dependents(
    tmp_path: Path,
) -> None:
    """The rerun's first process ended but left no checkpoint (its ``after`` raises): the rerun is
    FAILED without starting its next step, and the control that starts from that checkpoint is
    not run."""
    from reprotune._proof.legs import run_legs_side_by_side

    def no_checkpoint() -> None:
        raise RunFailedError("the stopped run left no checkpoint")

    processes = Processes()
    plans = [
        LegPlan(
            "rerun", tmp_path / "r", "IDENTICAL", (Step(["r1"], after=no_checkpoint), Step(["r2"])), _judged
        ),
        LegPlan("skip", tmp_path / "k", "DIVERGED", (Step(["k1"], waits_for=("rerun", 1)),), _judged),
    ]
    rerun, skip = run_legs_side_by_side(plans, processes, lambda _: None)  # type: ignore[arg-type]
    assert processes.started == ["r1"]
    assert (rerun.verdict, rerun.note) == ("FAILED", "the stopped run left no checkpoint")
    assert (skip.verdict, skip.passed, skip.note) == (
        None,
        None,
        "not run: the rerun leg it starts from failed",
    )


def test_side_by_side_with_real_processes_a_failed_one_is_a_leg_not_an_exception(tmp_path: Path) -> None:
    """Through the real ``LegProcesses``: one leg's ``reprotune`` process fails (exit 2), the
    other's succeeds; the failure is a FAILED leg timed by its own process, the other is judged,
    and leaving the processes raises nothing (every failure was reported as a leg)."""
    from reprotune._proof.legs import run_legs_side_by_side
    from reprotune._proof.processes import LegProcesses

    log = tmp_path / "verify.log"
    missing = tmp_path / "missing.yaml"
    plans = [
        LegPlan("bad", tmp_path / "b", "IDENTICAL", (Step(["run", str(missing)]),), _judged),
        LegPlan("good", tmp_path / "g", "IDENTICAL", (Step(["--version"]),), _judged),
    ]
    with LegProcesses(log, together=True) as processes:
        bad, good = run_legs_side_by_side(plans, processes, lambda _: None)
    assert (bad.verdict, bad.passed) == ("FAILED", False) and "failed with exit code 2" in (bad.note or "")
    assert bad.wall_s > 0 and (good.verdict, good.passed) == ("IDENTICAL", True) and good.wall_s > 0
    assert "reprotune 0." in log.read_text()
