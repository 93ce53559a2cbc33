"""The MLflow run a Trainer script already logs to, linked to the reprotune run (not a second run).

With ``report_to="mlflow"`` the Trainer's own ``MLflowCallback`` starts an MLflow run before
``ReprotuneCallback`` sees the training begin (or the script started one itself). The callback
then hands this tracker that run's id and tracking URI: the run gets reprotune's tags (config,
data, manifest and model hashes, git commit and dirty flag, reprotune's run id) and
``reprotune.run_dir``, and at the end ``reprotune.status`` and the record, ledger, adapter and split
manifest as artifacts under ``reprotune/``. It logs no metrics (the Trainer logs its own) and
works through ``MlflowClient`` on the run id, so it also reaches the run after the Trainer ended
it. The record's ``trackers.mlflow`` then names the run, and ``reprotune verify`` puts its verdict
there too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from reprotune._trackers.base import RunDescription


class MlflowRunLink:
    """A :class:`reprotune._trackers.base.Tracker` over an existing MLflow run."""

    name = "mlflow"

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        from mlflow.tracking import MlflowClient

        self.tracking_uri, self.run_id = tracking_uri, run_id
        self._client = MlflowClient(tracking_uri=tracking_uri)

    def start(self, run: RunDescription) -> None:
        for key, value in {**run.tags, "reprotune.run_dir": str(Path(run.run_dir).resolve())}.items():
            self._client.set_tag(self.run_id, key, value)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        return None  # the Trainer logs its own metrics to this run

    def log_artifacts(self, paths: Mapping[str, Path]) -> None:
        for key, path in paths.items():
            where = f"reprotune/{key}" if key else "reprotune"
            if path.is_dir():
                self._client.log_artifacts(self.run_id, str(path), artifact_path=where)
            elif path.is_file():
                self._client.log_artifact(self.run_id, str(path), artifact_path=where)

    def finish(self, status: str) -> dict[str, Any]:
        self._client.set_tag(self.run_id, "reprotune.status", status)
        return {
            "tracking_uri": self.tracking_uri,
            "mlflow_run_id": self.run_id,
            "linked": "the Trainer's run",
        }

    def close(self) -> None:
        return None


def active_mlflow_run() -> tuple[str, str] | None:
    """The (tracking URI, run id) of the MLflow run active in this process, if mlflow is imported
    and one is active (the Trainer's ``MLflowCallback`` imports it when it reports to MLflow)."""
    mlflow: Any = sys.modules.get("mlflow")
    if mlflow is None:
        return None
    run = mlflow.active_run()
    if run is None:
        return None
    return str(mlflow.get_tracking_uri()), str(run.info.run_id)


def run_to_link(setting: bool | None, report: Callable[[str], None]) -> tuple[str, str] | None:
    """The MLflow run ``ReprotuneCallback(mlflow=setting)`` links: the active one unless False;
    with True, a warning when none is active."""
    if setting is False:
        return None
    found = active_mlflow_run()
    if found is None and setting:
        report("warning: ReprotuneCallback(mlflow=True): no MLflow run is active at train begin")
    return found
