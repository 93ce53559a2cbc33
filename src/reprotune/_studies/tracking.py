"""MLflow for a study: one parent run, with the study's runs as its children.

Each run mirrors itself to MLflow as it always does (its own tracker, in its own child process);
once a run is complete, the study tags its MLflow run as a child of the study's parent run
(``mlflow.parentRunId``, which the MLflow UI nests by) with the study id, the seed that moved and
its value. The parent run holds the study's config as params, its summaries as metrics and
``study.json`` and ``report.html`` as artifacts. The parent's id is kept in ``mlflow.json`` so a
resumed study goes on with the same parent.

An observer, like every tracker: if MLflow fails, the failure is reported once, tracking is
switched off, and the study goes on. ``MlflowClient`` is used with explicit run ids (no
active-run state); mlflow is imported only when a study is tracked.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from reprotune._config.secrets import mask_url_credentials
from reprotune._documents import read_json_file
from reprotune._jsonio import write_json_atomic
from reprotune._run.record import Status
from reprotune._trackers.mlflow import resolve_tracking_uri
from reprotune._trackers.mlflow_worker import MAX_METRICS_PER_BATCH, MLFLOW_STATUS, open_client, open_run


class StudyTracker:
    """The MLflow parent run of a study.

    Args:
        uri: tracking URI (a relative ``sqlite:///`` path resolves against the current directory).
        artifact_location: where a new experiment keeps its artifacts.
        experiment: the experiment name (the runs' own).
        state_file: ``mlflow.json`` in the study directory.
        report: where one warning line goes if MLflow fails.
    """

    def __init__(
        self,
        uri: str,
        artifact_location: str,
        experiment: str,
        state_file: Path,
        report: Callable[[str], None],
    ) -> None:
        self.uri = resolve_tracking_uri(uri)
        self.artifact_location = Path(artifact_location).resolve()
        self.experiment = experiment
        self.state_file = state_file
        self.report = report
        self.client: Any = None
        self.parent_run_id: str | None = None
        self.failure: str | None = None

    @property
    def on(self) -> bool:
        return self.failure is None and self.parent_run_id is not None

    def _guard(self, action: str, call: Callable[[], None]) -> None:
        if self.failure is not None:
            return
        try:
            call()
        except Exception as exc:  # an observer must never stop the study
            self.failure = f"{type(exc).__name__}: {exc}"
            self.report(
                f"warning: MLflow failed during {action} and is switched off for the study "
                f"({self.failure}); the study and its study.json go on"
            )

    def start(self, study_id: str, params: Mapping[str, str], tags: Mapping[str, str]) -> None:
        """Open the parent run, or reopen the one ``mlflow.json`` names."""
        self._guard("start", lambda: self._start(study_id, params, tags))

    def _start(self, study_id: str, params: Mapping[str, str], tags: Mapping[str, str]) -> None:
        self.client = open_client(self.uri)
        if self.state_file.is_file():
            state = read_json_file(self.state_file, what="study MLflow state", fix="remove it")
            shown = mask_url_credentials(self.uri)  # as mlflow.json holds it: never a password
            if state.get("tracking_uri") in (shown, self.uri) and state.get("parent_run_id"):
                self.client.get_run(state["parent_run_id"])  # raises if it is gone
                self.parent_run_id = str(state["parent_run_id"])
                return
        self.parent_run_id = open_run(
            self.client, self.experiment, self.artifact_location, f"study {study_id}", tags, params
        )
        write_json_atomic(
            self.state_file,
            {
                "tracking_uri": mask_url_credentials(self.uri),
                "experiment": self.experiment,
                "parent_run_id": self.parent_run_id,
            },
        )

    def adopt(self, child_run_id: str, tags: Mapping[str, str]) -> None:
        """Make MLflow run ``child_run_id`` a child of the parent, with ``tags``."""

        def call() -> None:
            for key, value in {"mlflow.parentRunId": str(self.parent_run_id), **tags}.items():
                self.client.set_tag(child_run_id, key, value)

        if self.on:
            self._guard("tagging a run", call)

    def finish(
        self, metrics: Mapping[str, float], artifacts: Sequence[Path], status: Status
    ) -> dict[str, Any]:
        """Log the study's metrics and files on the parent and end it; return what the study says."""

        def call() -> None:
            import time

            from mlflow.entities import Metric

            stamp = int(time.time() * 1000)
            items = [Metric(metric_name(k), float(v), stamp, 0) for k, v in sorted(metrics.items())]
            for i in range(0, len(items), MAX_METRICS_PER_BATCH):
                chunk = items[i : i + MAX_METRICS_PER_BATCH]
                self.client.log_batch(self.parent_run_id, metrics=chunk, synchronous=True)
            for path in artifacts:
                if path.is_file():
                    self.client.log_artifact(self.parent_run_id, str(path))
            self.client.set_terminated(self.parent_run_id, status=MLFLOW_STATUS.get(status, "KILLED"))

        if self.on:
            self._guard("finish", call)
        if self.failure is not None:
            return {"ok": False, "error": self.failure}
        return {
            "ok": True,
            "tracking_uri": self.uri,
            "experiment": self.experiment,
            "parent_run_id": self.parent_run_id,
        }


def metric_name(name: str) -> str:
    """``name`` with the characters MLflow refuses in metric names replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", name)
