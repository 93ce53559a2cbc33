"""``reprotune verify --command "python train.py ..." --spot``: a user's Trainer script, checked by
replaying sampled intervals between the Trainer's own checkpoints.

The reference leg runs the command as given (its Trainer saving checkpoints by its own
``save_steps``). The intervals between its checkpoints are chosen as ``_proof.spot`` chooses them
(the first from the initial state, the last to the end, the rest drawn with the seed within the
budget); each is the command again in a fresh process, steered by ``ReprotuneCallback``'s controls:
the first stopped after its last step, every other resumed from a copy of its starting checkpoint
through the Trainer's own ``resume_from_checkpoint`` and stopped at its end (the callback saves a
checkpoint there). Each must give the reference's ledger lines of its steps bit for bit, and its
end state: the Trainer checkpoint's weights, optimizer, scheduler, scaler and RNG files, or the
adapter for the last. The data-seed control, cut to a few steps, shows the check can fail.
Never imports torch.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from reprotune._errors import InputError
from reprotune._jsonio import sha256_file, write_json_atomic
from reprotune._proof.command_legs import TRAINER_OUTPUT, Runner, parse_command
from reprotune._proof.intervals import Interval, adapter_state, coverage, judge_interval, plan_intervals
from reprotune._proof.legs import LegPlan, Step, run_legs
from reprotune._proof.verification import Leg, Verification, command_verification, judge_data_order_control
from reprotune._proof.verify_command import require_status
from reprotune._run.layout import LOCK, RunLayout, VerifyLayout
from reprotune._run.ledger import read_ledger
from reprotune._run.outputs import refuse_nonempty_dir, removed_if_refused
from reprotune._run.record import write_stopped_copy
from reprotune.integrations.controls import Controls

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
#: The files of a Trainer checkpoint that hold the state a resume continues from (the rest,
#: ``trainer_state.json`` with its wall times and ``training_args.bin`` with its paths, differ
#: between any two runs).
STATE_FILES = re.compile(
    r"^(adapter_model\.safetensors|model\.safetensors|optimizer\.pt|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth)$"
)


def trainer_checkpoints(run_dir: Path) -> dict[int, Path]:
    """The Trainer checkpoints a leg's Trainer wrote, by step."""
    output = run_dir / TRAINER_OUTPUT
    found = {}
    for path in output.iterdir() if output.is_dir() else []:
        match = _CHECKPOINT.match(path.name)
        if match and path.is_dir():
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def state_hashes(checkpoint: Path) -> dict[str, str]:
    """The sha256 of each state file of a Trainer checkpoint (:data:`STATE_FILES`)."""
    return {p.name: sha256_file(p) for p in sorted(checkpoint.iterdir()) if STATE_FILES.match(p.name)}


def spot_verify_command(
    command: str,
    out_dir: Path,
    *,
    budget: float,
    seed: int,
    cwd: Path | None = None,
    progress: Callable[[str], None] = lambda line: print(line, flush=True),
) -> Verification:
    """Run the reference leg, then replay the chosen intervals and the control; judge them.

    Raises:
        InputError: a bad command, budget or ``out_dir``.
        RunFailedError: the command failed, or wrote no run directory.
    """
    argv = parse_command(command)
    if not (0 < budget <= 1):
        raise InputError(f"--budget {budget!r} is not in (0, 1]", source="--budget", fix="e.g. --budget 0.2")
    refuse_nonempty_dir(out_dir, option="--out")
    layout = VerifyLayout(out_dir)
    run = Runner(argv, layout.log, cwd or Path.cwd(), progress)
    with removed_if_refused(out_dir):  # a refusal up to the reference's check leaves nothing behind
        out_dir.mkdir(parents=True, exist_ok=True)
        reference = run.leg("reference", Controls(run_dir=layout.leg("reference")))
        require_status(reference, "completed", "reference")
    return _spot(run, layout, reference, command, budget, seed, progress)


