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
leg says what it must and the control parted (an inconclusive control makes no PASS);
``verification.json`` keeps the evidence, ``verify.log`` the output.
Never imports torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from reprotune._errors import InputError, RunFailedError
from reprotune._jsonio import write_json_atomic
from reprotune._proof.command_legs import TRAINER_OUTPUT, Runner, parse_command
from reprotune._proof.legs import LegPlan, Step, run_legs
from reprotune._proof.verification import (
    Leg,
    Verification,
    command_verification,
    judge_data_order_control,
    judge_leg,
)
from reprotune._run.layout import RunLayout, VerifyLayout
from reprotune._run.ledger import read_ledger
from reprotune._run.outputs import refuse_nonempty_dir, removed_if_refused
from reprotune._run.record import Status, read_record
from reprotune.integrations.controls import Controls


def verify_command(
    command: str,
    out_dir: Path,
    *,
    resume_at: int | None = None,
    cwd: Path | None = None,
    progress: Callable[[str], None] = lambda line: print(line, flush=True),
) -> Verification:
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
        RunFailedError: the reference leg's command failed (a later leg's failure, or its
            timeout, is a FAILED leg of the verification).
    """
    argv = parse_command(command)
    if resume_at is not None and (isinstance(resume_at, bool) or resume_at < 1):
        raise InputError(
            f"--resume-at {resume_at!r} is not a step >= 1", source="--resume-at", fix="e.g. --resume-at 10"
        )
    refuse_nonempty_dir(out_dir, option="--out")
    layout = VerifyLayout(out_dir)
    run = Runner(argv, layout.log, cwd or Path.cwd(), progress)
    # A refusal up to the reference's checks leaves nothing behind; after them the reference is
    # evidence to keep (a later leg's failure is a FAILED leg).
    with removed_if_refused(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        reference = run.leg("reference", Controls(run_dir=layout.leg("reference")))
        require_status(reference, "completed", "reference")
        if resume_at is not None:
            _check_resume_at(reference, resume_at)
    return _verify(run, layout, reference, command, resume_at)


def _verify(
    run: Runner, layout: VerifyLayout, reference: Path, command: str, resume_at: int | None
) -> Verification:
    """The legs after the reference, judged, and the verification record (:func:`verify_command`)."""
    started = time.perf_counter()
    legs = run_legs(command_legs(layout, reference, resume_at), run.leg)
    wall = time.perf_counter() - started
    result = command_verification(legs, layout.root, command, reference, wall_s=wall, resume_at=resume_at)
    write_json_atomic(layout.verification, result.to_json())
    return result


def command_legs(layout: VerifyLayout, reference: Path, resume_at: int | None) -> list[LegPlan[Controls]]:
    """The legs of a command's verification after its reference: ``rerun``, ``control-data-seed``
    and, with ``resume_at``, ``resume`` (stopped after that step, then resumed by the Trainer)."""
    rerun, control = layout.leg("rerun").resolve(), layout.leg("control-data-seed").resolve()
    legs = [
        LegPlan(
            "rerun", rerun, "IDENTICAL", (Step(Controls(run_dir=rerun)),), lambda leg: _judge(leg, reference)
        ),
        LegPlan(
            "control-data-seed",
            control,
            "DIVERGED",
            (Step(Controls(run_dir=control, perturb_data_seed=1)),),
            lambda leg: _judge_data_seed_control(leg, reference),
        ),
    ]
    if resume_at is not None:
        legs.append(_resume_leg(layout.leg("resume").resolve(), reference, resume_at))
    return legs


def require_status(run_dir: Path, status: Status, leg: str) -> None:
    found = read_record(run_dir).status
    if found != status:
        raise RunFailedError(
            f"the {leg} leg's run ended with status {found!r}, not {status!r}",
            source=str(RunLayout(run_dir).record),
            fix="see verify.log in the verification directory",
        )


def _judge(leg: Leg, reference: Path) -> Leg:
    leg, comparison = judge_leg(leg, reference)
    if comparison.incomparable:
        return replace(leg, note=f"incomparable: {comparison.incomparable[0]}")
    if leg.verdict != "IDENTICAL" and comparison.causes:
        return replace(leg, note=f"why: {comparison.causes[0]}")
    return leg


def _judge_data_seed_control(leg: Leg, reference: Path) -> Leg:
    leg, comparison = judge_data_order_control(leg, reference)
    if comparison.incomparable:
        return replace(leg, note=f"incomparable: {comparison.incomparable[0]}")
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


def _resume_leg(run_dir: Path, reference: Path, step: int) -> LegPlan[Controls]:
    """Stopped by the callback after ``step`` (a Trainer checkpoint saved), then the command
    again, resuming with the Trainer's own ``resume_from_checkpoint``: IDENTICAL to the reference
    when the Trainer's resume is exact here."""
    checkpoint = run_dir / TRAINER_OUTPUT / f"checkpoint-{step}"

    def stopped_with_a_checkpoint() -> None:
        require_status(run_dir, "stopped", "resume")
        if not checkpoint.is_dir():
            raise RunFailedError(
                f"the stopped run left no Trainer checkpoint at {checkpoint}",
                source=str(run_dir),
                fix="see verify.log in the verification directory",
            )

    def judge(leg: Leg) -> Leg:
        leg = _judge(leg, reference)
        if leg.verdict == "IDENTICAL":
            return replace(leg, note=f"the Trainer's own resume_from_checkpoint at step {step} is exact here")
        return leg

    steps = (
        Step(
            Controls(run_dir=run_dir, stop_after=step),
            label=f"resume (stop after step {step})",
            after=stopped_with_a_checkpoint,
        ),
        Step(
            Controls(run_dir=run_dir, resume_from=checkpoint),
            label=f"resume (Trainer resume_from_checkpoint at step {step})",
            after=lambda: require_status(run_dir, "completed", "resume"),
        ),
    )
    return LegPlan("resume", run_dir, "IDENTICAL", steps, judge, evidence={"resumed_at": step})
