"""A distributed run's life beyond the loop: joining the ranks, what they settle together before
training, and everything a rank other than 0 does.

``_train.run`` comes here only under torchrun (:func:`run_on_ranks`, :func:`resume_on_ranks`).
Rank 0 lives the run as a single process does (``_train.attempt``) and writes the run directory;
at the points where it needs the other ranks (the record's fingerprints, the restore, the weights
hash under FSDP, checkpoints, the adapter) the other ranks meet it, in the same order, through
:func:`follow_run`. They write nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from pathlib import Path

from reprotune._config.loading import config_from_dict
from reprotune._config.schema import ExperimentConfig
from reprotune._run.drift import refuse_completed
from reprotune._run.fingerprint import attention_of, environment_fingerprint
from reprotune._run.layout import RunLayout
from reprotune._run.ranks import resume_world_change
from reprotune._run.record import Status, read_record
from reprotune._train.attempt import RankZero, resume_attempt, start_run
from reprotune._train.dist_checkpoint import restore_distributed
from reprotune._train.dist_record import gather_identities
from reprotune._train.dist_strategy import distribute_setup
from reprotune._train.distributed import (
    DistContext,
    is_transport_error,
    lost_rank_error,
    process_group,
)
from reprotune._train.hooks import (
    CheckpointHook,
    LedgerHook,
    Stopwatch,
    hf_progress_bars,
)
from reprotune._train.loop import StepHook, train_loop
from reprotune._train.options import RunOptions, RunResult
from reprotune._train.setup import build_setup
from reprotune._train.strategy import seed_generators, under_torchrun


def torchrun_config(run_dir: Path) -> ExperimentConfig | None:
    """Under torchrun, the config of the run in ``run_dir``, read by every rank (it chooses the
    backend and the device before the ranks can talk); None outside torchrun."""
    if not under_torchrun():
        return None
    record = RunLayout(run_dir).record
    return config_from_dict(read_record(record).config, source=str(record))


def follow_run(cfg: ExperimentConfig, ctx: DistContext, options: RunOptions, *, resume: bool) -> RunResult:
    """The life of rank ``ctx.rank`` > 0: the same setup, collectives and steps as rank 0, no writes.

    Raises:
        InputError: what rank 0 refused (bad input, ranks that disagree), with its message.
        RunFailedError: another rank left the run (its own message says why).
    """
    try:
        with hf_progress_bars(False):
            setup = distribute_setup(build_setup(cfg, manifest=options.manifest), ctx)
        gather_identities(setup, environment_fingerprint(attention=attention_of(setup.model)))
        restored = None
        if resume:
            restore_rng = options.restore_rng_on_resume
            restored = restore_distributed(setup, None, restore_rng=restore_rng, report=lambda _: None)
        start_step = restored.state.step if restored is not None else 0
        if start_step == 0:
            seed_generators(setup)
        ledger = LedgerHook(setup, None, Stopwatch())
        if start_step == 0:
            ledger.write_init()  # under FSDP, rank 0 gathers the weights it hashes
        hooks: list[StepHook] = [ledger, CheckpointHook(setup, None, None)]
        loop = train_loop(
            setup,
            hooks,
            start_step=start_step,
            stop_after_step=options.stop_after_step,
            stop_by_main=bool(options.hooks),  # rank 0 runs them (e.g. --watch-reference): follow it
        )
        if not loop.stopped:
            setup.distribution.adapter_state(setup)  # under FSDP, rank 0 gathers the adapter it saves
    except RuntimeError as exc:
        if not is_transport_error(exc):
            raise
        raise lost_rank_error(ctx, exc) from exc
    status: Status = "stopped" if loop.stopped else "completed"
    return RunResult(
        options.run_dir or Path(), {}, status, loop.steps_done, None, loop.final_val_loss, main=False
    )


def follow_resume(run_dir: Path, cfg: ExperimentConfig, ctx: DistContext, options: RunOptions) -> RunResult:
    """:func:`follow_run` of a resume, after the checks rank 0 makes too (so every rank stops alike).

    Raises:
        InputError: the run is complete, or may not resume at this world size.
    """
    paths = RunLayout(run_dir)
    record = read_record(paths.record)
    refuse_completed(record.status, run_dir)
    resume_world_change(record, ctx.world_size, allow_change=options.allow_world_size_change, run_dir=run_dir)
    # the run's own split, as rank 0 reads it (the config's would differ for a run made with --manifest)
    return follow_run(cfg, ctx, dataclasses.replace(options, manifest=paths.manifest), resume=True)


def run_on_ranks(cfg: ExperimentConfig, options: RunOptions) -> RunResult:
    """``run_experiment`` under torchrun: join the ranks; rank 0 lives the run, the others follow."""
    with process_group(cfg) as dist:
        if dist is not None and not dist.is_main:
            return follow_run(cfg, dist, options, resume=False)
        with _saying_a_rank_left(dist):
            return start_run(cfg, options, _rank_zero(dist))


def resume_on_ranks(run_dir: Path, options: RunOptions) -> RunResult:
    """``resume_run`` under torchrun, at the world size the run trained at unless allowed."""
    with process_group(torchrun_config(run_dir)) as dist:
        if dist is not None and not dist.is_main:
            return follow_resume(run_dir, torchrun_config(run_dir) or ExperimentConfig(), dist, options)
        with _saying_a_rank_left(dist):
            return resume_attempt(run_dir, options, _rank_zero(dist))


@contextlib.contextmanager
def _saying_a_rank_left(dist: DistContext | None) -> Iterator[None]:
    """Rank 0's collectives before and after the loop (the ranks' identities, the restore, the
    adapter's gather) failing because another rank left: said so, not in gloo's words."""
    try:
        yield
    except RuntimeError as exc:
        if dist is None or not is_transport_error(exc):
            raise
        raise lost_rank_error(dist, exc) from exc


def _lost_rank(dist: DistContext, exc: BaseException) -> BaseException | None:
    return lost_rank_error(dist, exc) if is_transport_error(exc) else None


def _rank_zero(dist: DistContext | None) -> RankZero | None:
    if dist is None:
        return None
    return RankZero(
        dist.world_size,
        functools.partial(distribute_setup, ctx=dist),
        lost_rank=functools.partial(_lost_rank, dist),
    )
