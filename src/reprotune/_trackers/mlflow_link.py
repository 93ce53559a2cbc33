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
not report there), :func:`run_to_link` answers with no run id, and the callback mirrors the run
with the tracker ``reprotune run`` uses (``_trackers.mlflow.MlflowTracker``) instead.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from reprotune._errors import InputError
from reprotune._run.record import Status
from reprotune._trackers.base import RunDescription


class MlflowRunLink:
    """A :class:`reprotune._trackers.base.Tracker` over an existing MLflow run."""

    name = "mlflow"

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        from mlflow.tracking import MlflowClient

        self.tracking_uri, self.run_id = tracking_uri, run_id
        self._client = MlflowClient(tracking_uri=tracking_uri)

    def start(self, run: RunDescription) -> None:
        for key, value in run.tags.items():
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

    def finish(self, status: Status) -> dict[str, Any]:
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


def require_mlflow(where: str) -> None:
    """Refuse, where the callback is made (on every rank alike), to mirror to MLflow without it.

    Raises:
        InputError: mlflow is not installed.
    """
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise InputError(
            f"{where} needs mlflow, which is not installed",
            source=where,
            fix="pip install mlflow, or leave mlflow= unset",
        ) from None


def run_to_link(setting: bool | None, report: Callable[[str], None]) -> tuple[str, str | None] | None:
    """The MLflow run ``ReprotuneCallback(mlflow=setting)`` mirrors to, as (tracking URI, run id):
    the active one unless False; with True and none active, (the tracking URI in force, None): a
    run of its own, made as ``reprotune run`` makes one (``MlflowTracker``)."""
    if setting is False:
        return None
    found = active_mlflow_run()
    if found is not None:
        return found
    if not setting:
        return None
    import mlflow

    uri = str(mlflow.get_tracking_uri())
    report(f"reprotune: no MLflow run is active: the run is mirrored to a new one at {uri}")
    return uri, None
