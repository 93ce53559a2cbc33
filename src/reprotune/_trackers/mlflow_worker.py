"""The MLflow tracker's child process: reads JSON lines on stdin, writes to MLflow, answers on stdout.

Messages (one JSON object a line): ``start`` (uri, artifact_location, experiment, run_name,
params, tags), ``metrics`` (rows of [step, timestamp, {name: value}]), ``artifacts`` (paths: artifact path ->
local path), ``finish`` (status). The last line on stdout is the outcome:
``{"ok": true, "mlflow_run_id": ..., "metrics_logged": N}`` or ``{"ok": false, "error": ...}``.
Started by :class:`reprotune._trackers.mlflow.MlflowTracker`; not meant to be run by hand.
"""

from __future__ import annotations

import contextlib
import json
import queue
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
    does itself: MLflow 3.1 (the floor) instead retries a store it cannot open ten times over about
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
    return MlflowClient(tracking_uri=uri)


def _start(message: dict[str, Any]) -> tuple[Any, str]:
    client = open_client(message["uri"])
    where = Path(message["artifact_location"])
    run_name, tags, params = message["run_name"], message["tags"], message["params"]
    return client, open_run(client, message["experiment"], where, run_name, tags, params)


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


def _background(on: bool) -> None:
    """While the loop trains, run only on a core it leaves idle (``SCHED_IDLE``); Linux only.

    An observer must not slow what it observes: with the loop's intra-op threads on every core,
    MLflow's start-up and SQLAlchemy work at normal priority cost the quickstart's steps about
    10 %. Nothing is lost by waiting: metrics queue, a full pipe makes the loop wait, and once the
    loop is over (artifacts, finish) this process goes back to normal priority to drain.
    """
    import os

    with contextlib.suppress(OSError, AttributeError):
        policy = os.SCHED_IDLE if on else os.SCHED_OTHER
        os.sched_setscheduler(0, policy, os.sched_param(0))


def serve(flush_interval_s: float) -> dict[str, Any]:
    """Serve one run; return the outcome line."""
    import os

    _background(True)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
    threading.Thread(target=_read_stdin, args=(lines,), daemon=True).start()
    from mlflow.entities import Metric  # slow; overlaps the parent's model loading

    client: Any = None
    run_id = ""
    pending: list[Any] = []
    sent = 0

    def flush() -> None:
        nonlocal sent
        while pending:
            chunk = pending[:MAX_METRICS_PER_BATCH]
            client.log_batch(run_id, metrics=chunk, synchronous=True)
            del pending[: len(chunk)]
            sent += len(chunk)

    while True:
        batch = [lines.get()]
        while True:
            try:
                batch.append(lines.get_nowait())
            except queue.Empty:
                break
        for message in batch:
            if message is None:
                flush() if client is not None else None
                return {
                    "ok": client is not None,
                    "mlflow_run_id": run_id or None,
                    "metrics_logged": sent,
                    "error": None if client is not None else "the run never started",
                }
            op = message["op"]
            if op == "start":
                client, run_id = _start(message)
            elif op == "metrics":
                for step, stamp, values in message["rows"]:
                    pending.extend(Metric(k, float(v), stamp, step) for k, v in sorted(values.items()))
            elif op == "artifacts":
                _background(False)  # the loop is over
                flush()
                for artifact_path, local in message["paths"].items():
                    if Path(local).is_dir():
                        client.log_artifacts(run_id, local, artifact_path=artifact_path)
                    else:
                        client.log_artifact(run_id, local, artifact_path=artifact_path or None)
            elif op == "finish":
                _background(False)
                if client is None:
                    return {
                        "ok": False,
                        "error": "finished before the run started",
                        "mlflow_run_id": None,
                        "metrics_logged": 0,
                    }
                flush()
                client.set_terminated(run_id, status=MLFLOW_STATUS.get(message["status"], "KILLED"))
                return {"ok": True, "mlflow_run_id": run_id, "metrics_logged": sent}
        if client is not None:
            flush()
        time.sleep(flush_interval_s)


def main() -> int:
    try:
        outcome = serve(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
    except Exception as exc:
        outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(outcome) + "\n")
    sys.stdout.flush()
    return 0 if outcome.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
