"""The MLflow tracker. MLflow's synchronous SQLite logging costs about 10 ms a call, so the tracker
hands everything to a child process that sends metrics in batches; ``finish`` waits for it to
drain, so a run that ends has every metric stored.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reprotune._config.secrets import mask_url_credentials
from reprotune._errors import InputError
from reprotune._run.record import Status
from reprotune._trackers.base import RunDescription, TrackerFailed
from reprotune._trackers.mlflow_worker import MLFLOW_STATUS, sqlite_file

#: MLflow's HTTP settings for the child, where the environment sets none: MLflow's own (7 retries
#: with exponential backoff) hold the end of a run about four minutes when its server refuses
#: connections; with 2 retries it gives up in seconds, and a request may still take a minute (an
#: artifact upload on a slow link) before it counts as lost.
HTTP_DEFAULTS: dict[str, str] = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "60"}


#: How long ``finish`` waits for the child to store what is queued and end its run, unless the
#: environment variable of that name says otherwise: a tracking server that answers each request
#: just inside its timeout would otherwise hold the end of the run for hours (a request a batch).
FINISH_TIMEOUT_ENV = "REPROTUNE_TRACKER_FINISH_TIMEOUT_S"
FINISH_TIMEOUT_S = 600.0


def finish_timeout_s(environ: Mapping[str, str]) -> float:
    """The seconds ``finish`` waits: :data:`FINISH_TIMEOUT_ENV` when set to a positive number, else
    :data:`FINISH_TIMEOUT_S`.

    Example:
        >>> finish_timeout_s({}), finish_timeout_s({FINISH_TIMEOUT_ENV: "30"})
        (600.0, 30.0)
    """
    text = environ.get(FINISH_TIMEOUT_ENV, "").strip()
    if not text:
        return FINISH_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise InputError(
            f"{FINISH_TIMEOUT_ENV}={text!r} is not a positive number of seconds",
            source=f"environment variable {FINISH_TIMEOUT_ENV}",
            fix=f"unset {FINISH_TIMEOUT_ENV} (the end of a run then waits {FINISH_TIMEOUT_S:g} s at "
            "most for MLflow), or set it to a number of seconds such as 1200",
        )
    return value


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The MLflow child's environment: ``environ``, with telemetry off and :data:`HTTP_DEFAULTS`
    where it does not say otherwise (a user's own settings win).

    Example:
        >>> env = worker_environment({"MLFLOW_HTTP_REQUEST_TIMEOUT": "5"})
        >>> env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"], env["MLFLOW_HTTP_REQUEST_TIMEOUT"]
        ('2', '5')
    """
    return {"MLFLOW_DISABLE_TELEMETRY": "true", **HTTP_DEFAULTS, **environ}


def resolve_tracking_uri(uri: str) -> str:
    """Make a relative ``sqlite:///file.db`` absolute against the current directory."""
    store = sqlite_file(uri)
    if store is not None and not store.is_absolute():
        return f"sqlite:///{store.resolve()}"
    return uri


