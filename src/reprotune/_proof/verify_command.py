"""``reprotune verify --command "python train.py ..."``: prove that a user's own Trainer script
reproduces, with a control that proves the check can fail.

The script writes its run directory through ``ReprotuneCallback``
(``reprotune.integrations.transformers``); verify steers it through the environment variables of
``reprotune.integrations.controls``. Each leg runs the command in a fresh process, into one
verification directory:

1. ``reference``: the command as given.
2. ``rerun``: the same again; must be IDENTICAL to the reference.
3. ``control-data-seed``: the data-order seed perturbed (``REPROTUNE_PERTURB_DATA_SEED=1``);
   must be DIVERGED, else the check is blind.
4. ``resume`` (with ``--resume-at K``): stopped by the callback after step K (a Trainer
   checkpoint is saved), then the command again, resuming with the Trainer's own
   ``train(resume_from_checkpoint=...)``; must be IDENTICAL to the reference. Its verdict says
   whether the Trainer's resume is exact on this setup; when it is not, the first differing
   step and the cause are reported.

Each leg writes the Trainer's own output directory inside its run directory
(``<leg>/trainer-output``), so that the legs share nothing. The verdict is PASS only when every
leg says what it must; ``verification.json`` keeps the evidence, ``verify.log`` the output.
Never imports torch.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from reprotune._errors import InputError, RunFailedError
from reprotune._jsonio import write_json_atomic
from reprotune._proof.processes import ending_with_this_process
from reprotune._proof.verification import (
    Expected,
    Leg,
    Outcome,
    coverage_lines,
    judge_data_order_control,
    judge_leg,
    leg_lines,
    outcome,
    train_seconds,
)
from reprotune._run.layout import RunLayout, VerifyLayout
from reprotune._run.ledger import read_ledger
from reprotune._run.outputs import removed_if_refused
from reprotune._run.record import Status, load_record
from reprotune.integrations import controls as control_vars
from reprotune.integrations.controls import Controls

SCHEMA = "reprotune/command-verification"
SCHEMA_VERSION = 2  # 2: spot (verify --command --spot)
#: Where each leg's Trainer writes its own checkpoints, inside the leg's run directory.
TRAINER_OUTPUT = "trainer-output"
_CONTROL_VARIABLES = (*control_vars.UNRECORDED_VARIABLES, control_vars.PERTURB_DATA_SEED)


@dataclass
class CommandVerification:
    """The outcome of ``reprotune verify --command``."""

    verdict: Outcome
    directory: str
    command: str
    resume_at: int | None
    legs: list[Leg]
    spot: dict[str, Any] | None = None
    """``--spot``: the intervals between the Trainer's checkpoints replayed, and what that proves."""

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **asdict(self)}

    def format(self) -> str:
        lines = [f"verify: {self.verdict}  ({self.directory})", f"  command: {self.command}"]
        lines += leg_lines(self.legs, 17)
        lines += coverage_lines(self.spot)
        return "\n".join(lines)


def parse_command(command: str) -> list[str]:
    """Split ``--command`` as a POSIX shell would (no shell runs it).

    Raises:
        InputError: the command is empty or its quotes do not close.
    """
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise InputError(
            f"cannot split the command {command!r}: {exc}",
            source="--command",
            fix='quote the whole command once, e.g. --command "python train.py --epochs 1"',
        ) from None
    if not argv:
        raise InputError("the command is empty", source="--command", fix='e.g. --command "python train.py"')
    return argv


