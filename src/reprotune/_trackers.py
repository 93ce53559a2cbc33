"""Trackers: observers that mirror a run to MLflow (or elsewhere). The record on disk stays the truth.

A tracker that fails is reported once, switched off, and the run goes on. MLflow's synchronous
SQLite logging costs about 10 ms a call, so the MLflow tracker hands everything to one worker
thread that sends metrics in batches; ``finish`` waits for the queue to drain, so a run that ends
has every metric stored.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

_MAX_METRICS_PER_BATCH = 1000  # MLflow's limit per log_batch call
_MAX_PARAMS_PER_BATCH = 100
_MAX_PARAM_CHARS = 6000


@dataclass(frozen=True)
class RunDescription:
    """What a tracker needs to open its mirror of a run."""

    run_id: str
    run_dir: Path
    params: Mapping[str, str]
    tags: Mapping[str, str]


class Tracker(Protocol):
    """An observer of a run. Any method may raise; the caller switches the tracker off then."""

    name: str

    def start(self, run: RunDescription) -> None: ...

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def log_artifacts(self, paths: Mapping[str, Path]) -> None: ...

    def finish(self, status: str) -> dict[str, Any]: ...


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

    def _each(self, action: str, call: Callable[[Tracker], Any]) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as exc:  # an observer must never stop the run
                self.trackers.remove(tracker)
                self.failures[tracker.name] = f"{type(exc).__name__}: {exc}"
                self.report(
                    f"warning: tracker {tracker.name!r} failed during {action} and is switched off "
                    f"({type(exc).__name__}: {exc}); the run and its record go on"
                )

    def start(self, run: RunDescription) -> None:
        self._each("start", lambda t: t.start(run))

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._each("log_metrics", lambda t: t.log_metrics(step, metrics))

    def log_artifacts(self, paths: Mapping[str, Path]) -> None:
        self._each("log_artifacts", lambda t: t.log_artifacts(paths))

    def finish(self, status: str) -> dict[str, Any]:
        """Finish every tracker; return each one's summary (or its failure) for the record."""
        summaries: dict[str, Any] = {}

        def _finish(tracker: Tracker) -> None:
            summaries[tracker.name] = {"ok": True, **tracker.finish(status)}

        self._each("finish", _finish)
        for name, error in self.failures.items():
            summaries[name] = {"ok": False, "error": error}
        return summaries


def flatten_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten a nested config into ``{"a.b.c": "value"}`` strings, as MLflow params."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_params(value, prefix=f"{path}."))
        else:
            text = "null" if value is None else str(value)
            flat[path] = text[:_MAX_PARAM_CHARS]
    return flat


def resolve_tracking_uri(uri: str) -> str:
    """Make a relative ``sqlite:///file.db`` absolute against the current directory."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(uri[len(prefix) :]).resolve())
    return uri


_STOP = object()


class MlflowTracker:
    """Mirrors a run to MLflow through ``MlflowClient`` with an explicit run id (no active-run state).

    All MLflow calls, including the import of mlflow itself (slow), happen on one worker thread.

    Args:
        uri: tracking URI, e.g. ``sqlite:///mlflow.db`` (relative paths resolve against the cwd).
        artifact_location: folder for the experiment's artifacts (created if missing).
        experiment: experiment name (created if missing).
        flush_interval_s: the worker sends what has queued up at most this often, so that its
            SQLite writes (and the GIL they hold) stay out of the training loop's way.
    """

    name = "mlflow"

    def __init__(
        self, uri: str, artifact_location: str | Path, experiment: str, *, flush_interval_s: float = 1.0
    ) -> None:
        self.uri = resolve_tracking_uri(uri)
        self.artifact_location = Path(artifact_location).resolve()
        self.experiment = experiment
        self.mlflow_run_id: str | None = None
        self._queue: queue.Queue[Any] = queue.Queue()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.metrics_sent = 0
        self._flush_interval_s = flush_interval_s

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def start(self, run: RunDescription) -> None:
        self._thread = threading.Thread(target=self._work, args=(run,), name="reprotune-mlflow", daemon=True)
        self._thread.start()

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._raise_if_failed()
        stamp = int(time.time() * 1000)
        self._queue.put(("metrics", step, stamp, dict(metrics)))

    def log_artifacts(self, paths: Mapping[str, Path]) -> None:
        self._raise_if_failed()
        self._queue.put(("artifacts", dict(paths)))

    def finish(self, status: str) -> dict[str, Any]:
        self._queue.put(("finish", status))
        self._queue.put(_STOP)
        if self._thread is not None:
            self._thread.join()
        self._raise_if_failed()
        return {
            "tracking_uri": self.uri,
            "experiment": self.experiment,
            "mlflow_run_id": self.mlflow_run_id,
            "metrics_logged": self.metrics_sent,
        }

    def _work(self, run: RunDescription) -> None:
        try:
            self._serve(run)
        except BaseException as exc:  # surfaced to the run on its next call
            self._error = exc
            # Keep draining so producers never block on a dead worker.
            while self._queue.get() is not _STOP:
                pass

    def _serve(self, run: RunDescription) -> None:
        import os

        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.uri)
        found = client.get_experiment_by_name(self.experiment)
        if found is None:
            self.artifact_location.mkdir(parents=True, exist_ok=True)
            experiment_id = client.create_experiment(
                self.experiment, artifact_location=self.artifact_location.as_uri()
            )
        else:
            experiment_id = found.experiment_id
        mlflow_run = client.create_run(experiment_id, run_name=run.run_id, tags=dict(run.tags))
        run_id = mlflow_run.info.run_id
        self.mlflow_run_id = run_id
        params = [Param(k, v) for k, v in sorted(run.params.items())]
        for i in range(0, len(params), _MAX_PARAMS_PER_BATCH):
            client.log_batch(run_id, params=params[i : i + _MAX_PARAMS_PER_BATCH], synchronous=True)

        pending: list[Any] = []
        while True:
            item = self._queue.get()
            # Drain whatever else is waiting so metrics go out in as few calls as possible.
            items = [item]
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = False
            for entry in items:
                if entry is _STOP:
                    stop = True
                elif entry[0] == "metrics":
                    _, step, stamp, metrics = entry
                    pending.extend(Metric(k, float(v), stamp, step) for k, v in sorted(metrics.items()))
                elif entry[0] == "artifacts":
                    self._flush(client, run_id, pending)
                    for artifact_path, local in entry[1].items():
                        if Path(local).is_dir():
                            client.log_artifacts(run_id, str(local), artifact_path=artifact_path)
                        else:
                            client.log_artifact(run_id, str(local), artifact_path=artifact_path or None)
                elif entry[0] == "finish":
                    self._flush(client, run_id, pending)
                    mlflow_status = {"completed": "FINISHED", "failed": "FAILED"}.get(entry[1], "KILLED")
                    client.set_terminated(run_id, status=mlflow_status)
            self._flush(client, run_id, pending)
            if stop:
                return
            time.sleep(self._flush_interval_s)

    def _flush(self, client: Any, run_id: str, pending: list[Any]) -> None:
        while pending:
            chunk = pending[:_MAX_METRICS_PER_BATCH]
            client.log_batch(run_id, metrics=chunk, synchronous=True)
            del pending[: len(chunk)]
            self.metrics_sent += len(chunk)