class MlflowTracker:
    """Mirrors a run to MLflow, from a child process (``python -m reprotune._trackers.mlflow_worker``).

    MLflow's SQLAlchemy store is plain Python: on a worker thread it holds the GIL for about
    250 us a step and slows a small model's loop by 5%. In a child process it costs the loop only
    a line written to a pipe. The child is started when the tracker is made, so importing mlflow
    (about a second) overlaps loading the model. It uses ``MlflowClient`` with an explicit run id
    (no active-run state). Metrics are buffered and cross the pipe, and reach MLflow in batches, at
    most once per ``flush_interval_s``. While the loop trains, the child's thread that serves
    the run runs at ``nice`` 19 (Linux), mostly on cores the loop leaves free; once it is over, the
    child's main thread, at normal priority, ends the run.

    Args:
        uri: tracking URI, e.g. ``sqlite:///mlflow.db`` (relative paths resolve against the cwd).
        artifact_location: folder for the experiment's artifacts (created if missing).
        experiment: experiment name (created if missing).
        flush_interval_s: how often the child sends what has queued up.
        resumed: a resume of a run: where its record names no MLflow run (the attempt before was
            killed outright), the run the attempts before opened is found by its tags.
    """

    name = "mlflow"
    fills_gaps = True  # a resume's earlier steps: its child keeps those its run lacks

    def __init__(
        self,
        uri: str,
        artifact_location: str | Path,
        experiment: str,
        *,
        flush_interval_s: float = 1.0,
        resumed: bool = False,
    ) -> None:
        self._resumed = resumed
        self._deadline_s = finish_timeout_s(os.environ)  # checked before the run, not at its end
        self.uri = resolve_tracking_uri(uri)
        self.artifact_location = Path(artifact_location).resolve()
        self.experiment = experiment
        self._flush_interval_s = flush_interval_s
        self._started = False
        self._buffer: list[list[Any]] = []
        self._last_send = time.monotonic()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (the child's stderr; closed by finish())
        env = worker_environment(os.environ)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "reprotune._trackers.mlflow_worker", str(flush_interval_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
        )

    def _send(self, message: dict[str, Any]) -> None:
        if self._proc.poll() is not None:
            raise self._failure()
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(message).encode("utf-8") + b"\n")
        self._proc.stdin.flush()

    def _failure(self) -> RuntimeError:
        """Why the child stopped: its last words (JSON on stdout, with the MLflow run it made and
        ended FAILED), else the tail of its stderr."""
        assert self._proc.stdout is not None
        return self._failed(self._proc.stdout.read())

    def _failed(self, out: bytes, late_s: float | None = None) -> RuntimeError:
        """The error for a child that failed, ``out`` being what it wrote on stdout: its outcome
        line's error, else (``late_s``) that it was stopped after that many seconds, else the tail
        of its stderr; naming the MLflow run it made, when it made one."""
        outcome: dict[str, Any] = {}
        run_id = None
        for line in out.decode("utf-8", "replace").splitlines():
            with contextlib.suppress(ValueError):
                outcome = json.loads(line)
                if isinstance(outcome, dict):
                    run_id = outcome.get("mlflow_run_id") or run_id
        error = outcome.get("error") if isinstance(outcome, dict) else None
        if late_s is not None:
            error = (
                f"the MLflow worker did not finish within {late_s:g} s (a slow or unanswering tracking "
                f"server at {self.uri}?) and was stopped; what it had not stored is lost"
                + (f", and its MLflow run {run_id} stays RUNNING" if run_id else "")
                + f"; to wait longer, set {FINISH_TIMEOUT_ENV}"
            )
        if not error:
            self._log.seek(0)
            tail = self._log.read().decode("utf-8", "replace").strip().splitlines()[-3:]
            error = f"mlflow worker exited with code {self._proc.returncode}: " + " | ".join(tail)
        if not run_id:
            return RuntimeError(error)
        where = {"tracking_uri": self.uri, "experiment": self.experiment}
        return TrackerFailed(error, {**where, "mlflow_run_id": run_id})

    def start(self, run: RunDescription) -> None:
        self._started = True
        before = run.continues.get("mlflow") or {}
        same_store = (before.get("tracking_uri"), before.get("experiment")) == (self.uri, self.experiment)
        self._send(
            {
                "op": "start",
                "uri": self.uri,
                "artifact_location": str(self.artifact_location),
                "experiment": self.experiment,
                "run_name": run.run_id,
                "params": dict(run.params),
                "tags": dict(run.tags),
                # a resumed run continues its MLflow run (in this store) rather than open another
                "continue_run_id": before.get("mlflow_run_id") if same_store else None,
                "find_by_tags": self._resumed,
            }
        )

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        # Buffered here and sent at most once per flush interval: one pipe write (and one wake-up
        # of the child) per interval instead of per step.
        now = time.monotonic()
        self._buffer.append([step, int(time.time() * 1000), dict(metrics)])
        if now - self._last_send >= self._flush_interval_s:
            self._send_buffer()
            self._last_send = now

    def _send_buffer(self) -> None:
        if self._buffer:
            self._send({"op": "metrics", "rows": self._buffer})
            self._buffer = []

    def log_artifacts(self, paths: Mapping[str, Path]) -> None:
        self._send_buffer()
        self._send({"op": "artifacts", "paths": {k: str(v) for k, v in paths.items()}})

    def close(self) -> None:
        """Stop the child (if still running) and release its pipes; for a tracker switched off."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for handle in (self._proc.stdin, self._proc.stdout, self._log):
            if handle is not None and not handle.closed:
                handle.close()

    def _read_out(self, seconds: float) -> tuple[bytes, bool]:
        """What the child writes on stdout within ``seconds``, and whether it reached the end (a
        selector, not ``select.select``, which cannot wait on a descriptor past 1023)."""
        assert self._proc.stdout is not None
        fd, end = self._proc.stdout.fileno(), time.monotonic() + seconds
        chunks: list[bytes] = []
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while (left := end - time.monotonic()) > 0 and selector.select(left):
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return b"".join(chunks), True
                chunks.append(chunk)
        return b"".join(chunks), False

    def finish(self, status: Status) -> dict[str, Any]:
        """Tell the child to finish, wait until every metric is stored, and return its summary."""
        if not self._started:  # the run failed before it had anything to mirror
            self.close()
            return {"started": False}
        deadline, started = self._deadline_s, time.monotonic()
        assert self._proc.stdin is not None
        try:
            if self._proc.poll() is None:
                with contextlib.suppress(BrokenPipeError):
                    self._send_buffer()
                    self._send({"op": "finish", "status": status})
                    self._proc.stdin.close()
            out, whole = self._read_out(deadline)  # its outcome line, then EOF
            try:  # the deadline holds for the whole finish: the child's exit too
                left = deadline - (time.monotonic() - started)
                if not whole or left <= 0:
                    raise subprocess.TimeoutExpired(self._proc.args, deadline)
                self._proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
                raise self._failed(out + self._read_out(5.0)[0], late_s=deadline) from None
            lines = out.decode("utf-8", "replace").strip().splitlines()
            result = json.loads(lines[-1]) if lines else {}
            if self._proc.returncode != 0 or not result.get("ok"):
                raise self._failed(out)
        except BaseException:
            if self._proc.poll() is None:
                self._proc.kill()
            raise
        finally:
            self._log.close()
        summary = {
            "tracking_uri": self.uri,
            "experiment": self.experiment,
            "mlflow_run_id": result["mlflow_run_id"],
            "metrics_logged": result["metrics_logged"],
            "artifact_uri": result.get("artifact_uri"),
        }
        if result.get("artifacts_error"):
            # The run is usable (its params, tags and every metric, ended with the run's status):
            # the tracker is not failed, but what it could not store is said, and recorded.
            summary["artifacts_error"] = result["artifacts_error"]
            line = (
                f"warning: tracker 'mlflow' could not store the run's artifacts in MLflow run "
                f"{result['mlflow_run_id']} ({result['artifacts_error']}); it holds the metrics and "
                f"ended {MLFLOW_STATUS.get(status, 'KILLED')}"
            )
            print(mask_url_credentials(line), file=sys.stderr, flush=True)
        return summary