def verify_command(
    command: str,
    out_dir: Path,
    *,
    resume_at: int | None = None,
    cwd: Path | None = None,
    progress: Callable[[str], None] = lambda line: print(line, flush=True),
) -> CommandVerification:
    """Run the legs of the module docstring into ``out_dir`` and judge them.

    Args:
        command: the user's training command; its Trainer must have a ``ReprotuneCallback``.
        out_dir: the verification directory (new or empty).
        resume_at: also stop one run after this optimizer step and resume it with the Trainer's
            own ``resume_from_checkpoint``.
        cwd: where the command runs (default: the current directory).
        progress: where progress lines go.

    Raises:
        InputError: a bad command, ``resume_at`` or ``out_dir``; a resume step at or after the
            run's last step; a command that wrote no run directory (its Trainer has no callback).
        RunFailedError: the command failed.
    """
    argv = parse_command(command)
    if resume_at is not None and (isinstance(resume_at, bool) or resume_at < 1):
        raise InputError(
            f"--resume-at {resume_at!r} is not a step >= 1", source="--resume-at", fix="e.g. --resume-at 10"
        )
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise InputError(
            f"verification directory {out_dir} exists and is not empty",
            source="--out",
            fix="choose a new --out directory, or leave it out for runs/verify-<id>",
        )
    layout = VerifyLayout(out_dir)
    with removed_if_refused(out_dir):  # a refusal after the reference leg leaves nothing behind
        out_dir.mkdir(parents=True, exist_ok=True)
        return _verify(Runner(argv, layout.log, cwd or Path.cwd(), progress), layout, command, resume_at)


def _verify(run: Runner, layout: VerifyLayout, command: str, resume_at: int | None) -> CommandVerification:
    """The legs, judged, and the verification record (see :func:`verify_command`)."""
    reference = run.leg("reference", Controls(run_dir=layout.leg("reference")))
    require_status(reference, "completed", "reference")
    if resume_at is not None:
        _check_resume_at(reference, resume_at)
    rerun_dir = layout.leg("rerun")
    legs = [
        failed_or(
            "rerun",
            rerun_dir,
            "IDENTICAL",
            lambda: _judge("rerun", reference, run.leg("rerun", Controls(run_dir=rerun_dir)), "IDENTICAL"),
        ),
        failed_or(
            "control-data-seed",
            layout.leg("control-data-seed"),
            "DIVERGED",
            lambda: _data_seed_control(run, layout, reference),
        ),
    ]
    if resume_at is not None:
        legs.append(
            failed_or(
                "resume",
                layout.leg("resume"),
                "IDENTICAL",
                lambda: _stop_and_resume(run, layout.leg("resume"), reference, resume_at),
                evidence={"resumed_at": resume_at},
            )
        )
    run.timed(legs)
    verdict = outcome(legs)
    result = CommandVerification(verdict, str(layout.root), command, resume_at, legs)
    write_json_atomic(layout.verification, result.to_json())
    return result


class LegTimedOut(RunFailedError):
    """A leg ran past its time and was stopped."""


class LegNotRun(RunFailedError):
    """A leg not run, because an earlier one ran past its time."""


#: A leg after the reference may take this many times the reference's wall time (at least
#: :data:`MIN_LEG_TIMEOUT_S`) before it is stopped as one that cannot finish: a rank waiting
#: forever on another that stopped must not hold verify forever.
LEG_TIMEOUT_FACTOR = 4.0
MIN_LEG_TIMEOUT_S = 300.0


