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

With ``ReprotuneCallback(mlflow=True)`` and no MLflow run active at train begin (the Trainer does
not report there), the callback starts one itself (:func:`start_own_run`: MLflow's tracking URI
in force, ``MLFLOW_EXPERIMENT_ID`` or ``MLFLOW_EXPERIMENT_NAME`` else experiment ``reprotune``);
then this tracker also logs each step's metrics and ends the run with the run's status.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from reprotune._run.record import Status
from reprotune._trackers.base import RunDescription


class MlflowRunLink:
    """A :class:`reprotune._trackers.base.Tracker` over an existing MLflow run."""

    name = "mlflow"

    def __init__(self, tracking_uri: str, run_id: str, *, owned: bool = False) -> None:
        from mlflow.tracking import MlflowClient

        self.tracking_uri, self.run_id, self.owned = tracking_uri, run_id, owned
        self._client = MlflowClient(tracking_uri=tracking_uri)

    def start(self, run: RunDescription) -> None:
        for key, value in {**run.tags, "reprotune.run_dir": str(Path(run.run_dir).resolve())}.items():
            self._client.set_tag(self.run_id, key, value)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self.owned:
            return  # the Trainer logs its own metrics to this run
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._client.log_batch(
            self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()]
        )

    def log_artifacts(self, paths: Mapping[str, Path]) -> None:
        for key, path in paths.items():
            where = f"reprotune/{key}" if key else "reprotune"
            if path.is_dir():
                self._client.log_artifacts(self.run_id, str(path), artifact_path=where)
            elif path.is_file():
                self._client.log_artifact(self.run_id, str(path), artifact_path=where)

    def finish(self, status: Status) -> dict[str, Any]:
        self._client.set_tag(self.run_id, "reprotune.status", status)
        if self.owned:
            ended = {"completed": "FINISHED", "stopped": "FINISHED", "interrupted": "KILLED"}
            self._client.set_terminated(self.run_id, ended.get(status, "FAILED"))
        return {
            "tracking_uri": self.tracking_uri,
            "mlflow_run_id": self.run_id,
            "linked": "started by ReprotuneCallback(mlflow=True)" if self.owned else "the Trainer's run",
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


def start_own_run(run_name: str) -> tuple[str, str]:
    """Start an MLflow run for a Trainer that reports nowhere: (tracking URI, run id). The URI in
    force (``MLFLOW_TRACKING_URI`` or MLflow's default); the experiment ``MLFLOW_EXPERIMENT_ID``,
    else ``MLFLOW_EXPERIMENT_NAME``, else ``reprotune`` (made if missing)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = str(mlflow.get_tracking_uri())
    client = MlflowClient(tracking_uri=uri)
    experiment_id = os.environ.get("MLFLOW_EXPERIMENT_ID")
    if not experiment_id:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "reprotune"
        found = client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(name)
    return uri, str(client.create_run(experiment_id, run_name=run_name).info.run_id)


def run_to_link(
    setting: bool | None, report: Callable[[str], None], run_name: str
) -> tuple[str, str, bool] | None:
    """The MLflow run ``ReprotuneCallback(mlflow=setting)`` mirrors to, as (tracking URI, run id,
    started here): the active one unless False; with True and none active, one started here."""
    if setting is False:
        return None
    found = active_mlflow_run()
    if found is not None:
        return (*found, False)
    if not setting:
        return None
    uri, run_id = start_own_run(run_name)
    report(f"reprotune: no MLflow run was active: started run {run_id} at {uri}")
    return uri, run_id, True
