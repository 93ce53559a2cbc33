"""Trackers: MLflow on a real SQLite store; a failing tracker is switched off, the run goes on."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from mlflowstore import seed_mlflow_store
from reprotune._trackers.base import RunDescription, TrackerSet, flatten_params
from reprotune._trackers.mlflow import MlflowTracker, worker_environment


class _Broken:
    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    def start(self, run: RunDescription) -> None:
        pass

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.calls += 1
        raise ConnectionError("tracking server unreachable")

    def log_artifacts(self, paths: Mapping[str, Path]) -> None:
        pass

    def finish(self, status: str) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        self.closed = True


def _run(tmp_path: Path) -> RunDescription:
    return RunDescription(
        run_id="20260101-000000-abcdef12",
        run_dir=tmp_path,
        params={"train.learning_rate": "0.001", "lora.r": "4"},
        tags={"git.commit": "deadbeef"},
    )


def test_flatten_params() -> None:
    """Nested config becomes dotted string params; None is written as null."""
    assert flatten_params({"a": {"b": 1, "c": None}, "d": [1, 2], "e": {}}) == {
        "a.b": "1",
        "a.c": "null",
        "d": "[1, 2]",
        "e": "{}",
    }
    long = flatten_params({"data": {"system_prompt": "x" * 8699}})["data.system_prompt"]
    assert len(long) == 6000 and long.endswith(
        " ...[cut from 8699 characters; the whole value is in config.yaml]"
    )


def test_failing_tracker_reported_once_and_dropped(tmp_path: Path) -> None:
    """A tracker that raises is reported once, switched off, and its failure summarised."""
    lines: list[str] = []
    broken = _Broken()
    trackers = TrackerSet([broken], report=lines.append)
    trackers.start(_run(tmp_path))
    for step in range(1, 6):
        trackers.log_metrics(step, {"train_loss": 1.0})
    summary = trackers.finish("completed")
    assert broken.calls == 1
    assert broken.closed  # a tracker switched off is closed at once
    assert len(lines) == 1 and "broken" in lines[0] and "switched off" in lines[0]
    assert summary == {"broken": {"ok": False, "error": "ConnectionError: tracking server unreachable"}}


def test_mlflow_sqlite_store_gets_everything(tmp_path: Path) -> None:
    """Params, tags, every metric of every step and an artifact reach a real SQLite store."""
    from mlflow.tracking import MlflowClient

    uri = seed_mlflow_store(tmp_path / "mlflow.db")
    artifact = tmp_path / "record.json"
    artifact.write_text("{}\n")
    tracker = MlflowTracker(uri, tmp_path / "artifacts", "unit")
    trackers = TrackerSet([tracker])
    trackers.start(_run(tmp_path))
    for step in range(1, 201):
        trackers.log_metrics(step, {"train_loss": 1.0 / step, "lr": 0.1})
    trackers.log_artifacts({"": artifact})
    summary = trackers.finish("completed")
    assert summary["mlflow"]["ok"] is True
    assert summary["mlflow"]["metrics_logged"] == 400

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(summary["mlflow"]["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params == {"train.learning_rate": "0.001", "lora.r": "4"}
    assert run.data.tags["git.commit"] == "deadbeef"
    history = client.get_metric_history(run.info.run_id, "train_loss")
    assert sorted((m.step, m.value) for m in history) == [(s, 1.0 / s) for s in range(1, 201)]
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["record.json"]


def _threads(pid: int) -> dict[int, tuple[int, int]]:
    """Each thread of process ``pid``: its scheduling policy and nice value."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            tid = int(task.name)
            threads[tid] = (os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid))
    return threads


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")
def test_mlflow_child_yields_to_the_loop(tmp_path: Path) -> None:
    """While the run trains, the thread of the MLflow child that serves it runs at nice 19, its
    main thread at normal priority, and no thread at SCHED_IDLE (there it got no CPU while other
    processes kept the cores busy, and the main thread, waiting for it to end the run, was stopped
    at the deadline: no MLflow run at all). It stores everything."""
    tracker = MlflowTracker(seed_mlflow_store(tmp_path / "mlflow.db"), tmp_path / "artifacts", "unit")
    trackers = TrackerSet([tracker])
    trackers.start(_run(tmp_path))
    pid, deadline = tracker._proc.pid, time.monotonic() + 60
    while (19 not in {nice for _, nice in _threads(pid).values()}) and time.monotonic() < deadline:
        time.sleep(0.05)  # the child lowers the thread once it has made the run
    threads, own = _threads(pid), os.getpriority(os.PRIO_PROCESS, 0)  # the suite may run niced
    assert {nice for _, nice in threads.values()} == {own, 19} and threads[pid] == (os.SCHED_OTHER, own), (
        threads
    )
    assert {policy for policy, _ in threads.values()} == {os.SCHED_OTHER}, threads
    trackers.log_metrics(1, {"train_loss": 0.5})
    assert trackers.finish("completed")["mlflow"]["metrics_logged"] == 1