@dataclass
class Runner:
    """Runs the user's command in fresh processes, output appended to the verification log.
    ``timeout_s`` (set from the reference leg's wall time) bounds every later leg."""

    argv: Sequence[str]
    log: Path
    cwd: Path
    progress: Callable[[str], None]
    timeout_s: float | None = None
    timeout_why: str = ""
    walls: dict[Path, float] = field(default_factory=dict)
    """Each leg's processes' wall time by run directory (a stop and its resume add up)."""
    timed_out: str | None = None
    """The leg that ran past its time: the legs after it are not run (each would wait as long)."""

    def timed(self, legs: Sequence[Leg]) -> None:
        """Set each leg's wall time (its processes') and training time (from its record)."""
        for leg in legs:
            leg.wall_s = round(self.walls.get(Path(leg.run_dir).resolve(), 0.0), 3)
            if RunLayout(Path(leg.run_dir)).is_run_dir():
                leg.train_s = train_seconds(Path(leg.run_dir))

    def _timeout_text(self) -> str:
        """Why a leg past the timeout is stopped, and what usually holds it, for this command."""
        under_torchrun = any("torchrun" in part or "torch.distributed.run" in part for part in self.argv)
        hint = (
            "under torchrun this is most often a rank waiting for another that stopped (a stop or a "
            "negative control applied on one rank only)"
            if under_torchrun
            else "the script hung, or waits for something the reference did not"
        )
        return (f" ({self.timeout_why})" if self.timeout_why else "") + f": stopped; {hint}"

    def leg(self, name: str, controls: Controls, *, label: str | None = None) -> Path:
        """Run the command for one leg; return its run directory (absolute)."""
        assert controls.run_dir is not None
        if self.timed_out is not None:
            raise LegNotRun(
                f"not run: the {self.timed_out} leg ran past its time",
                source=str(self.log),
                fix="see verify.log",
            )
        run_dir = controls.run_dir.resolve()
        controls = replace(controls, run_dir=run_dir, output_dir=run_dir / TRAINER_OUTPUT)
        self.progress(f"verify: {label or name} ...")
        env = {k: v for k, v in os.environ.items() if k not in _CONTROL_VARIABLES}
        env.update(controls.to_env())
        shown = " ".join(f"{k}={v}" for k, v in sorted(controls.to_env().items()))
        with open(self.log, "ab") as out:
            out.write(f"$ {shown} {shlex.join(self.argv)}\n".encode())
            out.flush()
            started = time.perf_counter()
            try:
                process = subprocess.Popen(
                    list(self.argv),
                    stdout=out,
                    stderr=out,
                    env=env,
                    cwd=self.cwd,
                    start_new_session=True,  # its own group: a stop reaches what it started (sh -c ...)
                    preexec_fn=ending_with_this_process(),  # never trains on after this verify
                )
            except OSError as exc:
                raise InputError(
                    f"cannot run the command {self.argv[0]!r}: {exc.strerror or exc}",
                    source="--command",
                    fix='give a command that runs from this directory, e.g. --command "python train.py"',
                ) from None
            try:
                code = _wait(process, self.timeout_s, name, self._timeout_text())
            except LegTimedOut:
                self.timed_out = name
                raise
        wall = time.perf_counter() - started
        self.walls[run_dir] = self.walls.get(run_dir, 0.0) + wall
        if self.timeout_s is None and name == "reference":
            self.timeout_s = max(MIN_LEG_TIMEOUT_S, LEG_TIMEOUT_FACTOR * wall)
            times = f"{LEG_TIMEOUT_FACTOR:g}x the reference's {wall:.0f} s"
            self.timeout_why = (
                times if self.timeout_s > MIN_LEG_TIMEOUT_S else f"the least a leg gets; {times} is less"
            )
        if code != 0:
            tail = self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
            raise RunFailedError(
                f"the {name} leg's command failed with exit code {code}:\n" + "\n".join(tail),
                source=str(self.log),
                fix="read the script's last lines above (a reprotune refusal there gives its own fix); a "
                "script that fails on its own must be fixed first",
            )
        if not RunLayout(run_dir).is_run_dir():
            raise InputError(
                f"the command wrote no run directory at {run_dir}: its Trainer has no ReprotuneCallback",
                source="--command",
                fix="give the script's Trainer a reprotune ReprotuneCallback (docs/integrations.md)",
            )
        return run_dir


