"""Trackers: observers that mirror a run elsewhere (MLflow, ...). The record on disk stays the truth.

A tracker is anything with the :class:`Tracker` methods. :class:`TrackerSet` fans each event out;
a tracker that raises is reported once, switched off, and the run goes on. A new tracker is a
class with these methods in its own module here, chosen in ``_train.attempt.build_trackers``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from reprotune._config.secrets import mask_data
from reprotune._jsonio import flattened
from reprotune._run.record import Status
from reprotune._version import __version__

_MAX_PARAM_CHARS = 6000


@dataclass(frozen=True)
class RunDescription:
    """What a tracker needs to open its mirror of a run."""

    run_id: str
    run_dir: Path
    params: Mapping[str, str]
    tags: Mapping[str, str]
    #: A resumed run: what its trackers reported at the end of the attempt before (the record's
    #: ``trackers``), so that each continues its own run there instead of opening a second one.
    continues: Mapping[str, Any] = field(default_factory=dict)


class Tracker(Protocol):
    """An observer of a run. Any method may raise; the caller switches the tracker off then."""

    name: str

    def start(self, run: RunDescription) -> None: ...

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def log_artifacts(self, paths: Mapping[str, Path]) -> None: ...

    def finish(self, status: Status) -> dict[str, Any]: ...

    def close(self) -> None: ...


@dataclass
class TrackerSet:
    """Fans events out to trackers; a tracker that raises is reported once and dropped.

    Args:
        trackers: the observers.
        report: called with one line when a tracker fails (default: print to stderr).
    """

    trackers: list[Tracker]
    report: Callable[[str], None] = field(default=lambda line: print(line, flush=True))
    failures: dict[str, str] = field(default_factory=dict)
    failure_details: dict[str, dict[str, Any]] = field(default_factory=dict)
    summaries: dict[str, Any] | None = None  # set by the first finish; a second returns it

    def _each(self, action: str, call: Callable[[Tracker], Any]) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as exc:  # an observer must never stop the run
                self.trackers.remove(tracker)
                with contextlib.suppress(Exception):
                    tracker.close()
                self.failures[tracker.name] = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, TrackerFailed):
                    self.failure_details[tracker.name] = exc.details
                self.report(
                    f"warning: tracker {tracker.name!r} failed during {action} and is switched off "
                    f"({type(exc).__name__}: {exc}); the run and its record go on"
                )

    def start(self, run: RunDescription) -> None:
        self._each("start", lambda t: t.start(run))

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._each("log_metrics", lambda t: t.log_metrics(step, metrics))

    def log_earlier_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """A step from before a resume, to the trackers that keep only the steps they lack
        (``fills_gaps``: MLflow, which reads what its run holds); others would log it twice."""
        self._each(
            "log_metrics", lambda t: t.log_metrics(step, metrics) if getattr(t, "fills_gaps", False) else None
        )

    def log_artifacts(self, paths: Mapping[str, Path]) -> None:
        self._each("log_artifacts", lambda t: t.log_artifacts(paths))

    def finish(self, status: Status) -> dict[str, Any]:
        """Finish every tracker once; return each one's summary (or its failure) for the record.

        A second call (a run whose end is recorded again as failed) returns the first's summaries.
        """
        if self.summaries is not None:
            return self.summaries
        summaries: dict[str, Any] = {}

        def _finish(tracker: Tracker) -> None:
            summaries[tracker.name] = {"ok": True, **tracker.finish(status)}

        self._each("finish", _finish)
        for name, error in self.failures.items():
            summaries[name] = {"ok": False, "error": error, **self.failure_details.get(name, {})}
        self.summaries = summaries
        return summaries


class TrackerFailed(RuntimeError):
    """A tracker failed after it made something the record should name (an MLflow run, ended
    FAILED): ``details`` go into the record beside the error."""

    def __init__(self, message: str, details: dict[str, Any]) -> None:
        super().__init__(message)
        self.details = details


def flatten_params(config: Mapping[str, Any]) -> dict[str, str]:
    """Flatten a nested config into ``{"a.b.c": "value"}`` strings, as MLflow params."""
    leaves = flattened(config)
    return {key: _param("null" if value is None else str(value)) for key, value in leaves.items()}


def _param(text: str) -> str:
    """``text`` as one param: whole, or cut to MLflow's limit with a mark that says so and where the
    whole value is (a long system prompt, cut without a word, read as the value itself)."""
    if len(text) <= _MAX_PARAM_CHARS:
        return text
    mark = f" ...[cut from {len(text)} characters; the whole value is in config.yaml]"
    return text[: _MAX_PARAM_CHARS - len(mark)] + mark


def tracker_tags(record: Mapping[str, Any]) -> dict[str, str]:
    """The tags a run gives its trackers: version, run id, code, data, model and config hashes."""
    code, data, model = record.get("code") or {}, record.get("data") or {}, record.get("model") or {}
    tags: dict[str, str] = mask_data(
        {
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
    )
    return tags
