"""``reprotune run`` and ``reprotune resume``: a run's life, from its directory to its record.

1. claim the run directory and write the first record (status ``running``) and ``config.yaml``;
2. build the setup (``_train.setup.build_setup``) and fill in the record's sections, with the
   code and environment fingerprints; on resume, restore the latest valid checkpoint;
3. train (``_train.loop.train_loop``) with the step hooks (``_train.hooks``);
4. finish: one function writes the record of a completed, stopped, failed or interrupted run.

The run directory layout is in docs/run-directory.md (file names: ``_run.layout``).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reprotune._config.loading import config_from_dict, dump_config_yaml
from reprotune._config.schema import ExperimentConfig
from reprotune._determinism.seeds import derive_seeds
from reprotune._errors import InputError
from reprotune._faults import ARMED as CRASH_TESTS_ARMED
from reprotune._jsonio import sha256_file, write_bytes_atomic
from reprotune._model.lora import save_adapter
from reprotune._run.checkpoint import latest_valid_checkpoint, restore_checkpoint
from reprotune._run.claim import claim_run_dir, new_run_dir, unlanded_first_record
from reprotune._run.drift import refuse_code_drift, section_drift
from reprotune._run.fingerprint import code_fingerprint, environment_fingerprint
from reprotune._run.layout import RunLayout
from reprotune._run.ledger import LedgerWriter, hexf, truncate_ledger
from reprotune._run.record import load_record, start_record, utc_now, write_record
from reprotune._trackers.base import RunDescription, Tracker, TrackerSet, flatten_params
from reprotune._trackers.mlflow import MlflowTracker
from reprotune._trackers.wandb import WandbTracker
from reprotune._train.faults import fault_hooks
from reprotune._train.hooks import (
    CheckpointHook,
    CrashPointHook,
    LedgerHook,
    ProgressHook,
    Stopwatch,
    TrackerHook,
)
from reprotune._train.loop import LoopResult, StepHook, train_loop
from reprotune._train.setup import Setup, build_setup
from reprotune._version import __version__


@dataclass(frozen=True)
class RunOptions:
    """How to run, beyond what the config says.

    Args:
        run_dir: where to write; default ``runs/<run-id>`` under the current directory.
        progress: show a progress bar on stderr.
        tracking: mirror to the trackers the config enables (False: none, e.g. in verify's legs).
        stop_after_step: stop after this optimizer step as if interrupted (verify's resume leg),
            leaving the run resumable.
        restore_rng_on_resume: False only for verify's negative control of the resume leg.
        manifest: train on this split manifest instead of the config's split (rerun uses the
            recorded run's ``split.json``; the config, and so its hash, stay as recorded).
        recording: which optimizer steps write their ledger line (with the weights hash) and send
            their metrics to the trackers: every one (True, the default), none (False) or those a
            predicate ``step -> bool`` picks. Anything but True is for the overhead benchmark only,
            which compares recorded and unrecorded steps of one loop; such a run's ledger is not
            complete, and ``compare`` and ``resume`` cannot use it.
        hooks: extra step hooks, called after reprotune's own at the end of every step (the
            benchmarks time steps with one).
        code_dir: the directory whose git state is recorded.
    """

    run_dir: Path | None = None
    progress: bool = True
    tracking: bool = True
    stop_after_step: int | None = None
    restore_rng_on_resume: bool = True
    manifest: Path | None = None
    recording: bool | Callable[[int], bool] = True
    hooks: Sequence[StepHook] = ()
    code_dir: Path = field(default_factory=Path.cwd)


@dataclass(frozen=True)
class RunResult:
    """What a finished (or deliberately stopped) run produced."""

    run_dir: Path
    record: dict[str, Any]
    status: str
    steps_done: int
    adapter_sha256: str | None
    final_val_loss: float | None
    step_times_s: tuple[float, ...] = ()
    """This attempt's wall time per optimizer step, in step order (the benchmarks read it)."""
    checkpoint_times_s: tuple[float, ...] = ()
    """This attempt's wall time per checkpoint saved (included in the step times)."""


def run_experiment(cfg: ExperimentConfig, options: RunOptions = RunOptions()) -> RunResult:
    """Run the experiment ``cfg`` in a new run directory. See the module docstring.

    Raises:
        InputError: bad data, model or config discovered while preparing (the record says failed).
    """
    run_dir = options.run_dir or new_run_dir(cfg)
    claim_run_dir(run_dir)
    record = start_record(run_dir.name, cfg, derive_seeds(cfg.seed.root, dict(cfg.seed.overrides)))
    with _hf_progress_bars(options.progress):
        return _execute(cfg, RunLayout(run_dir), options, record, resume=False)


def resume_run(run_dir: Path, options: RunOptions = RunOptions()) -> RunResult:
    """Continue the unfinished run in ``run_dir`` from its latest valid checkpoint."""
    paths = RunLayout(run_dir)
    if unlanded_first_record(run_dir):
        raise InputError(
            f"the run in {run_dir} was killed before its first record was written; nothing was trained",
            source=str(run_dir),
            fix=f"start it again with `reprotune run CONFIG --run-dir {run_dir}`",
        )
    if not paths.is_run_dir():
        raise InputError(
            f"{run_dir} is not a run directory (no {paths.record.name})",
            source=str(run_dir),
            fix="point at a directory written by `reprotune run`",
        )
    record = load_record(paths.record)
    if record.get("status") == "completed":
        raise InputError(
            f"the run in {run_dir} is already complete; nothing to resume",
            source=str(paths.record),
            fix=f"compare it with `reprotune compare`, or start a new one with `reprotune rerun {run_dir}`",
        )
    cfg = config_from_dict(record["config"], source=str(paths.record))
    with _hf_progress_bars(options.progress):
        return _execute(cfg, paths, options, record, resume=True)


@dataclass
class _Run:
    """One attempt of a run while it goes: where it writes, its record, trackers and messages."""

    paths: RunLayout
    record: dict[str, Any]
    trackers: TrackerSet
    started: float = field(default_factory=time.perf_counter)

    def report(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def write_record(self) -> None:
        write_record(self.paths.record, self.record)


def _execute(
    cfg: ExperimentConfig, paths: RunLayout, options: RunOptions, record: dict[str, Any], *, resume: bool
) -> RunResult:
    record["status"] = "running"
    record["error"] = None
    record.setdefault("attempts", []).append({"started_at": utc_now(), "resumed": resume})
    run = _Run(paths, record, TrackerSet([]))
    run.trackers.report = run.report
    run.write_record()  # first: a directory with a record is a run, whatever happens next
    if not resume:
        dump_config_yaml(cfg, paths.config)
    progress: ProgressHook | None = None
    loop: LoopResult | None = None
    save_times: list[float] = []
    stopwatch = Stopwatch()
    try:
        run.trackers = build_trackers(cfg, options, run.report)
        setup = build_setup(cfg, manifest_out=paths.manifest, manifest=options.manifest, resumed=resume)
        _fill_record(run, setup, options, resume=resume)
        start_step = _restore(run, setup, options) if resume else 0
        if start_step == 0:
            paths.ledger.unlink(missing_ok=True)  # a clean ledger for a run from the start
            # Dropout (and anything else drawing from torch's global generator) gets its own seed.
            torch.manual_seed(setup.seeds["dropout"])
        run.trackers.start(
            RunDescription(
                run_id=record["run_id"],
                run_dir=paths.root,
                params=flatten_params(record["config"]),
                tags=_tracker_tags(record),
            )
        )
        run.write_record()

        records_step = _step_predicate(options.recording)
        progress = ProgressHook(setup.total_steps, start_step, options.progress)
        with LedgerWriter(paths.ledger) as ledger:
            ledger_hook = LedgerHook(setup, ledger, records_step, stopwatch)
            if start_step == 0:
                ledger_hook.write_init()
            checkpoints = CheckpointHook(setup, ledger, paths.checkpoints, save_times)
            hooks: list[StepHook] = [
                ledger_hook,
                TrackerHook(run.trackers, records_step, stopwatch),
                checkpoints,
            ]
            if CRASH_TESTS_ARMED:
                hooks.append(CrashPointHook())
            hooks += [*fault_hooks(setup), progress, *options.hooks]
            loop = train_loop(setup, hooks, start_step=start_step, stop_after_step=options.stop_after_step)
        progress.close()
        if loop.stopped:
            return _finish(run, "stopped", loop, stopwatch, save_times)
        return _finish(run, "completed", loop, stopwatch, save_times, setup=setup)
    except BaseException as exc:
        if progress is not None:
            progress.close()
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        _finish(run, status, loop, stopwatch, save_times, error=exc)
        raise


def _fill_record(run: _Run, setup: Setup, options: RunOptions, *, resume: bool) -> None:
    """The record's sections from the setup, and the code and environment it runs with."""
    record = run.record
    for key, section in setup.record_sections().items():
        if not resume or key not in record:
            record[key] = section
        elif record[key] != section:
            # A resume adds an attempt; it never rewrites what the first attempt recorded. What
            # differs now is noted on this attempt (and said), for compare and for the reader.
            drift = section_drift(record[key], section, prefix=key)
            record["attempts"][-1].setdefault("drift", []).extend(drift)
            for line in drift:
                run.report(f"warning: differs from the run's start: {line}")
    for warning in setup.data.split_warnings:
        run.report(f"warning: {warning}")
    code = code_fingerprint(options.code_dir)
    code_record = code.to_record(patch_file=run.paths.patch.name if code.dirty else None)
    environment = environment_fingerprint()
    if resume and "code" in record:
        # A resumed run must be the run that started: same code. The record keeps the identity
        # the run started with; an environment that moved is noted on this attempt.
        refuse_code_drift(record["code"], code_record, run.paths.root, what="resuming", override=None)
        drift = section_drift(record.get("environment", {}), environment, prefix="environment")
        record["attempts"][-1]["environment_drift"] = drift
        for line in drift:
            run.report(f"warning: environment differs from the run's start: {line}")
    else:
        record["code"] = code_record
        if code.dirty and code.diff is not None:
            write_bytes_atomic(run.paths.patch, code.diff)
        record["environment"] = environment


def _restore(run: _Run, setup: Setup, options: RunOptions) -> int:
    """Restore the latest valid checkpoint into the setup; return its step (0 when there is none)."""
    found = latest_valid_checkpoint(run.paths.checkpoints, report=run.report)
    if found is None:
        return 0  # nothing to restore: start over, from a clean ledger
    state = restore_checkpoint(
        found,
        model=setup.model,
        optimizer=setup.optimizer,
        scheduler=setup.scheduler,
        scaler=setup.scaler,
        restore_rng=options.restore_rng_on_resume,
    )
    # What this attempt resumed from, for compare (a resume that skipped the RNG is a cause).
    run.record["attempts"][-1].update(from_step=state.step, rng_restored=options.restore_rng_on_resume)
    truncate_ledger(run.paths.ledger, keep_through_step=state.step)
    run.report(f"resuming {run.paths.root} from step {state.step} ({found.name})")
    return state.step


def _finish(
    run: _Run,
    status: str,
    loop: LoopResult | None,
    stopwatch: Stopwatch,
    save_times: list[float],
    *,
    setup: Setup | None = None,
    error: BaseException | None = None,
) -> RunResult:
    """Write the record of a run that ended: completed (with its outputs), stopped, failed or
    interrupted (with the error); the trackers learn the status and log the artifacts."""
    record, paths = run.record, run.paths
    step_times = loop.step_times_s if loop is not None else ()
    steps_done = loop.steps_done if loop is not None else 0
    record["status"] = status
    if error is not None:
        record["error"] = {"type": type(error).__name__, "message": str(error)}
    if setup is not None:
        adapter_files = save_adapter(setup.model, paths.adapter_dir)
        final_val = loop.final_val_loss if loop is not None else None
        record["outputs"] = {
            "adapter_files": adapter_files,
            "adapter_sha256": adapter_files.get(paths.adapter_weights.name),
            "ledger_sha256": sha256_file(paths.ledger),
            "final_val_loss": hexf(final_val) if final_val is not None else None,
        }
    record["timings"].update(_timings(run.started, step_times, steps_done, stopwatch.seconds, save_times))
    if status == "completed":
        run.write_record()
        run.trackers.log_artifacts(
            {
                "": paths.record,
                "ledger": paths.ledger,
                "adapter": paths.adapter_dir,
                "split": paths.manifest,
                "config": paths.config,
            }
        )
    with contextlib.suppress(Exception):
        record["trackers"] = run.trackers.finish(status)
    run.write_record()
    final_val_loss = loop.final_val_loss if loop is not None else None
    return RunResult(
        paths.root,
        record,
        status,
        steps_done,
        (record.get("outputs") or {}).get("adapter_sha256") if status == "completed" else None,
        final_val_loss,
        step_times_s=tuple(step_times),
        checkpoint_times_s=tuple(save_times),
    )


def build_trackers(cfg: ExperimentConfig, options: RunOptions, report: Callable[[str], None]) -> TrackerSet:
    """The trackers the config enables (none with ``options.tracking`` off). Add new ones here."""
    trackers: list[Tracker] = []
    if options.tracking and cfg.tracking.wandb:
        # First: without wandb installed this raises (naming the extra) before any child starts.
        trackers.append(WandbTracker(cfg.tracking.experiment))
    if options.tracking and cfg.tracking.mlflow:
        trackers.append(
            MlflowTracker(cfg.tracking.uri, cfg.tracking.artifact_location, cfg.tracking.experiment)
        )
    return TrackerSet(trackers, report=report)


@contextlib.contextmanager
def _hf_progress_bars(enabled: bool) -> Iterator[None]:
    """Show transformers' own progress bars (loading weights) only when ours are shown."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _step_predicate(recording: bool | Callable[[int], bool]) -> Callable[[int], bool]:
    if callable(recording):
        return recording
    return (lambda _step: True) if recording else (lambda _step: False)


def _timings(
    started: float, step_times: Sequence[float], steps_done: int, recording_s: float, save_times: list[float]
) -> dict[str, Any]:
    total = sum(step_times)
    return {
        "ended_at": utc_now(),
        "duration_s": round(time.perf_counter() - started, 3),
        "steps_done": steps_done,
        "step_time_s_mean": round(float(np.mean(step_times)), 6) if step_times else None,
        # The median ignores the first step's warm-up and one-off stalls: the loop's typical pace.
        "step_time_s_median": round(float(np.median(step_times)), 6) if step_times else None,
        # The ledger lines, weights hashes and tracker hand-offs of this attempt's steps, timed
        # where they run: what recording cost this run, as a share of its step time.
        "recording_time_s": round(recording_s, 6),
        "recording_share": round(recording_s / total, 6) if total else None,
        # Checkpoint saves of this attempt (ledger sync included), part of the step times.
        "checkpoint_time_s": round(sum(save_times), 6),
    }


def _tracker_tags(record: Mapping[str, Any]) -> dict[str, str]:
    code, data, model = record.get("code", {}), record.get("data", {}), record.get("model", {})
    return {
        "reprotune.version": __version__,
        "reprotune.run_id": record["run_id"],
        "git.commit": str(code.get("commit")),
        "git.dirty": str(code.get("dirty")),
        "data.sha256": str(data.get("file_sha256")),
        "data.manifest_sha256": str(data.get("manifest_sha256")),
        "model.source": str(model.get("source")),
        "model.weights_sha256": str(model.get("weights_sha256")),
        "config.sha256": record["config_sha256"],
    }
