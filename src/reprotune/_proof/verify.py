"""``reprotune verify``: prove that a config reproduces, with controls that prove the check can fail.

Every leg runs in fresh processes (``python -m reprotune ...``) into one verification directory.
Two modes, the same strength of evidence:

**fast** (the default; about one run's worth of training beyond the reference):

1. ``reference``: the experiment as configured (or ``--reference``, an existing run of it).
2. ``rerun-resume``: run, stopped after the mid-run checkpoint K, then resumed in a fresh process
   to the end; its whole ledger must be IDENTICAL to the reference. A first divergence at or before
   K blames rerun nondeterminism; after K, the resume.
3. ``control-seed``: one derived seed perturbed; streamed against the reference and stopped once it
   has parted (seen and confirmed one step later); must be DIVERGED within a bounded number of
   steps, else the check is blind.
4. ``control-resume``: the same checkpoint K resumed *without* restoring the RNG states, streamed
   and stopped the same way; must be DIVERGED when anything draws from them after K (dropout).

At world size 1 the controls run beside the rerun's processes (``processes.LegProcesses``): their
process starts and model loads overlap, and training takes turns (``--train-lock``), each
process at the config's thread count, so no leg's numbers depend on the others.

**thorough** (``--thorough``): full-length legs: ``rerun``, ``control-seed``, ``resume`` and
``control-resume``, each run to the end.

With ``eval.generate_at_end``, an ``eval`` leg: the reference's and the rerun's evals, each made in
a fresh process, must be IDENTICAL (``verify_eval``).

The verdict is PASS only when every leg says what it must (an inconclusive leg counts neither
way) and at least one negative control parted: one no control showed able to fail is a FAIL
(``verification.outcome``). ``verification.json`` keeps the
evidence, the mode, what each leg cost (wall time, training time) and the machine.
"""

from __future__ import annotations

