"""``reprotune verify RUN_DIR --spot``: check an existing run for a fraction of its cost.

The run already holds what a cheaper proof needs: checkpoints at known steps with every RNG state
and the data position, and a ledger with each step's exact bits. The states are the initial one
(step 0), each checkpoint that verifies, and the end. Intervals between consecutive states are
chosen (:func:`plan_intervals`): always the first (from the initial state: the LoRA init and the
start of the data order), always the last (it ends at the adapter), the rest drawn with a
recorded seed while they fit in the budget (a share of the run's steps). Each is replayed in one
fresh process (``_proof.replay``) and must give, bit for bit, every ledger line of its steps and
the state at its end: the next checkpoint's weights, optimizer and RNG files (their sha256 in its
``state.json``), or the adapter for the last. Negative controls show the check can fail: the
first interval with the data-order seed perturbed, and a resume from a replayed checkpoint without
its RNG states, each stopped as soon as it parts.

What it proves: a fault that touches every step (a nondeterministic kernel, a changed library) is
caught by any interval; a fault confined to one interval is caught when that interval is drawn:
with probability (intervals replayed) / (intervals in the run) for an interval picked at random.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from reprotune._determinism.seeds import SEED_LIMIT
from reprotune._errors import InputError
from reprotune._jsonio import write_json_atomic
from reprotune._proof.bundle import builtin_data
from reprotune._proof.intervals import (
    DEFAULT_BUDGET,
    Interval,
    adapter_state,
    coverage,
    judge_interval,
    plan_intervals,
)
from reprotune._proof.processes import run_logged
from reprotune._proof.rerun import checked_before_rerun
from reprotune._proof.spot_inputs import check_base_model, run_file_legs
from reprotune._proof.spot_plan import PlannedControl, PlannedInterval, ResumeControl, SeedControl, SpotPlan
from reprotune._proof.unpack import named_in_the_bundle, unpack
from reprotune._proof.verification import (
    Leg,
    Verification,
    inconclusive_without_dropout,
    judge_leg,
    machine_summary,
    outcome,
    progress_line,
    recorded_total_steps,
    run_seconds,
)
from reprotune._run.checkpoint_files import (
    checkpoint_dir,
    list_checkpoints,
    read_state_file,
    verify_checkpoint,
)
from reprotune._run.layout import RunLayout, VerifyLayout
from reprotune._run.ledger import read_ledger
from reprotune._run.outputs import refuse_nonempty_dir, refuse_overwrite
from reprotune._run.record import load_record, read_record, status_of
from reprotune._run.rundir import check_is_run_dir


def spot_verify(
    run_dir: Path,
    out_dir: Path,
    *,
    budget: float = DEFAULT_BUDGET,
    seed: int = 0,
    progress: Callable[[str], None] = lambda line: print(line, flush=True),
    data: Path | str | None = None,
    bundle: Path | None = None,
    allow_code_drift: bool = False,
    code_dir: Path | None = None,
) -> Verification:
    """Replay sampled intervals of the completed run in ``run_dir`` into ``out_dir``; judge them.

    Before anything is replayed, as ``rerun`` does: the data is checked against the run's split
    manifest, the code here (``code_dir``, default the current directory) against the record
    (refused unless ``allow_code_drift``), environment differences are reported; and the base
    model and the run's ledger and adapter files, as ``_proof.spot_inputs`` says.

    Args:
        data: the data file (or ``builtin:`` name) to train on instead of the recorded path (a
            bundle's), checked against the run's split manifest as the run is set up.
        bundle: the bundle ``run_dir`` was unpacked from (into ``out_dir``), for the record.

    Raises:
        InputError: not a completed single-process run directory, a bad budget, ``out_dir`` not
            new (unless ``bundle``), code drift, a base model not here, or the replay's refusal.
        RunFailedError: the data is not the run's, or the replay process failed.
    """
    reference = run_dir.resolve()
    if bundle is None:  # a bundle's run is unpacked into out_dir by design
        refuse_overwrite(out_dir, reads=[reference], option="--out")
    record = _check_run(reference, budget)
    code_dir = (code_dir or Path.cwd()).resolve()
    checked_before_rerun(
        reference,
        record,
        data=data,
        code_dir=code_dir,
        allow_code_drift=allow_code_drift,
        what="spot-checking it",
        report=progress,
    )
    total = recorded_total_steps(reference)
    states, refused = _checkpoints(reference, total, progress)
    refused += run_file_legs(reference, progress)
    intervals = plan_intervals(states, total, budget=budget, seed=seed)
    if bundle is None:
        _new_dir(out_dir)
    layout = VerifyLayout(out_dir)
    plan = _plan(reference, out_dir, intervals, total, record, data, code_dir, allow_code_drift)
    plan.write(out_dir)
    replayed = sum(i.steps for i in intervals)
    progress(
        f"verify --spot: {len(intervals)} of {len(states) + 1} intervals, {replayed} of {total} steps "
        f"(budget {budget:g}, seed {seed}), replayed in one fresh process"
    )
    started = time.perf_counter()
    run_logged([str(out_dir)], layout.log, module="reprotune._proof.replay", bad_input=True)
    legs = [_judge_interval(reference, i, plan, total) for i in intervals]
    legs += [_judge_control(reference, c) for c in plan.controls] + _skipped(plan) + refused
    for leg in legs:
        progress(progress_line(leg))
    spot = coverage(intervals, states, total, budget, seed)
    if bundle is not None:
        spot["bundle"] = str(bundle)
    result = Verification(
        outcome(legs),
        str(out_dir),
        str(record.get("config_sha256", "")),
        legs,
        mode="spot",
        reference=str(reference),
        reference_s=run_seconds(reference),
        machine=machine_summary(),
        wall_s=time.perf_counter() - started,
        spot=spot,
    )
    write_json_atomic(layout.verification, result.to_json())
    return result


def _check_run(run_dir: Path, budget: float) -> dict[str, Any]:
    if not (0 < budget <= 1):
        raise InputError(
            f"--budget {budget!r} is not a share of the run's steps in (0, 1]",
            source="--budget",
            fix="pass e.g. --budget 0.2 (a fifth of the steps)",
        )
    check_is_run_dir(run_dir, option="RUN_DIR")
    record = load_record(RunLayout(run_dir).record)
    read_ledger(RunLayout(run_dir).ledger)  # a malformed ledger is refused before any replay
    if status_of(record) != "completed":
        raise InputError(
            f"the run in {run_dir} did not complete (status {record.get('status')!r})",
            source=str(RunLayout(run_dir).record),
            fix=f"resume it first: `reprotune resume {run_dir}`",
        )
    if "distributed" in record or "trainer" in (record.get("config") or {}):
        trainer = "trainer" in (record.get("config") or {})
        raise InputError(
            f"--spot replays runs made by `reprotune run` in one process; {run_dir} was made "
            + ("by a Trainer script" if trainer else "under torchrun"),
            source=str(RunLayout(run_dir).record),
            fix='spot-check the script with its own checkpoints: `reprotune verify --command "python '
            'train.py ..." --spot`'
            if trainer
            else "verify it in full: `reprotune verify CONFIG --reference RUN_DIR`",
        )
    check_base_model(record, run_dir)  # every replay loads it: refused before anything is written
    return record


def _skipped(plan: SpotPlan) -> list[Leg]:
    """The RNG-skip control when no interval resumes (no checkpoint before the end): said, not run."""
    if any(isinstance(c, ResumeControl) for c in plan.controls):
        return []
    note = "skipped: no interval starts at a checkpoint (none before the run's end); set train.save_every"
    return [Leg("control-resume", "", "DIVERGED", note=note)]


def _checkpoints(run_dir: Path, total: int, progress: Callable[[str], None]) -> tuple[list[int], list[Leg]]:
    """The steps of the run's checkpoints before its end that verify, and a failed leg for each one
    that does not: a checkpoint written wrong (or damaged since) cannot be replayed from or checked
    against, so the fault it holds would go unseen; the verification fails and says which."""
    steps, refused = [], []
    for path in list_checkpoints(RunLayout(run_dir).checkpoints):
        problem = verify_checkpoint(path)
        if problem is None:
            step = read_state_file(path).step
            steps += [step] if step < total else []
            continue
        progress(f"warning: checkpoint {path} is refused: {problem}; its intervals cannot be checked")
        note = f"refused: {problem}; no interval starts or ends at it, so what it holds is not checked"
        refused.append(Leg(f"checkpoint {path.name}", "", "IDENTICAL", passed=False, note=note))
    return steps, refused


def _new_dir(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise InputError(
            f"verification directory {out_dir} is not new and empty",
            source="--out",
            fix="choose a new --out directory",
        )
    out_dir.mkdir(parents=True, exist_ok=True)


def _plan(
    reference: Path,
    out_dir: Path,
    intervals: list[Interval],
    total: int,
    record: dict[str, Any],
    data: Path | str | None,
    code_dir: Path,
    allow_code_drift: bool,
) -> SpotPlan:
    """The intervals and controls, each with its run directory under ``out_dir``, and where the
    replay finds the data (``data``: instead of the recorded path) and the code."""
    root = out_dir.resolve()
    planned = [
        PlannedInterval(start=i.start, end=i.end, why=i.why, run_dir=str(i.leg_dir(root))) for i in intervals
    ]
    seeds = record.get("seeds") or {}
    overrides = {**((record.get("config") or {}).get("seed", {}).get("overrides") or {})}
    overrides["data_order"] = (int(seeds.get("data_order", 0)) + 1) % SEED_LIMIT  # 2**63 - 1 wraps to 0
    bound = min(intervals[0].end, 3)
    controls: list[PlannedControl] = [
        SeedControl(run_dir=str(root / "control-seed"), overrides=overrides, bound=bound)
    ]
    resumed = [i for i in intervals if i.start > 0]
    if resumed:
        start = resumed[0].start
        controls.append(
            ResumeControl(
                run_dir=str(root / "control-resume"),
                start=start,
                bound=min(total, start + 3),
            )
        )
    return SpotPlan(
        reference=str(reference),
        total_steps=total,
        intervals=planned,
        controls=controls,
        data=None if data is None else str(data),
        code_dir=str(code_dir),
        allow_code_drift=allow_code_drift,
    )


def _judge_interval(reference: Path, interval: Interval, plan: SpotPlan, total: int) -> Leg:
    run_dir = Path(next(p.run_dir for p in plan.intervals if p.start == interval.start))
    origin = "the initial state" if interval.start == 0 else f"checkpoint {interval.start}"
    end_state = _end_state(reference, run_dir, interval.end, total)
    leg, first = judge_interval(reference, run_dir, interval, origin=origin, end_state=end_state)
    if first is not None and first[0] > 0:
        leg = replace(leg, note=f"{leg.note}; {_trace_hint(reference, first[0], plan)}")
    return leg


def _trace_hint(reference: Path, step: int, plan: SpotPlan) -> str:
    """The ``reprotune trace`` commands that find the first op of ``step`` that differs."""
    made = "on the machine that made the run" if plan.data else "for the run"
    here = shlex.quote(str(reference))
    return (
        f"to find the first op that differs, {made}: `reprotune trace RUN_DIR --step {step} --out "
        f"A-step-{step}.trace.jsonl`; here: `reprotune trace {here} --step {step} --out "
        f"B-step-{step}.trace.jsonl`; then `reprotune compare A-step-{step}.trace.jsonl "
        f"B-step-{step}.trace.jsonl`"
    )


def _end_state(reference: Path, replay: Path, end: int, total: int) -> tuple[str, bool]:
    """What the interval's end state was checked against, and whether it matched."""
    if end == total:
        return adapter_state(reference, replay)
    ours_dir = checkpoint_dir(RunLayout(replay).checkpoints, end)
    problem = verify_checkpoint(ours_dir)  # the reference's were verified before any replay
    if problem is not None:
        return f"checkpoint {end} of the replay is refused: {problem}", False
    ours = read_state_file(ours_dir)
    theirs = read_state_file(checkpoint_dir(RunLayout(reference).checkpoints, end))
    differing = [k for k in ("step", "position", "files") if getattr(ours, k) != getattr(theirs, k)]
    if not differing:
        return f"checkpoint {end}: weights, optimizer, scheduler and RNG files identical", True
    other = [
        f for f in sorted(set(ours.files) | set(theirs.files)) if ours.files.get(f) != theirs.files.get(f)
    ]
    return f"checkpoint {end} differs: {', '.join(other) or ', '.join(differing)}", False


def _judge_control(reference: Path, control: PlannedControl) -> Leg:
    leg, _ = judge_leg(Leg(control.name, control.run_dir, "DIVERGED"), reference, prefix=True)
    if isinstance(control, SeedControl):
        return replace(leg, note=f"seed.overrides.data_order={control.overrides['data_order']}")
    leg = replace(leg, note=f"resumed from checkpoint {control.start} without restoring the RNG states")
    lora = read_record(RunLayout(reference).record).config.get("lora") or {}
    return inconclusive_without_dropout(leg, lora.get("dropout")) or leg


def spot_verify_bundle(
    bundle: Path,
    out_dir: Path,
    *,
    budget: float = DEFAULT_BUDGET,
    seed: int = 0,
    progress: Callable[[str], None] = lambda line: print(line, flush=True),
    allow_code_drift: bool = False,
) -> Verification:
    """``verify BUNDLE --spot``: check and unpack the bundle (packed with ``--checkpoints``) into
    ``out_dir/recorded``, then :func:`spot_verify` its run there, on its bundled or builtin data.

    Raises:
        InputError: a damaged bundle, one without checkpoints or data, or ``out_dir`` not new.
    """
    refuse_overwrite(out_dir, reads=[bundle], option="--out")
    refuse_nonempty_dir(out_dir, option="--out")
    unpacked = unpack(bundle, out_dir / "recorded")
    if not list_checkpoints(RunLayout(unpacked.run_dir).checkpoints):
        raise InputError(
            f"the bundle {bundle} holds no checkpoints: --spot replays the intervals between them",
            source=str(bundle),
            fix=f"pack the run with `reprotune pack RUN_DIR -o {bundle.name} --checkpoints`, or rerun the "
            f"bundle in full: `reprotune rerun {bundle}`",
        )
    bundled = unpacked.data.resolve() if unpacked.data is not None else None
    data = bundled or builtin_data(read_record(RunLayout(unpacked.run_dir).record), unpacked.run_dir)
    if data is None:
        raise InputError(
            f"the bundle {bundle} was packed without its data",
            source=str(bundle),
            fix=f"pack the run with --with-data as well: `reprotune pack RUN_DIR -o {bundle.name} "
            "--checkpoints --with-data`",
        )
    try:
        return spot_verify(
            unpacked.run_dir,
            out_dir,
            budget=budget,
            seed=seed,
            progress=progress,
            data=data,
            bundle=bundle,
            allow_code_drift=allow_code_drift,
        )
    except InputError as exc:  # what it names was unpacked into out_dir, removed on a refusal
        if type(exc) is not InputError:
            raise
        raise named_in_the_bundle(exc, unpacked.run_dir.resolve(), bundle) from None