def _wait_for_the_run(uri: str, experiment: str) -> None:
    """Until the MLflow child has made its run in ``experiment`` (its start served), a minute at
    most: a fixed sleep was too short on a loaded machine."""
    from mlflow.tracking import MlflowClient

    client, deadline = MlflowClient(uri), time.monotonic() + 120
    while time.monotonic() < deadline:
        found = client.get_experiment_by_name(experiment)
        if found is not None and client.search_runs([found.experiment_id]):
            return
        time.sleep(0.2)
    raise AssertionError(f"the MLflow child made no run in {experiment!r} within 2 minutes")


def test_a_ctrl_c_to_the_group_leaves_the_mlflow_run_to_be_ended(tmp_path: Path) -> None:
    """A terminal's Ctrl-C (or a scheduler's SIGTERM) reaches the MLflow child with the run: it
    lives on until the run tells it how it ended (before, it died, the MLflow run stayed RUNNING
    and the record named no MLflow run)."""
    import signal

    from mlflow.tracking import MlflowClient

    uri = seed_mlflow_store(tmp_path / "mlflow.db")
    tracker = MlflowTracker(uri, tmp_path / "artifacts", "unit")
    trackers = TrackerSet([tracker])
    trackers.start(_run(tmp_path))
    trackers.log_metrics(1, {"train_loss": 0.5})
    _wait_for_the_run(uri, "unit")  # the child serves the run: its signals were set before
    for number in (signal.SIGINT, signal.SIGTERM):
        os.kill(tracker._proc.pid, number)
    time.sleep(0.5)
    summary = trackers.finish("interrupted")["mlflow"]
    assert summary["ok"] is True and summary["metrics_logged"] == 1, summary
    assert MlflowClient(uri).get_run(summary["mlflow_run_id"]).info.status == "KILLED"