import datetime as _dt
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from reprotune._config.loading import dump_config_yaml
from reprotune._config.schema import ExperimentConfig, config_sha256
from reprotune._determinism.seeds import CONSUMERS, SEED_LIMIT, derive_seeds
from reprotune._errors import InputError
from reprotune._jsonio import write_json_atomic
from reprotune._proof.differences import Comparison
from reprotune._proof.legs import LegPlan, Step, run_legs, run_legs_side_by_side
from reprotune._proof.processes import LegProcesses, launched_by_torchrun
from reprotune._proof.processes import run_logged as _reprotune
from reprotune._proof.verification import (
    Expected,
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
from reprotune._proof.verify_eval import eval_leg
from reprotune._proof.world import refuse_a_reference_of_another_launch
from reprotune._run.layout import RunLayout, VerifyLayout
from reprotune._run.outputs import refuse_nonempty_dir, removed_if_refused
from reprotune._run.record import read_record, record_config
from reprotune._run.rundir import check_is_run_dir
from reprotune._train.turn import TURNS_POSSIBLE

_QUIET = ("--no-progress", "--no-tracking")


@dataclass
class _Context:
    """What every leg needs: the verification directory, the config file, the reference."""

    cfg: ExperimentConfig
    paths: VerifyLayout
    reference: Path
    progress: Callable[[str], None]

    def reprotune(self, *args: str) -> float:
        """Run ``python -m reprotune ARGS`` in a fresh process, logged; return its wall time."""
        return _reprotune(args, self.paths.log)

    def launch(self, leg: str, args: Sequence[str], /, *, label: str | None = None) -> None:
        """One step of a leg, one after the other (:func:`_proof.legs.run_legs`, which times it)."""
        if label is not None:
            self.progress(label)
        self.reprotune(*args)

    def judge(self, leg: Leg, *, prefix: bool = False) -> tuple[Leg, Comparison]:
        """The leg compared with the reference: its verdict and evidence; the RNG-skip control of a
        run that cannot show a skipped restore is inconclusive."""
        leg, cmp = judge_leg(leg, self.reference, prefix=prefix)
        if leg.name == "control-resume":
            leg = _inconclusive_control(self.cfg, leg)
        self.progress(progress_line(leg))
        return leg, cmp


def verify_config(
    cfg: ExperimentConfig,
    out_dir: Path,
    *,
    control_seed: str = "data_order",
    resume: bool = True,
    reference: Path | None = None,
    thorough: bool = False,
    progress: Callable[[str], None] = lambda line: print(line, flush=True),
) -> Verification:
    """Run the legs described in the module docstring into ``out_dir`` and judge them.

    Args:
        cfg: the experiment.
        out_dir: the verification directory (new or empty).
        control_seed: the derived seed the negative control perturbs.
        resume: include the resume check and its control.
        reference: an existing completed run of exactly this config to use as the reference leg
            (e.g. the run just made by ``reprotune run``), instead of running one.
        thorough: full-length legs instead of the fast ones.
        progress: where progress lines go.

    Raises:
        InputError: bad options, or a reference run of another config.
        RunFailedError: a leg failed to run.
    """
    _check_options(cfg, out_dir, control_seed, reference)
    paths = VerifyLayout(out_dir)
    ctx = _Context(cfg, paths, reference or paths.leg("reference"), progress)
    # The reference's run refusing the config (what only a run finds: a target module no module
    # matches) is bad input, and leaves nothing behind; after it the reference is evidence to keep.
    with removed_if_refused(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        dump_config_yaml(cfg, paths.config)
        if reference is None:
            progress(f"verify: reference run -> {ctx.reference}")
            _reference_run(ctx, paths)
        else:
            progress(f"verify: reference is the existing run {ctx.reference}")
    total = recorded_total_steps(ctx.reference)
    stop = _resume_point(cfg, total) if resume else None
    started = time.perf_counter()
    legs = (_thorough_legs if thorough else _fast_legs)(ctx, control_seed, stop, total)
    if resume and stop is None:
        legs.append(
            Leg(
                "resume",
                "",
                "IDENTICAL",
                note="skipped: train.save_every gives no checkpoint before the last step; set it to "
                "check exact resume",
            )
        )
    if cfg.eval.generate_at_end:
        rerun = next(leg for leg in legs if leg.name in ("rerun", "rerun-resume"))
        if rerun.verdict == "FAILED":
            legs.append(Leg("eval", "", "IDENTICAL", note=f"not run: the {rerun.name} leg failed"))
        else:
            legs.append(eval_leg(ctx.reference, Path(rerun.run_dir), ctx.reprotune, progress))
    result = Verification(
        outcome(legs),
        str(out_dir),
        config_sha256(cfg),
        legs,
        mode="thorough" if thorough else "fast",
        reference=str(ctx.reference),
        reference_s=run_seconds(ctx.reference),
        machine=machine_summary(),
        wall_s=time.perf_counter() - started,
    )
    write_json_atomic(
        paths.verification,
        {**result.to_json(), "finished_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")},
    )
    return result


def _reference_run(ctx: _Context, paths: VerifyLayout) -> None:
    """The reference leg's run. What only a run refuses is bad input, said of the user's config:
    verify's copy of it, which the run read, is removed with the rest of --out."""
    args = ("run", str(paths.config), "--run-dir", str(ctx.reference), *_QUIET)
    try:
        _reprotune(args, paths.log, bad_input=True)
    except InputError as exc:
        copy = str(paths.config)
        if copy not in exc.message:
            raise
        message = exc.message.replace(copy, "your config (each --set applied)")
        fix = "fix that key in your config (or the --set that sets it), then run verify again"
        raise InputError(message, fix=f"{exc.fix}; {fix}" if exc.fix else fix) from None


def _check_options(cfg: ExperimentConfig, out_dir: Path, control_seed: str, reference: Path | None) -> None:
    """Refuse, before anything runs, an unknown control seed, a reference run of another config,
    or an ``out_dir`` that is not empty (naming an unfinished verification as such)."""
    if control_seed not in CONSUMERS:
        raise InputError(
            f"unknown seed consumer {control_seed!r}",
            source="--control-seed",
            fix=f"choose one of {', '.join(CONSUMERS)}",
        )
    if reference is not None:
        _check_reference(reference, cfg)
    begun = VerifyLayout(out_dir)  # a verification writes its config and log first, its verdict last
    started = begun.config.is_file() or begun.log.is_file()
    if out_dir.is_dir() and started and not begun.verification.exists():
        raise InputError(
            f"verification directory {out_dir} holds a verification that did not finish "
            "(interrupted, or still running): its legs cannot be trusted to continue",
            source="--out",
            fix=f"remove {out_dir} and verify again, or choose a new --out directory",
        )
    refuse_nonempty_dir(out_dir, option="--out")


def _fast_legs(ctx: _Context, control_seed: str, stop: int | None, total: int) -> list[Leg]:
    """rerun-resume (one full-length leg) and the two controls, stopped once they part.

    Outside torchrun the controls start beside the rerun's two processes (the seed control with
    the first, the RNG-skip control with the resume, from a copy of its checkpoint): process
    starts and model loads overlap, and training takes turns, each at the config's thread count.
    """
    bound = _control_bound(ctx.cfg, total)
    together = not launched_by_torchrun() and TURNS_POSSIBLE
    name = "rerun" if stop is None else "rerun-resume"
    rerun_dir = ctx.paths.leg(name)
    first = ["run", str(ctx.paths.config), "--run-dir", str(rerun_dir), *_QUIET]
    steps: list[Step[Sequence[str]]] = [Step(first, label="verify: rerun in a fresh process")]
    if stop is not None:
        control_dir = ctx.paths.leg("control-resume")

        def copy_for_the_control() -> None:  # the RNG-skip control resumes this very checkpoint
            shutil.copytree(rerun_dir, control_dir, symlinks=True)

        label = f"verify: rerun stopped after step {stop}, resumed in a fresh process"
        stopped: Step[Sequence[str]] = Step(
            [*first, "--stop-after-step", str(stop)], label=label, after=copy_for_the_control
        )
        steps = [stopped, Step(["resume", str(rerun_dir), *_QUIET])]

    def judge_rerun(leg: Leg) -> Leg:
        leg, cmp = ctx.judge(leg)
        at = cmp.where.first_divergence_step
        if stop is None or at is None:
            return leg
        blamed = "rerun nondeterminism (at or before the resume point)" if at <= stop else "the resume"
        return replace(leg, note=f"first divergence at step {at}, resume point {stop}: blames {blamed}")

    plans: list[LegPlan[Sequence[str]]] = [
        LegPlan(name, rerun_dir, "IDENTICAL", tuple(steps), judge_rerun),
        _seed_control(ctx, control_seed, bound=_control_bound(ctx.cfg, total, control_seed)),
    ]
    if stop is not None:
        plans.append(_resume_control(ctx, stop, name, bound=min(total, stop + bound)))
    if together:
        ctx.progress("verify: the controls run beside the rerun, training in turns")
    with LegProcesses(ctx.paths.log, together=together) as processes:
        return run_legs_side_by_side(plans, processes, ctx.progress)


def _seed_control(ctx: _Context, consumer: str, *, bound: int | None) -> LegPlan[Sequence[str]]:
    """The seed control: one derived seed perturbed; streamed and stopped once it parts within
    ``bound`` steps (to the end when ``bound`` is None); blind when nothing parted."""
    seeds = derive_seeds(ctx.cfg.seed.root, dict(ctx.cfg.seed.overrides))
    perturbed = (seeds[consumer] + 1) % SEED_LIMIT  # a seed still: 2**63 - 1 wraps to 0
    override = f"seed.overrides.{consumer}={perturbed}"
    run_dir = ctx.paths.leg("control-seed")
    command = ["run", str(ctx.paths.config), "--run-dir", str(run_dir), "--set", override]
    watched = bound is not None

    def judge(leg: Leg) -> Leg:
        leg, _ = ctx.judge(leg, prefix=watched)
        if watched and not leg.passed:
            blind = f"nothing differed within {bound} steps: the check is blind to this seed"
            return replace(leg, note=f"{leg.note}; {blind}")
        return leg

    step: Step[Sequence[str]] = Step(
        [*command, *(_watch(ctx, bound) if bound is not None else []), *_QUIET],
        label=f"verify: negative control, seed {consumer} {seeds[consumer]} -> {perturbed}",
    )
    return LegPlan("control-seed", run_dir, "DIVERGED", (step,), judge, note=override)


def _resume_control(ctx: _Context, stop: int, rerun: str, *, bound: int) -> LegPlan[Sequence[str]]:
    """The RNG-skip control: the copy of the rerun's checkpoint at ``stop`` (taken as the rerun's
    first process ends, before its resume starts) resumed without restoring the RNG states;
    streamed, stopped once it parts."""
    run_dir = ctx.paths.leg("control-resume")
    step: Step[Sequence[str]] = Step(
        ["resume", str(run_dir), "--skip-rng-restore", *_watch(ctx, bound), *_QUIET],
        label=f"verify: negative control, resume from step {stop} without restoring the RNG states",
        waits_for=(rerun, 1),
    )
    return LegPlan(
        "control-resume",
        run_dir,
        "DIVERGED",
        (step,),
        lambda leg: ctx.judge(leg, prefix=True)[0],
        trains_from=stop,  # it resumed a copy of the checkpoint: the steps before are not its own
    )


def _thorough_legs(ctx: _Context, control_seed: str, stop: int | None, total: int) -> list[Leg]:
    """Full-length legs, one after the other: rerun, seed control, resume, RNG-skip control."""
    config = str(ctx.paths.config)
    rerun_dir = ctx.paths.leg("rerun")
    rerun: Step[Sequence[str]] = Step(
        ["run", config, "--run-dir", str(rerun_dir), *_QUIET], label="verify: rerun in a fresh process"
    )
    plans: list[LegPlan[Sequence[str]]] = [
        LegPlan("rerun", rerun_dir, "IDENTICAL", (rerun,), lambda leg: ctx.judge(leg)[0]),
        _seed_control(ctx, control_seed, bound=None),
    ]
    resumes: tuple[tuple[str, list[str], Expected], ...] = (
        ("resume", [], "IDENTICAL"),
        ("control-resume", ["--skip-rng-restore"], "DIVERGED"),
    )
    for name, extra, expected in resumes if stop is not None else ():
        run_dir = str(ctx.paths.leg(name))
        steps: tuple[Step[Sequence[str]], ...] = (
            Step(
                ["run", config, "--run-dir", run_dir, "--stop-after-step", str(stop), *_QUIET],
                label=f"verify: {name}: stop after step {stop}, resume in a fresh process",
            ),
            Step(["resume", run_dir, *_QUIET, *extra]),
        )
        plans.append(LegPlan(name, Path(run_dir), expected, steps, lambda leg: ctx.judge(leg)[0]))
    return run_legs(plans, ctx.launch)


def _watch(ctx: _Context, bound: int) -> list[str]:
    return ["--watch-reference", str(ctx.reference), "--watch-bound", str(bound)]


def _inconclusive_control(cfg: ExperimentConfig, leg: Leg) -> Leg:
    inconclusive = inconclusive_without_dropout(leg, cfg.lora.dropout)
    if inconclusive is not None:
        return inconclusive
    if not leg.passed and launched_by_torchrun():
        return replace(
            leg,
            passed=None,
            note="inconclusive: a distributed run reseeds dropout for every micro-batch from (seed, "
            "step, micro-batch), so no RNG state carries past a checkpoint for a skipped restore to "
            "change (docs/distributed.md)",
        )
    return leg


def _control_bound(cfg: ExperimentConfig, total: int, consumer: str | None = None) -> int:
    """Steps a control may run before it must have parted: a few, or up to the first validation
    pass (the last step when ``eval_every`` is 0) when only validation can show the difference
    (the ``eval`` seed)."""
    every = cfg.train.eval_every or 0
    if consumer == "eval" and not every:
        return total
    return min(total, max(3, every + 1 if every else 3))


def _check_reference(run_dir: Path, cfg: ExperimentConfig) -> None:
    """Refuse a reference run that is unfinished or of another config (tracking settings aside)."""
    check_is_run_dir(run_dir, option="--reference")
    record = read_record(RunLayout(run_dir).record)
    if record.status != "completed":
        raise InputError(
            f"reference run {run_dir} is not complete (status {record.status!r})",
            source="--reference",
            fix="resume it first, or leave --reference out",
        )
    refuse_a_reference_of_another_launch(run_dir, record.distributed)
    recorded = record_config(record, run_dir=run_dir, source=str(RunLayout(run_dir).record))
    if record.config_sha256 != config_sha256(cfg) and _numbers_config(recorded) != _numbers_config(cfg):
        raise InputError(
            f"reference run {run_dir} was made from another config",
            source="--reference",
            fix="pass the same config (and --set overrides) the reference was run with",
        )


def _numbers_config(cfg: ExperimentConfig) -> str:
    """The config's identity without ``tracking``, which cannot change the numbers (compare treats
    it so): a reference mirrored elsewhere, or not at all, is still a reference of this config."""
    return config_sha256(cfg.model_copy(update={"tracking": type(cfg.tracking)()}))


def _resume_point(cfg: ExperimentConfig, total_steps: int) -> int | None:
    """The checkpoint step nearest the middle of the run, or None when there is none before the end."""
    every = cfg.train.save_every
    if not every:
        return None
    candidates = [s for s in range(every, total_steps, every)]
    if not candidates:
        return None
    return min(candidates, key=lambda s: abs(s - total_steps / 2))
