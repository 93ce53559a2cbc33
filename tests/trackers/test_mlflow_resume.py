"""A run resumed after its process was killed outright (SIGKILL: no end, no record of its MLflow
run) continues the MLflow run it had, and MLflow gets every step the ledger holds, once."""

from __future__ import annotations

import time
from pathlib import Path

from mlflowstore import seed_mlflow_store
from reprotune._run.ledger import read_ledger
from reprotune._run.record import load_record
from reprotune._trackers.base import RunDescription, TrackerSet
from reprotune._trackers.mlflow import MlflowTracker
from tinyrun import TinyProject


def _steps(uri: str, run_id: str, key: str = "train_loss") -> list[int]:
    from mlflow.tracking import MlflowClient

    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, key))


def _runs(uri: str, experiment: str) -> list[str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    return [r.info.run_id for r in client.search_runs([found.experiment_id])] if found is not None else []


def test_a_resume_with_no_mlflow_run_recorded_finds_its_run_by_its_tags(tmp_path: Path) -> None:
    """The first attempt's child stored steps 1-3 and 6 (4-5 lost with its process) and was
    killed: the resume, whose record names no MLflow run, continues that run (found by the run's
    id, directory and config hash), and stores the steps it lacks, 4, 5 and 7, not 1-3 or 6 again
    (before, a second MLflow run, the first left RUNNING). A new run of the same tags (not a
    resume) is not taken for it."""
    uri = seed_mlflow_store(tmp_path / "mlflow.db")
    tags = {"reprotune.run_id": "run", "reprotune.run_dir": str(tmp_path / "run"), "config.sha256": "c0"}
    run = RunDescription(run_id="run", run_dir=tmp_path / "run", params={"a": "1"}, tags=tags)
    first = MlflowTracker(uri, tmp_path / "artifacts", "killed", flush_interval_s=0)
    TrackerSet([first]).start(run)
    for step in (1, 2, 3, 6):
        first.log_metrics(step, {"train_loss": float(step)})
    deadline = time.monotonic() + 120
    while not (_runs(uri, "killed") and len(_steps(uri, _runs(uri, "killed")[0])) == 4):
        assert time.monotonic() < deadline, "the first child did not store its 4 steps within 2 minutes"
        time.sleep(0.2)
    first.close()  # killed outright
    (first_id,) = _runs(uri, "killed")

    second = TrackerSet([MlflowTracker(uri, tmp_path / "artifacts", "killed", resumed=True)])
    second.start(run)  # the record names no MLflow run: no `continues`
    for step in range(1, 8):  # the ledger's 1-4 (before the checkpoint at 4), then 5-7 trained again
        second.log_metrics(step, {"train_loss": float(step)})
    summary = second.finish("completed")["mlflow"]
    assert summary["mlflow_run_id"] == first_id and summary["metrics_logged"] == 3, summary
    assert _runs(uri, "killed") == [first_id]
    assert _steps(uri, first_id) == [1, 2, 3, 4, 5, 6, 7]

    fresh = TrackerSet([MlflowTracker(uri, tmp_path / "artifacts", "killed")])
    fresh.start(run)
    assert fresh.finish("completed")["mlflow"]["mlflow_run_id"] != first_id


def test_a_run_killed_outright_and_resumed_has_every_step_in_its_one_mlflow_run(tmp_path: Path) -> None:
    """`reprotune run` killed (SIGKILL) after step 5, resumed from its checkpoint at step 4: one
    MLflow run holds steps 1-8 once each, the ledger's values, and ends FINISHED, named by the
    record (before, the resume opened a second run holding steps 5-8 alone)."""
    from mlflow.tracking import MlflowClient

    project = TinyProject.create(tmp_path)
    train = {"max_steps": 8, "save_every": 2, "eval_every": 4}
    config = project.config(tracking={"mlflow": True, "experiment": "killed"}, train=train)
    run_dir = tmp_path / "run"
    killed = project.run_cli(
        "run",
        str(config),
        "--run-dir",
        str(run_dir),
        "--no-progress",
        env={"REPROTUNE_KILL_AT": "step-end:5"},
        check=False,
    )
    assert killed.returncode != 0, killed.stderr[-2000:]
    project.run_cli("resume", str(run_dir), "--no-progress")

    mirrored = load_record(run_dir / "record.json")["trackers"]["mlflow"]
    assert mirrored["ok"] is True, mirrored
    uri = mirrored["tracking_uri"]
    assert _runs(uri, "killed") == [mirrored["mlflow_run_id"]]
    ledger = read_ledger(run_dir / "ledger.jsonl")
    client = MlflowClient(uri)
    history = client.get_metric_history(mirrored["mlflow_run_id"], "train_loss")
    assert sorted((m.step, m.value) for m in history) == [(e.step, e.number("loss")) for e in ledger.train]
    assert _steps(uri, mirrored["mlflow_run_id"], "val_loss") == [4, 8]
    assert client.get_run(mirrored["mlflow_run_id"]).info.status == "FINISHED"


def test_only_trackers_that_keep_what_they_lack_get_a_resumes_earlier_steps() -> None:
    """The ledger's steps before a resume go to MLflow, whose child skips the steps its run holds;
    not to W&B, which cannot tell offline and would log them twice (found by a review)."""
    from reprotune._trackers.base import TrackerSet
    from reprotune._trackers.mlflow import MlflowTracker
    from reprotune._trackers.wandb import WandbTracker

    class Recording:
        def __init__(self, name: str, fills_gaps: bool) -> None:
            self.name, self.fills_gaps, self.steps = name, fills_gaps, []

        def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
            self.steps.append(step)

    mlflow, wandb = Recording("mlflow", True), Recording("wandb", False)
    TrackerSet([mlflow, wandb]).log_earlier_metrics(3, {"train_loss": 1.0})  # type: ignore[list-item]
    assert (mlflow.steps, wandb.steps) == ([3], [])
    assert MlflowTracker.fills_gaps and not getattr(WandbTracker, "fills_gaps", False)


def test_a_store_that_refuses_the_tag_search_means_a_new_run() -> None:
    """The search for a killed attempt's run failing (a filter refused, no permission) made the
    whole mirror fail; it is a run not found: the resume opens a new one."""
    from types import SimpleNamespace

    from reprotune._trackers.mlflow_worker import _earlier_run

    class Refusing:
        def get_experiment_by_name(self, name: str) -> SimpleNamespace:
            return SimpleNamespace(experiment_id="1")

        def search_runs(self, *args: object, **kwargs: object) -> list[object]:
            raise PermissionError("search refused")

    tags = {"reprotune.run_id": "20261206-000000-abcdef12", "reprotune.run_dir": "/r", "config.sha256": "c"}
    assert _earlier_run(Refusing(), "exp", tags) is None