def test_a_resumed_run_continues_its_mlflow_run_without_logging_a_step_twice(tmp_path: Path) -> None:
    """Interrupted after step 5, resumed from the checkpoint at step 4: the second attempt continues
    the first's MLflow run (before, a second run of the same name, step 5 in both, and the record
    named only the second), logs steps 6 on, and ends it FINISHED."""
    from dataclasses import replace

    from mlflow.tracking import MlflowClient

    uri = seed_mlflow_store(tmp_path / "mlflow.db")
    first = TrackerSet([MlflowTracker(uri, tmp_path / "artifacts", "resumed")])
    first.start(_run(tmp_path))
    for step in range(1, 6):
        first.log_metrics(step, {"train_loss": float(step)})
    before = first.finish("interrupted")
    second = TrackerSet([MlflowTracker(uri, tmp_path / "artifacts", "resumed")])
    second.start(replace(_run(tmp_path), continues=before))
    for step in range(5, 8):  # the resumed attempt trains steps 5-7 again from the checkpoint at 4
        second.log_metrics(step, {"train_loss": float(step)})
    after = second.finish("completed")["mlflow"]
    client = MlflowClient(uri)
    first_id = before["mlflow"]["mlflow_run_id"]
    assert after["mlflow_run_id"] == first_id, (before, after)
    assert client.get_run(after["mlflow_run_id"]).info.status == "FINISHED"
    history = client.get_metric_history(after["mlflow_run_id"], "train_loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5, 6, 7]
    experiment = client.get_experiment_by_name("resumed")
    assert len(client.search_runs([experiment.experiment_id])) == 1
    # The run moved (its tag follows), and a run deleted since is not continued: a new one is
    # opened (before, the deleted run was taken, and every log to it failed).
    moved = replace(_run(tmp_path), continues=second.summaries or {}, tags={"reprotune.run_dir": "/moved"})
    third = TrackerSet([MlflowTracker(uri, tmp_path / "artifacts", "resumed")])
    third.start(moved)
    third.log_metrics(8, {"train_loss": 8.0})
    assert third.finish("completed")["mlflow"]["mlflow_run_id"] == first_id
    assert client.get_run(first_id).data.tags["reprotune.run_dir"] == "/moved"
    client.delete_run(first_id)
    fourth = TrackerSet([MlflowTracker(uri, tmp_path / "artifacts", "resumed")])
    fourth.start(moved)
    fourth.log_metrics(9, {"train_loss": 9.0})
    summary = fourth.finish("completed")["mlflow"]
    assert summary["ok"] is True and summary["mlflow_run_id"] != first_id, summary


def test_the_record_says_where_the_artifacts_went_when_the_experiment_kept_its_own(tmp_path: Path) -> None:
    """An experiment that exists keeps its artifact location, whatever tracking.artifact_location
    asks: the summary's artifact_uri says where they went (before, the record kept only the one
    asked for, where nothing was written)."""
    from mlflow.tracking import MlflowClient

    uri = seed_mlflow_store(tmp_path / "mlflow.db")
    MlflowClient(uri).create_experiment("kept", artifact_location=(tmp_path / "first").as_uri())
    trackers = TrackerSet([MlflowTracker(uri, tmp_path / "asked", "kept")])
    trackers.start(_run(tmp_path))
    summary = trackers.finish("completed")["mlflow"]
    assert summary["artifact_uri"].startswith((tmp_path / "first").as_uri()), summary
    assert not (tmp_path / "asked").exists()


def test_artifacts_that_cannot_be_stored_leave_the_run_finished_with_its_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Artifacts that cannot be stored (the artifact folder replaced by a file): the MLflow run
    of a completed run ends FINISHED with its metrics, and the summary stays ok, naming the run
    and the artifacts' error, which is said once on stderr (before, the run ended FAILED and the
    record called the tracker failed: nothing read the run back, not an eval, a study or a
    verdict)."""
    import shutil

    from mlflow.tracking import MlflowClient

    uri = seed_mlflow_store(tmp_path / "mlflow.db")
    tracker = MlflowTracker(uri, tmp_path / "artifacts", "failing-artifacts")
    lines: list[str] = []
    trackers = TrackerSet([tracker], report=lines.append)
    trackers.start(_run(tmp_path))
    trackers.log_metrics(1, {"train_loss": 0.5})
    (tmp_path / "record.json").write_text("{}")
    _wait_for_the_run(uri, "failing-artifacts")  # the experiment and its artifact folder exist
    shutil.rmtree(tmp_path / "artifacts")
    (tmp_path / "artifacts").write_text("not a folder")
    trackers.log_artifacts({"": tmp_path / "record.json"})
    summary = trackers.finish("completed")["mlflow"]
    assert summary["ok"] is True and summary["metrics_logged"] == 1 and lines == [], (summary, lines)
    assert "artifacts" in summary["artifacts_error"], summary
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and summary["mlflow_run_id"] in warned[0] and "FINISHED" in warned[0], warned
    run = MlflowClient(uri).get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.metrics["train_loss"] == 0.5


def test_a_tracker_that_fails_after_its_run_exists_ends_it_failed_and_names_it(tmp_path: Path) -> None:
    """Metrics that cannot be stored (the MLflow run deleted meanwhile): the tracker is switched
    off and the record's summary names the run beside the error (before, it lost its id, so
    nothing could find it)."""
    from mlflow.tracking import MlflowClient

    uri = seed_mlflow_store(tmp_path / "mlflow.db")
    lines: list[str] = []
    trackers = TrackerSet([MlflowTracker(uri, tmp_path / "artifacts", "deleted")], report=lines.append)
    trackers.start(_run(tmp_path))
    _wait_for_the_run(uri, "deleted")
    client = MlflowClient(uri)
    (made,) = client.search_runs([client.get_experiment_by_name("deleted").experiment_id])
    client.delete_run(made.info.run_id)
    trackers.log_metrics(1, {"train_loss": 0.5})
    summary = trackers.finish("completed")["mlflow"]
    assert summary["ok"] is False and summary["mlflow_run_id"] == made.info.run_id, summary
    assert len(lines) == 1 and "switched off" in lines[0], lines


def test_mlflow_failure_does_not_raise_into_the_run(tmp_path: Path) -> None:
    """An unusable tracking URI is reported and switched off; nothing escapes."""
    lines: list[str] = []
    bad = tmp_path / "not-a-dir"
    bad.write_text("x")
    tracker = MlflowTracker(f"sqlite:///{bad / 'mlflow.db'}", tmp_path / "a", "unit")
    trackers = TrackerSet([tracker], report=lines.append)
    trackers.start(_run(tmp_path))
    for step in range(1, 4):
        trackers.log_metrics(step, {"train_loss": 1.0})
    summary = trackers.finish("completed")
    assert summary["mlflow"]["ok"] is False
    assert len(lines) == 1 and "mlflow" in lines[0]
    # At once, on every MLflow the ranges allow (MLflow 3.1 alone would retry it for about 100 s).
    assert f"its folder {bad} cannot be created" in lines[0] and "tracking.uri" in lines[0]


def test_a_sqlite_store_in_a_folder_not_yet_made_gets_the_run(tmp_path: Path) -> None:
    """The store's folder is made (MLflow 3.1 itself would fail on it, after retrying ten times)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'new' / 'folder' / 'mlflow.db'}"
    trackers = TrackerSet([MlflowTracker(uri, tmp_path / "artifacts", "unit")])
    trackers.start(_run(tmp_path))
    trackers.log_metrics(1, {"train_loss": 0.5})
    summary = trackers.finish("completed")
    assert summary["mlflow"]["ok"] is True, summary
    run = MlflowClient(tracking_uri=uri).get_run(summary["mlflow"]["mlflow_run_id"])
    assert run.data.metrics == {"train_loss": 0.5}


