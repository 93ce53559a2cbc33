"""The one run writer: the record, the trackers and the end of an attempt, for every path that
writes a run directory (``reprotune run`` and ``resume`` on one process or on rank 0 under torchrun,
and the Hugging Face Trainer callback, ``integrations._writer``).

An attempt starts (``record.begin_attempt``), tells its trackers what runs
(:meth:`RunWriter.start_trackers`), and ends in :meth:`RunWriter.finish` whatever happened:
completed (outputs saved and hashed, artifacts logged), stopped, failed or interrupted (with the
error). The trackers hear how the run ended even when saving its outputs fails. File names come
from ``_run.layout``; the record is a ``_run.live_record.LiveRecord``, changed through its named
operations and validated when written.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprotune._config.secrets import mask_config, mask_url_credentials
from reprotune._jsonio import sha256_file
from reprotune._run.layout import RunLayout
from reprotune._run.ledger import read_ledger, val_by_place
from reprotune._run.live_record import LiveRecord
from reprotune._run.record import Status
from reprotune._trackers.base import RunDescription, TrackerSet, flatten_params, tracker_tags

#: The tracker's metric for each number of a ledger's train line (as a run's steps send them).
TRACKED = {"train_loss": "loss", "lr": "lr", "grad_norm": "grad_norm"}


def val_metric(eval_set: str | None) -> str:
    """The tracker's metric for a validation loss: ``val_loss``, or for one of a Trainer's dict
    of eval sets ``val_loss/<its name>`` (each set a curve of its own; they shared one, several
    values at a step), the characters a tracker refuses in a name replaced by ``_``."""
    return "val_loss" if eval_set is None else "val_loss/" + re.sub(r"[^\w\-. /]", "_", eval_set)


def report(line: str) -> None:
    """Where a run's notes go: stderr, secrets redacted."""
    print(mask_url_credentials(line), file=sys.stderr, flush=True)


@dataclass(eq=False)
class RunWriter:
    """One attempt of a run, writing its run directory: where it writes, its record and trackers."""

    paths: RunLayout
    record: LiveRecord
    trackers: TrackerSet
    started: float = field(default_factory=time.perf_counter)
    recorded: bool = False  # a record of this attempt is on disk

    def report(self, line: str) -> None:
        report(line)

    def write_record(self) -> None:
        self.record.write(self.paths.record)
        self.recorded = True

    def start_trackers(self) -> None:
        """Tell the trackers what runs: its id, directory, flattened config and tags (among them
        ``reprotune.run_dir``, the directory's absolute path: an MLflow run's way back to the files)."""
        self.trackers.report = report
        self.trackers.start(
            RunDescription(
                run_id=self.record["run_id"],
                run_dir=self.paths.root,
                params=flatten_params(self.record["config"]),
                tags={**tracker_tags(self.record), "reprotune.run_dir": str(self.paths.root.resolve())},
                continues=self.record.get("trackers") or {},  # a resumed run's, from the attempt before
            )
        )

    def send_earlier_steps(self, through_step: int) -> None:
        """Send a resumed run's trackers that can tell what they hold (MLflow) the ledger's steps
        through the checkpoint it resumes from, as the steps sent them: each keeps those it lacks
        (an attempt killed outright never stored its last ones, nor told the record its MLflow
        run; one run without MLflow never sent any) and skips those it holds. The ledger is the
        truth; one that cannot be read here leaves the trackers as they are, with a warning."""
        if not self.trackers.trackers:
            return
        try:
            ledger = read_ledger(self.paths.ledger)
        except Exception as exc:  # the trackers are observers: never the resume's business
            self.report(f"warning: the trackers do not get the steps before the resume: {exc}")
            return
        names = (self.record.get("data") or {}).get("eval_sets")  # a Trainer's dict of eval sets
        val: dict[int, dict[str, float]] = {}
        for (step, place), entry in val_by_place(ledger.val).items():
            name = names[place] if isinstance(names, list) and place < len(names) else None
            val.setdefault(step, {})[val_metric(name if isinstance(name, str) else None)] = entry.number(
                "loss"
            )
        for entry in ledger.train:
            if entry.step > through_step:
                break
            metrics = {key: entry.number(name) for key, name in TRACKED.items()}
            self.trackers.log_earlier_metrics(entry.step, {**metrics, **val.get(entry.step, {})})

    def adapter_outputs(self, adapter_files: Mapping[str, str], **extra: Any) -> dict[str, Any]:
        """The record's ``outputs`` of a completed run: the adapter's files and the ledger, hashed."""
        return {
            "adapter_files": dict(adapter_files),
            "adapter_sha256": adapter_files.get(self.paths.adapter_weights.name),
            "ledger_sha256": sha256_file(self.paths.ledger),
            **extra,
        }

    def finish(
        self,
        status: Status,
        *,
        timings: Callable[[], Mapping[str, Any]],
        save_outputs: Callable[[], dict[str, Any]] | None = None,
        error: BaseException | None = None,
    ) -> None:
        """End the attempt: its outputs (``save_outputs``, for a completed run), timings (asked for
        after the outputs are saved, so that the attempt's duration holds the save) and error in
        the record; the run's files to the trackers when completed; the trackers' summaries.

        When saving fails (a full disk), the trackers hear ``failed`` and the error goes on to
        the caller, who records the run's end as failed.
        """
        record = self.record
        record.end(status, error)
        trackers_heard = False
        try:
            if save_outputs is not None:
                record.set_outputs(save_outputs())
            record.add_timings(timings())
            if status == "completed":
                self.write_record()
                self.trackers.log_artifacts(self._artifacts())
            with contextlib.suppress(Exception):
                record.set_trackers(mask_config(self.trackers.finish(status)))
            trackers_heard = True
            self.write_record()
        finally:
            if not trackers_heard:
                with contextlib.suppress(Exception):
                    self.trackers.finish("failed")

    def abandon_trackers(self) -> None:
        """End the trackers of an opening cut short, before the run began (an MLflow worker
        stopped, a run it made ended FAILED)."""
        with contextlib.suppress(Exception):
            self.trackers.finish("failed")

    @contextlib.contextmanager
    def closed_if_unrecorded(self) -> Iterator[None]:
        """Close the trackers of an attempt that fails before its first record (:meth:`finish`
        does after)."""
        try:
            yield
        except BaseException:
            if not self.recorded:
                with contextlib.suppress(Exception):
                    self.trackers.finish("failed")
            raise

    def _artifacts(self) -> dict[str, Path]:
        """The files a tracker keeps of a completed run (those this run directory holds)."""
        paths = self.paths
        artifacts = {
            "": paths.record,
            "ledger": paths.ledger,
            "adapter": paths.adapter_dir,
            "split": paths.manifest,
            "config": paths.config,
        }
        return {key: path for key, path in artifacts.items() if path.exists()}
