"""The MLflow tracker's child process: reads JSON lines on stdin, writes to MLflow, answers on stdout.

Messages (one JSON object a line): ``start`` (uri, artifact_location, experiment, run_name,
params, tags, continue_run_id: a resumed run's MLflow run, continued), ``metrics`` (rows of
[step, timestamp, {name: value}]), ``artifacts`` (paths: artifact path -> local path),
``finish`` (status). On stdout: ``{"started": true, "mlflow_run_id": ...}`` once the run exists,
and last the outcome:
``{"ok": true, "mlflow_run_id": ..., "metrics_logged": N}`` or ``{"ok": false, "error": ...}``.
Started by :class:`reprotune._trackers.mlflow.MlflowTracker`; not meant to be run by hand.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import queue
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprotune._run.stack import mlflow_store_problem

MAX_METRICS_PER_BATCH = 1000  # MLflow's limit per log_batch call
_MAX_PARAMS_PER_BATCH = 100
MLFLOW_STATUS = {"completed": "FINISHED", "failed": "FAILED"}


def _read_stdin(lines: queue.Queue[dict[str, Any] | None]) -> None:
    for raw in sys.stdin.buffer:
        if raw.strip():
            lines.put(json.loads(raw))
    lines.put(None)  # the parent closed the pipe


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


def _start(message: dict[str, Any]) -> tuple[Any, str, dict[str, int]]:
    """The client, the run (a resumed run's own, RUNNING again, where it is in the store), and
    the last step of each metric it holds already (the resumed steps up to it are not logged
    twice)."""
    client = open_client(message["uri"])
    continued = _continued(client, message.get("continue_run_id"), message["experiment"], message["tags"])
    if continued is not None:
        return client, continued[0], continued[1]
    where = Path(message["artifact_location"])
    run_name, tags, params = message["run_name"], message["tags"], message["params"]
    return client, open_run(client, message["experiment"], where, run_name, tags, params), {}


def _continued(
    client: Any, run_id: str | None, experiment: str, tags: Mapping[str, str]
) -> tuple[str, dict[str, int]] | None:
    """The run ``run_id`` set RUNNING again, with this attempt's ``tags``, and the last step of
    each of its metrics, when it is an active run of ``experiment`` in this store; else None (a
    new run is opened)."""
    if not run_id:
        return None
    try:
        found = client.get_run(run_id)
        if (
            found.info.lifecycle_stage != "active"
            or client.get_experiment(found.info.experiment_id).name != experiment
        ):
            return None  # deleted since, or of another experiment: a new run
        last = {
            key: max(m.step for m in client.get_metric_history(run_id, key)) for key in found.data.metrics
        }
        client.update_run(run_id, status="RUNNING")
        for key, value in sorted(tags.items()):  # this attempt's (its run directory may have moved)
            client.set_tag(run_id, key, value)
    except Exception:  # gone from the store, or another store: a new run
        return None
    return run_id, last


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


def _idle_priority() -> None:
    """Run the calling thread only on a core the loop leaves idle (``SCHED_IDLE``); Linux only.

    An observer must not slow what it observes: with the loop's intra-op threads on every core,
    MLflow's start-up and SQLAlchemy work at normal priority cost the quickstart's steps about
    10 %. Nothing is lost by waiting: metrics queue, and a full pipe makes the loop wait. The
    policy is the thread's own: only the thread that serves the run while it trains takes it, and
    the main thread, never lowered, drains what is left once the loop is over (a process cannot
    raise itself back from ``SCHED_IDLE`` without privileges: it drained at idle priority, for
    minutes behind other busy processes).
    """
    import os

    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread


@dataclass
class _Run:
    """What the worker holds of its run, passed from the thread that serves it while the loop
    trains to the main thread that ends it."""

    flush_interval_s: float
    lines: queue.Queue[dict[str, Any] | None]
    client: Any = None
    run_id: str = ""
    logged_through: dict[str, int] = field(default_factory=dict)  # a continued run's last steps
    pending: list[Any] = field(default_factory=list)
    sent: int = 0
    handoff: list[dict[str, Any] | None] = field(default_factory=list)
    error: BaseException | None = None

    def flush(self) -> None:
        while self.pending:
            chunk = self.pending[:MAX_METRICS_PER_BATCH]
            self.client.log_batch(self.run_id, metrics=chunk, synchronous=True)
            del self.pending[: len(chunk)]
            self.sent += len(chunk)

    def take(self, message: dict[str, Any]) -> None:
        """A ``start`` or ``metrics`` message."""
        from mlflow.entities import Metric

        if message["op"] == "start":
            self.client, self.run_id, self.logged_through = _start(message)
            # said at once, so that a worker stopped before its outcome line still names its run
            sys.stdout.write(json.dumps({"started": True, "mlflow_run_id": self.run_id}) + "\n")
            sys.stdout.flush()
        else:
            for step, stamp, values in message["rows"]:
                self.pending.extend(
                    Metric(k, float(v), stamp, step)
                    for k, v in sorted(values.items())
                    if step > self.logged_through.get(k, -1)
                )


def _while_training(run: _Run) -> None:
    """Serve ``start`` and ``metrics`` at idle priority until the loop is over (``artifacts``,
    ``finish``, or the pipe closed): that message, and what follows, are the main thread's."""
    _idle_priority()
    try:
        from mlflow.entities import Metric  # noqa: F401 (slow; overlaps the parent's model loading)

        while True:
            batch = [run.lines.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(run.lines.get_nowait())
            for k, message in enumerate(batch):
                if message is None or message["op"] not in ("start", "metrics"):
                    run.handoff = batch[k:]
                    return
                run.take(message)
            if run.client is not None:
                run.flush()
            time.sleep(run.flush_interval_s)
    except BaseException as exc:  # raised again by the main thread
        run.error = exc


def serve(run: _Run) -> dict[str, Any]:
    """Serve one run; return the outcome line."""
    threading.Thread(target=_read_stdin, args=(run.lines,), daemon=True).start()
    training = threading.Thread(target=_while_training, args=(run,))
    training.start()
    training.join()
    if run.error is not None:
        raise run.error
    pending = list(run.handoff)
    while True:  # at normal priority: the loop is over, or the parent went away
        message = pending.pop(0) if pending else run.lines.get()
        if message is None:
            if run.client is not None:
                run.flush()
            return {
                "ok": run.client is not None,
                "mlflow_run_id": run.run_id or None,
                "metrics_logged": run.sent,
                "error": None if run.client is not None else "the run never started",
            }
        op = message["op"]
        if op in ("start", "metrics"):
            run.take(message)
        elif op == "artifacts":
            run.flush()
            for artifact_path, local in message["paths"].items():
                if Path(local).is_dir():
                    run.client.log_artifacts(run.run_id, local, artifact_path=artifact_path)
                else:
                    run.client.log_artifact(run.run_id, local, artifact_path=artifact_path or None)
        elif op == "finish":
            if run.client is None:
                return {
                    "ok": False,
                    "error": "finished before the run started",
                    "mlflow_run_id": None,
                    "metrics_logged": 0,
                }
            run.flush()
            run.client.set_terminated(run.run_id, status=MLFLOW_STATUS.get(message["status"], "KILLED"))
            # where its artifacts went: an experiment that existed keeps its own location
            artifact_uri = run.client.get_run(run.run_id).info.artifact_uri
            return {
                "ok": True,
                "mlflow_run_id": run.run_id,
                "metrics_logged": run.sent,
                "artifact_uri": artifact_uri,
            }


def _ended_failed(run: _Run) -> None:
    """A run that failed after it was created ends FAILED in MLflow (it stayed RUNNING)."""
    if run.client is not None and run.run_id:
        with contextlib.suppress(Exception):
            run.client.set_terminated(run.run_id, status="FAILED")


def main() -> int:
    import os
    import signal

    # The parent ends this process: a terminal's Ctrl-C, a hang-up or a scheduler's SIGTERM sent
    # to the whole group must not kill it before the parent has told it how the run ended (the
    # run stayed RUNNING, its last metrics lost); a parent that dies closes the pipe, which ends it.
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_IGN)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    run = _Run(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0, queue.Queue())
    try:
        outcome = serve(run)
    except Exception as exc:
        _ended_failed(run)
        outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "mlflow_run_id": run.run_id or None}
    sys.stdout.write(json.dumps(outcome) + "\n")
    sys.stdout.flush()
    return 0 if outcome.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