def _spot(
    run: Runner,
    layout: VerifyLayout,
    reference: Path,
    command: str,
    budget: float,
    seed: int,
    progress: Callable[[str], None],
) -> Verification:
    """The intervals after the reference and the control, judged (see :func:`spot_verify_command`)."""
    out_dir = layout.root
    total = len(read_ledger(RunLayout(reference).ledger).train)
    checkpoints = {s: p for s, p in trainer_checkpoints(reference).items() if s < total}
    intervals = plan_intervals(list(checkpoints), total, budget=budget, seed=seed)
    progress(
        f"verify --command --spot: {len(intervals)} of {len(checkpoints) + 1} intervals between the "
        f"Trainer's checkpoints, {sum(i.steps for i in intervals)} of {total} steps"
    )
    started = time.perf_counter()
    plans = [_interval_leg(run, out_dir, reference, checkpoints, i, total) for i in intervals]
    plans.append(_control_leg(reference, layout.leg("control-data-seed").resolve(), total))
    legs = run_legs(plans, run.leg)
    spot = coverage(intervals, list(checkpoints), total, budget, seed)
    result = command_verification(
        legs, out_dir, command, reference, wall_s=time.perf_counter() - started, spot=spot
    )
    write_json_atomic(layout.verification, result.to_json())
    return result


def _interval_leg(
    run: Runner, out_dir: Path, reference: Path, checkpoints: dict[int, Path], interval: Interval, total: int
) -> LegPlan[Controls]:
    """The command again over one interval: from the start, or resumed from a copy of the
    reference's checkpoint at its start; stopped at its end (the callback saves a checkpoint)."""
    name, leg_dir = interval.name, interval.leg_dir(out_dir).resolve()
    stop = interval.end if interval.end < total else None
    if interval.start == 0:
        step = Step(Controls(run_dir=leg_dir, stop_after=stop))
    else:
        start = checkpoints[interval.start]

        def prepare() -> None:
            run.refuse_after_timeout()  # before copying the reference for a leg that will not run
            _prepare_resume(reference, start, leg_dir)

        resume_from = leg_dir / TRAINER_OUTPUT / start.name
        step = Step(Controls(run_dir=leg_dir, resume_from=resume_from, stop_after=stop), before=prepare)
    origin = "the initial state" if interval.start == 0 else f"Trainer checkpoint-{interval.start}"

    def judge(_: Leg) -> Leg:
        end_state = _end_state(reference, leg_dir, interval.end, total)
        return judge_interval(reference, leg_dir, interval, origin=origin, end_state=end_state)[0]

    evidence = {"from": interval.start, "to": interval.end, "steps": interval.steps}
    return LegPlan(name, leg_dir, "IDENTICAL", (step,), judge, evidence=evidence, trains_from=interval.start)


def _prepare_resume(reference: Path, checkpoint: Path, leg_dir: Path) -> Path:
    """A copy of the reference's run directory (record ``stopped``) and of the one checkpoint the
    interval starts from, for the callback to resume into; the checkpoint's path in the copy."""
    shutil.copytree(reference, leg_dir, ignore=shutil.ignore_patterns(TRAINER_OUTPUT, LOCK))
    write_stopped_copy(RunLayout(leg_dir).record, RunLayout(leg_dir).record)
    target = leg_dir / TRAINER_OUTPUT / checkpoint.name
    shutil.copytree(checkpoint, target)
    return target


def _end_state(reference: Path, leg_dir: Path, end: int, total: int) -> tuple[str, bool]:
    if end == total:
        return adapter_state(reference, leg_dir)
    ours_dir, theirs_dir = trainer_checkpoints(leg_dir).get(end), trainer_checkpoints(reference).get(end)
    if ours_dir is None or theirs_dir is None:
        return f"no Trainer checkpoint-{end} to compare", False
    ours, theirs = state_hashes(ours_dir), state_hashes(theirs_dir)
    differing = [f for f in sorted(set(ours) | set(theirs)) if ours.get(f) != theirs.get(f)]
    if not differing:
        return f"Trainer checkpoint-{end}: {', '.join(sorted(ours))} identical", True
    return f"Trainer checkpoint-{end} differs: {', '.join(differing)}", False


def _control_leg(reference: Path, control_dir: Path, total: int) -> LegPlan[Controls]:
    """The data-order seed perturbed, stopped after a few steps: it must part (the check can fail)."""
    bound = min(total, 3)
    controls = Controls(run_dir=control_dir, perturb_data_seed=1, stop_after=bound if bound < total else None)
    return LegPlan(
        "control-data-seed",
        control_dir,
        "DIVERGED",
        (Step(controls),),
        lambda leg: judge_data_order_control(leg, reference, prefix=True)[0],  # it stops once it parts
    )