def test_the_mlflow_child_gives_up_an_unreachable_server_after_two_retries() -> None:
    """Where the environment sets none, the child runs with 2 HTTP retries and 60 s a request
    (MLflow's own 7 retries held a run's end about four minutes on a refused connection); a
    user's own settings are kept, telemetry is off unless the user turned it on."""
    assert worker_environment({"PATH": "/bin"}) == {
        "PATH": "/bin",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "60",
    }
    own = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_DISABLE_TELEMETRY": "false"}
    assert worker_environment(own) == {**own, "MLFLOW_HTTP_REQUEST_TIMEOUT": "60"}


def test_an_unreachable_server_is_reported_and_the_trackers_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tracking server nobody listens on, with the child's own retry settings: the failure is
    reported once and finish returns (seconds, where MLflow's defaults took about four minutes)."""
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    lines: list[str] = []
    trackers = TrackerSet([MlflowTracker("http://127.0.0.1:9", tmp_path / "a", "unit")], report=lines.append)
    trackers.start(_run(tmp_path))
    trackers.log_metrics(1, {"train_loss": 1.0})
    assert trackers.finish("completed")["mlflow"]["ok"] is False
    assert len(lines) == 1 and "mlflow" in lines[0]


def test_mlflow_tracker_of_a_run_that_never_started(tmp_path: Path) -> None:
    """A run that fails before tracking starts: no false tracker failure, the child is stopped."""
    lines: list[str] = []
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "a", "unit")
    summary = TrackerSet([tracker], report=lines.append).finish("failed")
    assert summary == {"mlflow": {"ok": True, "started": False}}
    assert lines == []
    assert tracker._proc.returncode is not None


