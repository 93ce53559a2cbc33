"""The MLflow tracker's child process: reads JSON lines on stdin, writes to MLflow, answers on stdout.

Messages (one JSON object a line): ``start`` (uri, artifact_location, experiment, run_name,
params, tags, continue_run_id: a resumed run's MLflow run, continued; find_by_tags: a resumed
run's, found by its tags where the record names none), ``metrics`` (rows of [step, timestamp,
{name: value}]), ``artifacts`` (paths: artifact path -> local path), ``finish`` (status). On
stdout: ``{"started": true, "mlflow_run_id": ...}`` once the run exists, and last the outcome:
``{"ok": true, "mlflow_run_id": ..., "metrics_logged": N}`` (``artifacts_error``: the artifacts
could not be stored) or ``{"ok": false, "error": ...}``; stdin closed before ``finish`` (the
parent died): what came is stored, the run ended KILLED. Started by
:class:`reprotune._trackers.mlflow.MlflowTracker`; not meant to be run by hand.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import queue
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprotune._run.stack import mlflow_store_problem
from reprotune._trackers.priority import TRAINING_NICE, nice_of, set_nice

MAX_METRICS_PER_BATCH = 1000  # MLflow's limit per log_batch call
_MAX_PARAMS_PER_BATCH = 100
MLFLOW_STATUS = {"completed": "FINISHED", "failed": "FAILED"}


def sqlite_file(uri: str) -> Path | None:
    """The database file of a local ``sqlite:///PATH`` tracking URI; None for any other URI.

    Example:
        >>> sqlite_file("sqlite:///runs/mlflow.db"), sqlite_file("http://127.0.0.1:5000")
        (PosixPath('runs/mlflow.db'), None)
    """
    prefix = "sqlite:///"
    return Path(uri[len(prefix) :]) if uri.startswith(prefix) else None


def open_client(uri: str) -> Any:
    """An ``MlflowClient`` for ``uri``. A local SQLite store's folder is made first, as recent MLflow
    does itself: MLflow 3.1 (the floor before 3.9) instead retries a store it cannot open ten times over about
    100 s. So a missing folder is made, and one that cannot be (a file in its path) fails at once,
    on every MLflow version the ranges allow."""
    from mlflow.tracking import MlflowClient

    store = sqlite_file(uri)
    if store is not None:
        folder = store.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(
                f"the SQLite store {uri} cannot be made: its folder {folder} cannot be created ({exc}); "
                "give tracking.uri a path in a folder you can write"
            ) from exc
    if sql_store(uri):
        problem = mlflow_store_problem(_versions("mlflow-skinny", "mlflow", "sqlalchemy"))
        if problem is not None:  # MLflow's own error is an ImportError deep in its store
            raise RuntimeError(
                f"{problem}; install mlflow-skinny 3.9 or later (or SQLAlchemy below 2.1) to mirror "
                f"runs to {uri}"
            )
    return MlflowClient(tracking_uri=uri)


#: Tracking URI schemes that are no SQL store.
_NOT_SQL = frozenset({"http", "https", "databricks", "file", "uc", "databricks-uc"})


def sql_store(uri: str) -> bool:
    """Whether MLflow opens ``uri`` as a SQL store (SQLAlchemy's: ``sqlite:///``, ``postgresql://``, ...).

    Example:
        >>> sql_store("sqlite:///mlflow.db"), sql_store("http://127.0.0.1:5000")
        (True, False)
    """
    return "://" in uri and uri.split(":", 1)[0].lower() not in _NOT_SQL


def _versions(*names: str) -> dict[str, str | None]:
    """The installed version of each distribution named (None: not installed)."""
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def _start(message: dict[str, Any]) -> tuple[Any, str, dict[str, set[int]]]:
    """The client, the run (a resumed run's own, RUNNING again, where it is in the store), and
    the steps of each metric it holds already (the resumed steps among them are not logged
    twice; those it lacks are)."""
    client = open_client(message["uri"])
    experiment, tags = message["experiment"], message["tags"]
    earlier = message.get("continue_run_id")
    if not earlier and message.get("find_by_tags"):
        earlier = _earlier_run(client, experiment, tags)
    continued = _continued(client, earlier, experiment, tags)
    if continued is not None:
        return client, continued[0], continued[1]
    where = Path(message["artifact_location"])
    run_name, params = message["run_name"], message["params"]
    return client, open_run(client, experiment, where, run_name, tags, params), {}


#: The tags of a run that its resume finds it by where the record names none (the attempt before
#: was killed outright, before its end could write it).
_RUN_TAGS = ("reprotune.run_id", "reprotune.run_dir", "config.sha256")


def _earlier_run(client: Any, experiment: str, tags: Mapping[str, str]) -> str | None:
    """The newest active run of ``experiment`` with these :data:`_RUN_TAGS`; None if there is
    none (or the run id holds a ``'``, which MLflow's filters cannot quote)."""
    found, run_id = client.get_experiment_by_name(experiment), tags.get("reprotune.run_id")
    if found is None or run_id is None or "'" in run_id:
        return None
    query = f"tags.`reprotune.run_id` = '{run_id}'"
    try:  # a store that refuses the search: a new run, as for any run not found
        candidates = client.search_runs([found.experiment_id], query, order_by=["attributes.start_time DESC"])
    except Exception:
        return None
    for candidate in candidates:
        if all(candidate.data.tags.get(key) == tags.get(key) for key in _RUN_TAGS):
            return str(candidate.info.run_id)
    return None


def _continued(
    client: Any, run_id: str | None, experiment: str, tags: Mapping[str, str]
) -> tuple[str, dict[str, set[int]]] | None:
    """The run ``run_id`` set RUNNING again, with this attempt's ``tags``, and the steps of each
    of its metrics, when it is an active run of ``experiment`` in this store; else None (a new
    run is opened)."""
    if not run_id:
        return None
    try:
        found = client.get_run(run_id)
        if (
            found.info.lifecycle_stage != "active"
            or client.get_experiment(found.info.experiment_id).name != experiment
        ):
            return None  # deleted since, or of another experiment: a new run
        stored = {key: {m.step for m in client.get_metric_history(run_id, key)} for key in found.data.metrics}
        client.update_run(run_id, status="RUNNING")
        for key, value in sorted(tags.items()):  # this attempt's (its run directory may have moved)
            client.set_tag(run_id, key, value)
    except Exception:  # gone from the store, or another store: a new run
        return None
    return run_id, stored


def open_run(
    client: Any,
    experiment: str,
    artifact_location: Path,
    run_name: str,
    tags: Mapping[str, str],
    params: Mapping[str, str],
) -> str:
    """Create a run in ``experiment`` (made, with ``artifact_location``, if it does not exist),
    with ``tags`` and ``params``; return its id. Runs and studies open theirs alike."""
    from mlflow.entities import Param

    found = client.get_experiment_by_name(experiment)
    if found is None:
        artifact_location.mkdir(parents=True, exist_ok=True)
        experiment_id = client.create_experiment(experiment, artifact_location=artifact_location.as_uri())
    else:
        experiment_id = found.experiment_id
    run_id: str = client.create_run(experiment_id, run_name=run_name, tags=dict(tags)).info.run_id
    items = [Param(k, v) for k, v in sorted(params.items())]
    for i in range(0, len(items), _MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, params=items[i : i + _MAX_PARAMS_PER_BATCH], synchronous=True)
    return run_id


def _say(line: Mapping[str, Any]) -> None:
    """One JSON line to the parent. A parent gone (its end of the pipe closed) hears nothing, and
    the run is served to its end all the same: stdout then goes to ``/dev/null`` (else the
    interpreter's last flush would fail again)."""
    try:
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        with contextlib.suppress(OSError, ValueError):
            nowhere = os.open(os.devnull, os.O_WRONLY)
            os.dup2(nowhere, sys.stdout.fileno())
            os.close(nowhere)


#: The messages of a loop that trains: those the serving thread takes.
_WHILE_TRAINING = frozenset({"start", "metrics"})


@dataclass
class _Run:
    """What the worker holds of its run, passed from the thread that serves it while the loop
    trains to the main thread that ends it."""

    flush_interval_s: float
    lines: queue.Queue[dict[str, Any] | None]
    client: Any = None
    run_id: str = ""
    stored: dict[str, set[int]] = field(default_factory=dict)  # a continued run's steps, by metric
    pending: list[Any] = field(default_factory=list)
    sent: int = 0
    handoff: list[dict[str, Any] | None] = field(default_factory=list)
    error: BaseException | None = None
    artifacts_error: str | None = None
    serving: int | None = None  # the native id of the thread that serves the run while it trains
    over: threading.Event = field(default_factory=threading.Event)  # the main thread's turn

    def flush(self, until: threading.Event | None = None) -> None:
        """Send what is pending, a batch at a time (stopping between batches once ``until`` is set)."""
        while self.pending and not (until is not None and until.is_set()):
            chunk = self.pending[:MAX_METRICS_PER_BATCH]
            self.client.log_batch(self.run_id, metrics=chunk, synchronous=True)
            del self.pending[: len(chunk)]
            self.sent += len(chunk)

    def take(self, message: dict[str, Any]) -> None:
        """A ``start`` or ``metrics`` message."""
        from mlflow.entities import Metric

        if message["op"] == "start":
            self.client, self.run_id, self.stored = _start(message)
            # said at once, so that a worker stopped before its outcome line still names its run
            _say({"started": True, "mlflow_run_id": self.run_id})
        else:
            for step, stamp, values in message["rows"]:
                self.pending.extend(
                    Metric(k, float(v), stamp, step)
                    for k, v in sorted(values.items())
                    if step not in self.stored.get(k, ())
                )

    def log_artifacts(self, paths: Mapping[str, str]) -> None:
        """Store the artifacts; one that cannot be stored is noted (``artifacts_error``), not
        raised: the run keeps its metrics and ends with its own status."""
        self.flush()
        try:
            for artifact_path, local in paths.items():
                if Path(local).is_dir():
                    self.client.log_artifacts(self.run_id, local, artifact_path=artifact_path)
                else:
                    self.client.log_artifact(self.run_id, local, artifact_path=artifact_path or None)
        except Exception as exc:
            self.artifacts_error = f"{type(exc).__name__}: {exc}"


def _read_stdin(run: _Run) -> None:
    """Queue each message of the parent: lower the serving thread as the loop begins (``start``),
    and give the main thread its turn once the loop is over (any other message, or the parent
    went away: the pipe closed)."""
    try:
        for raw in sys.stdin.buffer:
            if raw.strip():
                message = json.loads(raw)
                run.lines.put(message)
                if message["op"] not in _WHILE_TRAINING:
                    run.over.set()
    finally:
        run.lines.put(None)
        run.over.set()


def _while_training(run: _Run) -> None:
    """Serve ``start`` and ``metrics`` until the loop is over; what is left then is the main
    thread's. Its waits end at once when the loop does, and it stops between two of its pieces
    of work (a message, a batch sent)."""
    try:
        from mlflow.entities import Metric  # noqa: F401 (slow; overlaps the parent's model loading)

        while not run.over.is_set():
            batch = [run.lines.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(run.lines.get_nowait())
            for k, message in enumerate(batch):
                if message is None or message["op"] not in _WHILE_TRAINING or run.over.is_set():
                    run.handoff = batch[k:]
                    return
                run.take(message)
                if message["op"] == "start":  # made at the priority it started with: lowered now
                    set_nice(run.serving, TRAINING_NICE)
            if run.client is not None:
                run.flush(until=run.over)
            run.over.wait(run.flush_interval_s)
    except BaseException as exc:  # raised again by the main thread
        run.error = exc
    finally:
        run.over.set()


def serve(run: _Run) -> dict[str, Any]:
    """Serve one run; return the outcome line."""
    training = threading.Thread(target=_while_training, args=(run,), name="mlflow-serving")
    training.start()
    run.serving = training.native_id
    threading.Thread(target=_read_stdin, args=(run,), daemon=True).start()
    started_at = nice_of(None)
    run.over.wait()
    # The loop is over: what the serving thread is doing it finishes at the priority it started
    # with where it may be raised back, and at its nice value elsewhere (a share, never none).
    set_nice(run.serving, started_at)
    training.join()
    if run.error is not None:
        raise run.error
    pending = list(run.handoff)
    while True:  # at normal priority: the loop is over, or the parent went away
        message = pending.pop(0) if pending else run.lines.get()
        if message is None:
            return _ended(run, None)
        op = message["op"]
        if op in _WHILE_TRAINING:
            run.take(message)
        elif op == "artifacts":
            run.log_artifacts(message["paths"])
        elif op == "finish":
            return _ended(run, message["status"])


def _ended(run: _Run, status: str | None) -> dict[str, Any]:
    """End the run with its ``status`` (``finish``), or (None: the parent went away before it)
    KILLED, once what was handed over is stored; the outcome, ``artifacts_error`` included."""
    if run.client is None:
        return {"ok": False, "error": "the run never started", "mlflow_run_id": None, "metrics_logged": 0}
    run.flush()
    run.client.set_terminated(run.run_id, status=MLFLOW_STATUS.get(status or "", "KILLED"))
    outcome: dict[str, Any] = {
        "ok": status is not None,
        "mlflow_run_id": run.run_id,
        "metrics_logged": run.sent,
    }
    if status is None:
        outcome["error"] = "the run's process went away before its end; its MLflow run was ended KILLED"
    else:  # where its artifacts went: an experiment that existed keeps its own location
        outcome["artifact_uri"] = run.client.get_run(run.run_id).info.artifact_uri
    if run.artifacts_error is not None:
        outcome["artifacts_error"] = run.artifacts_error
    return outcome


def _ended_failed(run: _Run) -> None:
    """A run that failed after it was created ends FAILED in MLflow (it stayed RUNNING)."""
    if run.client is not None and run.run_id:
        with contextlib.suppress(Exception):
            run.client.set_terminated(run.run_id, status="FAILED")


def main() -> int:
    import signal

    # The parent ends this process: a terminal's Ctrl-C, a hang-up or a scheduler's SIGTERM sent
    # to the whole group must not kill it before the parent has told it how the run ended (the
    # run stayed RUNNING, its last metrics lost); a parent that dies closes the pipe, which ends it,
    # and a write to it fails (EPIPE: _say) without a SIGPIPE (a launcher's fork may restore it).
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(number, signal.SIG_IGN)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    run = _Run(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0, queue.Queue())
    try:
        outcome = serve(run)
    except Exception as exc:
        _ended_failed(run)
        outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "mlflow_run_id": run.run_id or None}
    _say(outcome)
    return 0 if outcome.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
