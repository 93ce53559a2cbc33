"""Writing the run directory of a Trainer-made run: the same files ``reprotune run`` writes, by
the same writer (``_train.writer.RunWriter``).

One :class:`TrainerRun` per attempt (a run, or its resume from a Trainer checkpoint) holds the
directory's one-writer lock and the ledger on top of the run writer, and ends the attempt with one
:meth:`TrainerRun.end` whatever happened: completed (adapter saved and hashed), stopped (after the
step a verification asked for), failed or interrupted. File names come from ``_run.layout``, the
record is checked by ``_run.record``, the lines by ``_run.ledger``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from reprotune._config.schema import TrackingConfig
from reprotune._data.manifest import Manifest, write_manifest
from reprotune._documents import read_json_file
from reprotune._errors import InputError
from reprotune._jsonio import publishing_dir, sha256_file, write_bytes_atomic, write_json_atomic
from reprotune._model.lora import save_adapter, trainable_tensors
from reprotune._run.checkpoint_files import TRAINER_CHECKPOINT_MARKER as CHECKPOINT_MARKER
from reprotune._run.drift import environment_drift
from reprotune._run.layout import RunLayout
from reprotune._run.ledger import Entry, LedgerWriter, init_line
from reprotune._run.ledger_resume import ledger_misfit, truncate_ledger
from reprotune._run.live_record import LiveRecord
from reprotune._run.lock import RunDirLock, lock_run_dir
from reprotune._run.outputs import refuse_inside_run
from reprotune._run.record import Status, attempt_timings, ended_status
from reprotune._trackers.base import Tracker, TrackerSet
from reprotune._trackers.mlflow import MlflowTracker
from reprotune._trackers.mlflow_link import MlflowRunLink
from reprotune._trackers.wandb import WandbTracker
from reprotune._train.writer import RunWriter, report
from reprotune.integrations._ranks import checkpoint_marker, restored
from reprotune.integrations._resumable import (
    OPTION,
    branch,
    branch_source,
    check_own_checkpoint,
    check_resumable,
    refuse_unclaimable,
    remove_branch,
    setup_drift,
    validated_at,
)


class TrainerRun(RunWriter):
    """One attempt of a Trainer-made run, writing its run directory. Use :meth:`new` or :meth:`resume`,
    and end it with :meth:`end` (which closes the ledger and releases the lock around the run
    writer's :meth:`~reprotune._train.writer.RunWriter.finish`), never with ``finish`` itself."""

    def __init__(self, paths: RunLayout, record: LiveRecord, lock: RunDirLock, trackers: TrackerSet):
        super().__init__(paths, record, trackers)
        self._lock = lock
        self.ledger = LedgerWriter(paths.ledger)
        self._step_times: list[float] = []
        self._last_step = 0  # the last step done (a resume's from_step until it trains one)
        self._recording_s = 0.0
        self.finished = False

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    def new(
        cls,
        run_dir: Path,
        record: Mapping[str, Any],
        *,
        patch: bytes,
        manifest: Manifest | None,
        init_weights_sha256: str,
        trackers: Callable[[], TrackerSet],
    ) -> TrainerRun:
        """Claim a new (or empty) ``run_dir``, write the first record, the patch, the manifest and
        the ledger's ``init`` line.

        Raises:
            InputError: ``run_dir`` is a file, holds files, or another process writes it.
        """
        refuse_inside_run(run_dir, option=OPTION)
        args = (record.get("trainer") or {}).get("args") or {}
        output_dir = args.get("output_dir") if isinstance(args, Mapping) else None
        refuse_unclaimable(run_dir, output_dir)
        live = LiveRecord(record)  # checked before the directory is claimed
        made = not run_dir.exists()
        lock = lock_run_dir(run_dir, report=report, option=OPTION)
        paths = RunLayout(run_dir)
        writer: TrainerRun | None = None
        try:
            if patch:
                write_bytes_atomic(paths.patch, patch)
            if manifest is not None:
                live.set_manifest_sha256(write_manifest(manifest, paths.manifest))
            live.write(paths.record)
            writer = cls(paths, live, lock, trackers())
            writer.recorded = True
            writer.ledger.write(init_line(init_weights_sha256))
            writer.start_trackers()
        except BaseException:  # nothing half-written: the directory is new (or empty) again
            if writer is not None:
                writer.abandon_trackers()
                with contextlib.suppress(OSError):
                    writer.ledger.close()
            remove_branch(paths, output_dir)  # before the lock goes: no other writer's files
            lock.release()
            if made:
                with contextlib.suppress(OSError):
                    run_dir.rmdir()
            raise
        return writer

    @classmethod
    def resume(
        cls,
        run_dir: Path,
        *,
        from_step: int,
        checkpoint: str | None,
        config: Mapping[str, Any],
        code: Mapping[str, Any],
        environment: Mapping[str, Any],
        weights_sha256: str,
        trackers: Callable[[], TrackerSet],
        ranks: Sequence[Mapping[str, Any]],
        findings: Sequence[Mapping[str, str]] = (),
        branch_from: Path | None = None,
        trainer_output: str | None = None,
        log_history: Sequence[Mapping[str, Any]] | None = None,
        setup: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> TrainerRun:
        """Continue the run in ``run_dir`` from step ``from_step`` (the Trainer's checkpoint):
        the ledger is cut back to that step and a new attempt is recorded, with what each rank
        will restore (``ranks``: :func:`reprotune.integrations._ranks.restore_plan` of every rank):
        a rank without its RNG file, or without the optimizer's, the schedule's or the scaler's
        state, resumes with whatever it has; each such piece is said at once and recorded.
        ``log_history``: the checkpoint's (the Trainer's state), which says whether the run
        validated at ``from_step`` (None: not known), for a damaged ledger line after it.
        ``setup``: the ``data`` and ``model`` sections now, checked against the run's start.

        Raises:
            InputError: no run there, a completed run, other settings (but when it logs, saves or
                pushes), code or train rows than the run's, or a checkpoint that does not fit the
                ledger (it stops before its step, or holds another run's weights there).
        """
        paths = RunLayout(run_dir)
        marker = checkpoint_marker(checkpoint)
        source = branch_source(paths, marker, from_step, config, code, branch_from, trainer_output)
        attempt: dict[str, Any] = {"from_step": from_step, "from_checkpoint": checkpoint}
        writer: TrainerRun | None = None
        lock = lock_run_dir(run_dir, report=report, option=OPTION)
        try:
            if source is not None:
                attempt["branched_from"] = branch(source, paths)
            record = LiveRecord.load(paths.record)
            drift = check_resumable(paths, record, config, code)
            if drift := drift + setup_drift(paths, record, setup or {}, report):
                attempt["drift"] = drift
            if source is None:
                check_own_checkpoint(paths, record["run_id"], checkpoint, marker)
            attempt.update(restored(ranks, checkpoint, report))
            known = {f.get("code") for f in record.get("findings") or []}
            if new_findings := [dict(f) for f in findings if f["code"] not in known]:
                attempt["findings"] = new_findings  # this attempt's setup, warned at its start
            attempt["environment_drift"] = environment_drift(
                record.get("environment") or {}, environment, report
            )
            validated = None if log_history is None else validated_at(log_history, from_step)
            misfit = ledger_misfit(paths.ledger, from_step, weights_sha256, val_at_step=validated)
            if misfit is not None:  # refused before the ledger is cut: nothing of the run is lost
                raise InputError(
                    f"the checkpoint {checkpoint} does not fit the run's ledger: {misfit}",
                    source=str(paths.ledger),
                    fix="resume from a checkpoint this run saved (its ledger is synced at each save)"
                    if source is None
                    else f"branch from a checkpoint of {source}'s last attempt (its ledger ends there)",
                )
            truncate_ledger(paths.ledger, keep_through_step=from_step, val_at_step=validated, report=report)
            writer = cls(paths, record, lock, trackers())  # its ledger opens on the cut ledger
            writer._last_step = from_step
            writer.record.begin_attempt(resumed=True, **attempt)
            writer.write_record()
            writer.start_trackers()
            writer.send_earlier_steps(from_step)  # what the attempts before did not send
        except BaseException:
            if writer is not None:
                writer.abandon_trackers()
                writer.ledger.close()
            if source is not None:  # a branch refused or cut short: its directory new again
                remove_branch(paths, trainer_output)  # before the lock goes: no other writer's files
            lock.release()
            raise
        return writer

    # -- while training --------------------------------------------------------------------------

    def step(
        self, step: int, line: Entry, metrics: Mapping[str, float], step_time_s: float, since: float
    ) -> None:
        """Queue one train line and send its metrics; ``since``: when the recording began."""
        self.ledger.write(line)
        self.trackers.log_metrics(step, metrics)
        self._step_times.append(step_time_s)
        self._last_step = step
        self._recording_s += time.perf_counter() - since

    def validation(
        self, line: Entry, step: int, loss: Mapping[str, float], *, on_start: bool = False
    ) -> None:
        """Queue one validation line and send its loss (``{metric: value}``); none for
        ``eval_on_start``'s evaluation (``on_start``: the setting is on) at the step a resume
        starts from, before it trains one: the run it continues evaluated there or not, and the
        ledger kept through that step already says which."""
        if on_start and step and step == self._last_step and not self._step_times:
            return
        self.ledger.write(line)
        self.trackers.log_metrics(step, loss)

    # -- the end ---------------------------------------------------------------------------------

    def end(
        self,
        status: Status,
        *,
        model: Any = None,
        error: BaseException | None = None,
        best_checkpoint: str | None = None,
    ) -> None:
        """End the attempt once: adapter (when completed), outputs, timings, trackers, record; unlock.

        ``best_checkpoint``: the checkpoint the Trainer reloaded at the end
        (``load_best_model_at_end``): the adapter holds its step's weights, which the record says
        (``outputs.adapter_step``) when that is not the last step."""
        if self.finished:
            return
        self.finished = True
        try:
            completed = status == "completed" and model is not None
            save = functools.partial(self._outputs, model, _step_of(best_checkpoint)) if completed else None
            try:
                self.ledger.close()  # syncs: on a full disk this fails too, and the run with it
                self.finish(status, timings=self._timings, save_outputs=save, error=error)
            except BaseException as exc:  # saving failed (a full disk): the run failed, and says so
                ended = ended_status(exc)
                with contextlib.suppress(Exception):
                    self.finish(ended, timings=self._timings, error=exc)
                raise
        finally:
            self._lock.release()

    def _outputs(self, model: Any, best_step: int | None) -> dict[str, Any]:
        extra = {}
        if best_step is not None and best_step != self._last_step:
            report(
                f"reprotune: the adapter holds step {best_step}'s weights, the best checkpoint's "
                f"(load_best_model_at_end), not the last step's ({self._last_step})"
            )
            extra["adapter_step"] = best_step
        return self.adapter_outputs(_save_trainable(model, self.paths.adapter_dir), **extra)

    def _timings(self) -> dict[str, Any]:
        times = self._step_times
        # steps_done is the last step done, as `reprotune run` records it (a resume's count from 1)
        return attempt_timings(self.started, times, self._last_step, self._recording_s, save_times=None)


def abandoned(
    run: TrainerRun | None, trainer: Any, *, fresh: bool, trainer_output: str | None
) -> Path | None:
    """End the attempt of ``run`` when a train begins before it ended, recorded interrupted. When
    that is the Trainer beginning its loop again from step 0 (``fresh``) with a smaller batch than
    the attempt's (``auto_find_batch_size`` after running out of memory), the retry takes its run
    directory over, emptied but for the Trainer's output directory: the abandoned try is of
    another batch size. Returns that directory; None otherwise (another ``train()``, as after a
    Ctrl-C under a callback ``add_callback`` added, starts a run of its own)."""
    if run is None or run.finished:
        return None
    run.end("interrupted")
    asked = getattr(trainer.args, "train_batch_size", None)  # a first try's, unless it recorded one
    tried = (run.record["config"].get("trainer") or {}).get("train_batch_size", asked)
    now = getattr(trainer, "_train_batch_size", None)
    smaller = isinstance(now, int) and isinstance(tried, int) and now < tried
    if not (fresh and smaller and getattr(trainer.args, "auto_find_batch_size", False)):
        return None
    report(
        f"reprotune: the Trainer began its loop again (auto_find_batch_size, after running out of "
        f"memory): the run starts again in {run.paths.root}"
    )
    remove_branch(run.paths, trainer_output)
    return run.paths.root


def _step_of(checkpoint: str | None) -> int | None:
    """The step of a Trainer checkpoint's directory (``.../checkpoint-40``: 40)."""
    if checkpoint is None:
        return None
    _, _, number = Path(checkpoint).name.rpartition("-")
    return int(number) if number.isdigit() else None


def _save_trainable(model: Any, directory: Path) -> dict[str, str]:
    """Save the adapter (a PEFT model) or else the trainable weights alone, atomically; return each
    file's sha256."""
    if getattr(model, "peft_config", None) is not None:
        return save_adapter(model, directory)
    from safetensors.torch import save_file

    target = Path(directory)
    with publishing_dir(target, replace=True) as tmp:
        tensors = {name: t.detach().cpu().contiguous() for name, t in trainable_tensors(model).items()}
        save_file(tensors, str(tmp / RunLayout(target.parent).adapter_weights.name))
        hashes = {path.name: sha256_file(path) for path in sorted(tmp.iterdir())}
    return hashes


def check_tracker_settings(*, wandb: object, mlflow: object, wandb_project: object) -> None:
    """Refuse a callback's tracker switch that is not a bool (``mlflow="yes"`` would switch it on by
    truthiness) and a W&B project that is not a name (it would fail only at the run's end, when
    the record holding it is written)."""
    for name, value in (("wandb", wandb), ("mlflow", mlflow)):
        if value is not None and not isinstance(value, bool):
            raise InputError(
                f"{name}={value!r} is not True or False",
                source=f"ReprotuneCallback({name}=...)",
                fix=f"pass {name}=True or {name}=False",
            )
    if not isinstance(wandb_project, str) or not wandb_project:
        raise InputError(
            f"wandb_project={wandb_project!r} is not a project name",
            source="ReprotuneCallback(wandb_project=...)",
            fix='pass the W&B project as a non-empty string, e.g. wandb_project="reprotune"',
        )


def make_trackers(
    wandb: bool,
    project: str,
    on_failure: Callable[[str], None] = report,
    *,
    mlflow_run: tuple[str, str | None] | None = None,
) -> Callable[[], TrackerSet]:
    """The callback's trackers, made when called (once the run directory is claimed: a refused
    start leaves no MLflow worker behind): W&B when asked for (offline unless WANDB_MODE says
    otherwise), and the MLflow run the script logs to (``mlflow_run``: tracking URI and run id),
    linked; a run id None: a run of its own at that URI, mirrored by ``reprotune run``'s own
    tracker (metrics off the training step, in a child process), in the experiment
    ``MLFLOW_EXPERIMENT_NAME`` names (else ``reprotune``), its artifacts under ``mlartifacts`` when
    it makes the experiment."""

    def made() -> TrackerSet:
        trackers: list[Tracker] = [WandbTracker(project)] if wandb else []
        if mlflow_run is not None:
            uri, run_id = mlflow_run
            if run_id is not None:
                trackers.append(MlflowRunLink(uri, run_id))
            else:
                defaults = TrackingConfig()
                experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or defaults.experiment
                trackers.append(MlflowTracker(uri, defaults.artifact_location, experiment))
        return TrackerSet(trackers, report=on_failure)

    return made


def mark_checkpoint(checkpoint: Path, run: TrainerRun, step: int, ranks: Sequence[Mapping[str, Any]]) -> None:
    """Name the run a Trainer checkpoint belongs to, inside it (:data:`CHECKPOINT_MARKER`), with
    every rank's facts there (``ranks``: host, device, its RNG file's sha256)."""
    marker = {
        "run_dir": str(run.paths.root.resolve()),
        "run_id": run.record["run_id"],
        "step": step,
        "ranks": [dict(r) for r in ranks],
    }
    write_json_atomic(checkpoint / CHECKPOINT_MARKER, marker)


def checkpoint_run_dir(checkpoint: str | None, step: int) -> Path:
    """The run directory a Trainer checkpoint names.

    Raises:
        InputError: no checkpoint path, or a checkpoint the callback did not mark.
    """
    marker = Path(checkpoint) / CHECKPOINT_MARKER if checkpoint else None
    if marker is None or not marker.is_file():
        raise InputError(
            f"the Trainer resumes from step {step}, but the checkpoint names no reprotune run "
            f"({marker or 'no checkpoint path seen'})",
            source="ReprotuneCallback(run_dir=...)",
            fix="pass run_dir= with the run directory of the run that saved the checkpoint",
        )
    data = read_json_file(marker, what="checkpoint marker", fix="pass run_dir= to ReprotuneCallback")
    return Path(data["run_dir"])