def test_a_tracking_server_that_never_answers_is_given_up_at_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that takes connections and never answers (a hung proxy): finish stops the child
    after REPROTUNE_TRACKER_FINISH_TIMEOUT_S and says so, instead of waiting on every request's
    timeout and retries (before, there was no deadline at all)."""
    import socket

    monkeypatch.setenv("REPROTUNE_TRACKER_FINISH_TIMEOUT_S", "3")
    with socket.create_server(("127.0.0.1", 0)) as server:  # listens; nobody ever accepts or answers
        uri = f"http://127.0.0.1:{server.getsockname()[1]}"
        lines: list[str] = []
        tracker = MlflowTracker(uri, tmp_path / "a", "unit")
        trackers = TrackerSet([tracker], report=lines.append)
        trackers.start(_run(tmp_path))
        trackers.log_metrics(1, {"train_loss": 1.0})
        started = time.monotonic()
        summary = trackers.finish("completed")["mlflow"]
        waited = time.monotonic() - started
    assert summary["ok"] is False and "did not finish within 3 s" in summary["error"], summary
    assert uri in summary["error"] and "REPROTUNE_TRACKER_FINISH_TIMEOUT_S" in summary["error"]
    assert waited < 60  # the request timeout of the child is 60 s: it was not waited out
    assert tracker._proc.returncode is not None and len(lines) == 1


def test_a_bad_finish_deadline_is_refused_by_name() -> None:
    """The deadline's variable, set to something that is not a positive number, is named."""
    from reprotune._errors import InputError
    from reprotune._trackers.mlflow import finish_timeout_s

    for text in ("soon", "0", "-1", "nan", "10m"):
        with pytest.raises(InputError, match=f"REPROTUNE_TRACKER_FINISH_TIMEOUT_S={text!r}"):
            finish_timeout_s({"REPROTUNE_TRACKER_FINISH_TIMEOUT_S": text})


def test_a_bad_finish_deadline_is_refused_before_the_run_not_at_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tracker checks the variable when it is made, before any child starts or any step runs
    (before, a typo was found at finish, after the whole training, and the MLflow run stayed
    RUNNING)."""
    from reprotune._errors import InputError

    monkeypatch.setenv("REPROTUNE_TRACKER_FINISH_TIMEOUT_S", "10m")
    with pytest.raises(InputError, match="not a positive number of seconds"):
        MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "a", "unit")


def test_finish_reads_the_worker_through_a_descriptor_past_1023(tmp_path: Path) -> None:
    """A training process holding many files: the worker's pipe gets a descriptor past 1023, which
    select.select cannot wait on (finish failed with "filedescriptor out of range"); the run's end
    still reaches MLflow."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.fail(f"this test needs a descriptor limit of at least 1200 (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "a", "unit")
        assert tracker._proc.stdout is not None and tracker._proc.stdout.fileno() > 1023
        trackers = TrackerSet([tracker])
        trackers.start(_run(tmp_path))
        trackers.log_metrics(1, {"train_loss": 0.5})
        summary = trackers.finish("completed")["mlflow"]
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert summary["ok"] is True and summary["metrics_logged"] == 1, summary
