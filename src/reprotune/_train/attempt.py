"""One attempt of ``reprotune run`` or ``reprotune resume`` (a plain run, or rank 0 of a torchrun
world): a run's life, from its directory to its record.

1. claim the run directory and write the first record (status ``running``) and ``config.yaml``;
2. build the setup (``_train.setup.build_setup``) and fill in the record's sections, with the
   code and environment fingerprints; on resume, restore the latest valid checkpoint;
3. train (``_train.loop.train_loop``) with the step hooks (``_train.hooks``);
4. finish: one function writes the record of a completed, stopped, failed or interrupted run.

The run directory layout is in docs/run-directory.md (file names: ``_run.layout``). The entry
points, ``run_experiment`` and ``resume_run``, are in ``_train.run``: a plain run comes here
directly; under torchrun ``_train.dist_run`` joins the ranks first and brings rank 0 here with a
:class:`RankZero`. Nothing here imports a distributed module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprotune._config.loading import config_from_dict, dump_config_yaml
from reprotune._config.schema import ExperimentConfig
from reprotune._config.secrets import without_masked_credentials
from reprotune._determinism.seeds import derive_seeds
from reprotune._errors import InputError
from reprotune._jsonio import write_bytes_atomic
from reprotune._model.lora import save_adapter
from reprotune._run.claim import check_run_dir_free, claim_run_dir, new_run_dir, unlanded_first_record
from reprotune._run.drift import (
    RUN_THE_SCRIPT_AGAIN,
    code_drift,
    environment_drift,
    refuse_code_drift,
    refuse_completed,
    refuse_model_drift,
    refuse_trainer_run,
    section_drift,
)
from reprotune._run.fingerprint import attention_of, code_fingerprint, environment_fingerprint, own_outputs
from reprotune._run.layout import RunLayout
from reprotune._run.ledger import LedgerWriter, hexf
from reprotune._run.live_record import LiveRecord
from reprotune._run.lock import holding_run_dir
from reprotune._run.nospace import no_space_in_run
from reprotune._run.ranks import resume_world_change
from reprotune._run.record import Status, attempt_timings, ended_status
from reprotune._run.rundir import check_is_run_dir
from reprotune._run.signals import interrupt_on_signals, recording_the_end
from reprotune._trackers.base import Tracker, TrackerSet
from reprotune._trackers.mlflow import MlflowTracker
from reprotune._trackers.wandb import WandbTracker
from reprotune._train.hooks import (
    CheckpointHook,
    LedgerHook,
    ProgressHook,
    Stopwatch,
    TrackerHook,
    hf_progress_bars,
)
from reprotune._train.loop import LoopResult, StepHook, train_loop
from reprotune._train.options import RunOptions, RunResult
from reprotune._train.setup import Setup, build_setup, with_saved_manifest
from reprotune._train.strategy import Resume, seed_generators
from reprotune._train.turn import training_turn
from reprotune._train.writer import RunWriter, report


@dataclass(frozen=True)
class RankZero:
    """What rank 0 of a torchrun world brings to a run's life: the world's size and how a setup is
    spread over the ranks (``_train.dist_strategy.distribute_setup`` with this rank's context).
    A plain run has none."""

    world_size: int
    distribute: Callable[[Setup], Setup]
    lost_rank: Callable[[BaseException], BaseException | None] = lambda exc: None
    """The error to record and raise for ``exc`` when it is a collective that failed because
    another rank left (None: it is not)."""


def start_run(cfg: ExperimentConfig, options: RunOptions, rank0: RankZero | None = None) -> RunResult:
    """A new run of ``cfg`` (``_train.run.run_experiment``, which documents it)."""
    run_dir = options.run_dir or new_run_dir(cfg)
    check_run_dir_free(run_dir)
    record = LiveRecord.start(run_dir.name, cfg, derive_seeds(cfg.seed.root, dict(cfg.seed.overrides)))
    run = _Run(RunLayout(run_dir), record, TrackerSet([]), rank0=rank0)
    with hf_progress_bars(options.progress), interrupt_on_signals(), run.closed_if_unrecorded():
        run.trackers = build_trackers(cfg, options, run.report)
        setup = build_setup(cfg, manifest=options.manifest)
        if rank0 is not None:
            setup = rank0.distribute(setup)
        with holding_run_dir(run_dir, report=run.report):
            claim_run_dir(run_dir, report=run.report)
            return _execute(cfg, run, options, resume=False, setup=setup)


def resume_attempt(run_dir: Path, options: RunOptions, rank0: RankZero | None = None) -> RunResult:
    """A new attempt of the unfinished run in ``run_dir`` (``_train.run.resume_run``)."""
    paths = RunLayout(run_dir)
    if unlanded_first_record(run_dir):
        raise InputError(
            f"the run in {run_dir} was killed before its first record was written; nothing was trained",
            source=str(run_dir),
            fix=f"start it again with `reprotune run CONFIG --run-dir {run_dir}`",
        )
    check_is_run_dir(run_dir)
    with holding_run_dir(run_dir, report=report), hf_progress_bars(options.progress), interrupt_on_signals():
        record = LiveRecord.load(paths.record)  # read under the lock: no other writer now
        if record.typed.status == "completed":  # rerun, which refuse_completed offers, cannot take one
            refuse_trainer_run(
                record, run_dir, why="it completed (a Trainer-made run)", fix=RUN_THE_SCRIPT_AGAIN
            )
        refuse_completed(record.typed.status, run_dir)
        refuse_trainer_run(
            record,
            run_dir,
            why="it has no reprotune config to resume",
            fix="run the script again with `trainer.train(resume_from_checkpoint=...)`: the callback "
            "resumes the run (docs/integrations.md)",
        )
        cfg = config_from_dict(record["config"], source=str(paths.record))
        allow = options.allow_world_size_change
        run = _Run(paths, record, TrackerSet([]), rank0=rank0)
        world_size = rank0.world_size if rank0 is not None else None
        run.world_change = resume_world_change(record.typed, world_size, allow_change=allow, run_dir=run_dir)
        with run.closed_if_unrecorded():
            run.trackers = build_trackers(cfg, options, run.report, resumed=True)
            return _execute(cfg, run, options, resume=True)


@dataclass
class _Run(RunWriter):
    """One attempt of ``reprotune run`` or ``resume`` (on rank 0 of a distributed run)."""

    rank0: RankZero | None = None  # rank 0 of a distributed run
    world_change: dict[str, int] | None = None  # an allowed change of world size on resume


def _execute(
    cfg: ExperimentConfig,
    run: _Run,
    options: RunOptions,
    *,
    resume: bool,
    setup: Setup | None = None,
) -> RunResult:
    paths = run.paths
    # Until a resume restores its checkpoint, the run has done what its last attempt did.
    reached_before = int((run.record.get("timings") or {}).get("steps_done") or 0) if resume else 0
    run.record.begin_attempt(resumed=resume)
    progress: ProgressHook | None = None
    ledger_hook: LedgerHook | None = None
    loop: LoopResult | None = None
    save_times: list[float] = []
    stopwatch = Stopwatch()
    try:
        run.write_record()  # first: a directory with a record is a run, whatever happens next
        if not resume:
            dump_config_yaml(cfg, paths.config)
        if setup is None:
            setup = build_setup(cfg, manifest_out=paths.manifest, manifest=options.manifest, resumed=resume)
            if run.rank0 is not None:
                setup = run.rank0.distribute(setup)
        else:
            setup = with_saved_manifest(setup, paths.manifest)
        _fill_record(run, setup, options, resume=resume)
        start_step = reached_before = _restore(run, setup, options) if resume else 0
        if start_step == 0:
            paths.ledger.unlink(missing_ok=True)  # a clean ledger for a run from the start
            # Dropout (and anything else drawing from torch's global generator) gets its own seed.
            seed_generators(setup)
        run.start_trackers()
        if start_step > 0:
            run.send_earlier_steps(start_step)
        run.write_record()

        progress = ProgressHook(setup.total_steps, start_step, options.progress)
        with training_turn(options.train_lock), LedgerWriter(paths.ledger) as ledger:
            ledger_hook = LedgerHook(setup, ledger, stopwatch)
            if start_step == 0:
                ledger_hook.write_init()
            hooks: list[StepHook] = [ledger_hook, TrackerHook(run.trackers, stopwatch)]
            hooks.append(CheckpointHook(setup, ledger, paths.checkpoints, save_times))
            hooks += [progress, *options.hooks]
            loop = train_loop(
                setup,
                hooks,
                start_step=start_step,
                stop_after_step=options.stop_after_step,
                stop_by_main=bool(options.hooks),
            )
        progress.close()
        if loop.stopped:
            return _finish(run, "stopped", loop, stopwatch, save_times)
        return _finish(run, "completed", loop, stopwatch, save_times, setup=setup)
    except BaseException as exc:
        if progress is not None:
            progress.close()
        status = ended_status(exc)
        error: BaseException | None = no_space_in_run(exc, paths.root, recorded=run.recorded)
        if error is None and run.rank0 is not None:
            error = run.rank0.lost_rank(exc)  # another rank left: say so, not gloo's words
        if run.recorded:
            try:
                reached = max(
                    reached_before,
                    progress.step if progress else 0,
                    ledger_hook.last_step if ledger_hook else 0,
                )
                with recording_the_end():
                    _finish(run, status, loop, stopwatch, save_times, error=error or exc, reached=reached)
            except Exception as second:  # e.g. the disk is still full: the first error is the news
                run.report(f"warning: could not record the run's end in {paths.record}: {second}")
        if error is not None:
            raise error from None
        raise


#: Keys of a section a resume cannot see again, since it reads the run's own split.json instead
#: of splitting: where the manifest came from, and the warnings the split made.
_NOT_SEEN_AGAIN: dict[str, frozenset[str]] = {"data": frozenset({"manifest_source", "split_warnings"})}
#: Sections the first attempt alone writes: the defaults of the PEFT that wrote the record's
#: ``lora`` section describe that section (a resume on another PEFT notes the ``lora`` drift).
_FIRST_ATTEMPT_ONLY = frozenset({"lora_defaults"})


def _fill_record(run: _Run, setup: Setup, options: RunOptions, *, resume: bool) -> None:
    """The record's sections from the setup, and the code and environment it runs with."""
    record = run.record
    sections = setup.record_sections()
    if resume and "model" in record:
        refuse_model_drift(
            record["model"],
            sections["model"],
            run.paths.record,
            fix=f"put the files the run started with back in place ({record['model'].get('source')}), "
            "or start a new run with reprotune run",
        )
    for key, section in sections.items():
        if resume and key in _FIRST_ATTEMPT_ONLY:
            continue
        if not resume or key not in record:
            record.set_section(key, section)
        elif record[key] != section:
            # A resume adds an attempt; it never rewrites what the first attempt recorded. What
            # differs now is noted on this attempt (and said), for compare and for the reader.
            skip = _NOT_SEEN_AGAIN.get(key, frozenset())
            kept = [{k: v for k, v in part.items() if k not in skip} for part in (record[key], section)]
            drift = section_drift(kept[0], kept[1], prefix=key)
            record.note_drift(drift)
            for line in drift:
                run.report(f"warning: differs from the run's start: {line}")
    for warning in setup.data.split_warnings:
        run.report(f"warning: {warning}")
    code = code_fingerprint(options.code_dir, outputs=own_outputs(setup.cfg, run.paths.root))
    code_record = code.to_record(patch_file=run.paths.patch.name if code.diff else None)
    environment = environment_fingerprint(attention=attention_of(setup.model))
    # Every rank's fingerprint under torchrun (ranks that differ are refused here); nothing else.
    setup.distribution.record_ranks(setup, record, environment, resume=resume, report=run.report)
    if resume and "code" in record:
        # A resumed run must be the run that started: same code. The record keeps the identity
        # the run started with; an environment that moved is noted on this attempt.
        if options.allow_code_drift:
            record.note_attempt(code_drift=code_drift(record["code"], code_record))
        else:
            refuse_code_drift(record["code"], code_record, run.paths.root, what="resuming", override=None)
        drift = environment_drift(record.get("environment", {}), environment, run.report)
        record.note_attempt(environment_drift=drift)
    else:
        record.set_section("code", code_record)
        if code.diff:  # untracked files alone make a tree dirty but no patch: none is written
            write_bytes_atomic(run.paths.patch, code.diff)
        record.set_section("environment", environment)


def _restore(run: _Run, setup: Setup, options: RunOptions) -> int:
    """Restore the latest valid checkpoint into the setup; return its step (0 when there is none)."""
    resume = Resume(run.record, run.paths, options.restore_rng_on_resume, run.world_change, run.report)
    return setup.distribution.restore(setup, resume)


def _finish(
    run: _Run,
    status: Status,
    loop: LoopResult | None,
    stopwatch: Stopwatch,
    save_times: list[float],
    *,
    setup: Setup | None = None,
    error: BaseException | None = None,
    reached: int = 0,
) -> RunResult:
    """Write the record of a run that ended: completed (with its outputs), stopped, failed or
    interrupted (with the error); the trackers learn the status and log the artifacts."""
    record, paths = run.record, run.paths
    step_times = loop.step_times_s if loop is not None else ()
    steps_done = loop.steps_done if loop is not None else reached
    save_outputs = None if setup is None else functools.partial(_outputs, run, setup, loop)
    timings = functools.partial(
        attempt_timings, run.started, step_times, steps_done, stopwatch.seconds, save_times
    )
    run.finish(status, timings=timings, save_outputs=save_outputs, error=error)
    final_val_loss = loop.final_val_loss if loop is not None else None
    return RunResult(
        paths.root,
        record.document(),
        status,
        steps_done,
        (record.get("outputs") or {}).get("adapter_sha256") if status == "completed" else None,
        final_val_loss,
        step_times_s=tuple(step_times),
        checkpoint_times_s=tuple(save_times),
        typed=record.typed,
    )


def _outputs(run: _Run, setup: Setup, loop: LoopResult | None) -> dict[str, Any]:
    """Save the adapter of a completed run; its files' hashes, the ledger's and the last val loss."""
    files = save_adapter(
        setup.model, run.paths.adapter_dir, state_dict=setup.distribution.adapter_state(setup)
    )
    final = loop.final_val_loss if loop is not None else None
    return run.adapter_outputs(files, final_val_loss=hexf(final) if final is not None else None)


def build_trackers(
    cfg: ExperimentConfig, options: RunOptions, report: Callable[[str], None], *, resumed: bool = False
) -> TrackerSet:
    """The trackers the config enables (none with ``options.tracking`` off). Add new ones here.
    ``resumed``: for a resume, whose MLflow run may be found by its tags."""
    trackers: list[Tracker] = []
    if options.tracking and cfg.tracking.wandb:
        # First: without wandb installed this raises (naming the extra) before any child starts.
        trackers.append(WandbTracker(cfg.tracking.experiment))
    if options.tracking and cfg.tracking.mlflow:
        # A record's config holds the URI with its user-info masked (a resumed run): connect
        # without it, with MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD from the environment.
        uri = without_masked_credentials(cfg.tracking.uri)
        where, experiment = cfg.tracking.artifact_location, cfg.tracking.experiment
        trackers.append(MlflowTracker(uri, where, experiment, resumed=resumed))
    return TrackerSet(trackers, report=report)