def _wait(process: subprocess.Popen[bytes], timeout_s: float | None, name: str, why: str) -> int:
    """The leg's exit code; past ``timeout_s`` it is stopped (SIGTERM to its process group, which
    torchrun passes on to its workers; SIGKILL 30 s later) and the leg fails, saying ``why``."""
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop(process)
        raise LegTimedOut(
            f"the {name} leg did not finish within {timeout_s:.0f} s{why}",
            source="--command",
            fix="see verify.log; the callback applies verify's stop and controls on every rank, so check "
            "that every rank's Trainer has a ReprotuneCallback",
        ) from None
    except BaseException:
        _stop(process)  # Ctrl-C or SIGTERM of verify: the leg stops with it, and all it started
        raise


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop the leg and everything in its process group (the command and what it started): SIGTERM,
    then, when any of it is still there 30 s later (or this wait is itself interrupted), SIGKILL."""
    group = process.pid  # the leg leads its own group (start_new_session)
    try:
        _signal_group(group, signal.SIGTERM, process)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None and not _group_alive(group):
                return
            time.sleep(0.1)
    finally:
        if process.poll() is None or _group_alive(group):
            _signal_group(group, signal.SIGKILL, process)
        process.wait()


def _signal_group(group: int, sig: int, process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)  # no group of its own (gone already): the process itself


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def require_status(run_dir: Path, status: Status, leg: str) -> None:
    found = load_record(run_dir).get("status")
    if found != status:
        raise RunFailedError(
            f"the {leg} leg's run ended with status {found!r}, not {status!r}",
            source=str(RunLayout(run_dir).record),
            fix="see verify.log in the verification directory",
        )


def _judge(name: str, reference: Path, leg_dir: Path, expected: Expected) -> Leg:
    leg = Leg(name, str(leg_dir), expected)
    comparison = judge_leg(leg, reference)
    if leg.verdict != "IDENTICAL" and comparison.causes:
        leg.note = f"why: {comparison.causes[0]}"
    if comparison.incomparable:
        leg.note = f"incomparable: {comparison.incomparable[0]}"
    return leg


def _data_seed_control(run: Runner, layout: VerifyLayout, reference: Path) -> Leg:
    control = run.leg(
        "control-data-seed", Controls(run_dir=layout.leg("control-data-seed"), perturb_data_seed=1)
    )
    leg = Leg("control-data-seed", str(control), "DIVERGED")
    comparison = judge_data_order_control(leg, reference)
    if comparison.incomparable:
        leg.note = f"incomparable: {comparison.incomparable[0]}"
    return leg


def _check_resume_at(reference: Path, step: int) -> None:
    """Refuse a resume step at or after the reference's last step, before any other leg trains."""
    total = len(read_ledger(RunLayout(reference).ledger).train)
    if step >= total:
        raise InputError(
            f"--resume-at {step} is not before the run's last step ({total})",
            source="--resume-at",
            fix=f"choose a step from 1 to {total - 1}",
        )


def failed_or(
    name: str,
    run_dir: Path,
    expected: Expected,
    leg: Callable[[], Leg],
    *,
    evidence: dict[str, Any] | None = None,
) -> Leg:
    """``leg()``, or, when its command failed or ran past its time after the reference's had
    succeeded, a failed leg that says why (a leg after a timeout is not run: ``n/a``): the
    verification still gets its verdict, and ``verification.json`` its evidence."""
    try:
        return leg()
    except LegNotRun as exc:
        return Leg(name, str(run_dir), expected, None, None, dict(evidence or {}), note=exc.message)
    except RunFailedError as exc:
        return Leg(name, str(run_dir), expected, "FAILED", False, dict(evidence or {}), note=exc.message)


def _stop_and_resume(run: Runner, run_dir: Path, reference: Path, step: int) -> Leg:
    stopped = run.leg(
        "resume", Controls(run_dir=run_dir, stop_after=step), label=f"resume (stop after step {step})"
    )
    require_status(stopped, "stopped", "resume")
    checkpoint = stopped / TRAINER_OUTPUT / f"checkpoint-{step}"
    if not checkpoint.is_dir():
        raise RunFailedError(
            f"the stopped run left no Trainer checkpoint at {checkpoint}",
            source=str(stopped),
            fix="see verify.log in the verification directory",
        )
    run.leg(
        "resume",
        Controls(run_dir=run_dir, resume_from=checkpoint),
        label=f"resume (Trainer resume_from_checkpoint at step {step})",
    )
    require_status(stopped, "completed", "resume")
    leg = _judge("resume", reference, stopped, "IDENTICAL")
    leg.evidence["resumed_at"] = step
    if leg.verdict == "IDENTICAL":
        leg.note = f"the Trainer's own resume_from_checkpoint at step {step} is exact here"
    return leg
