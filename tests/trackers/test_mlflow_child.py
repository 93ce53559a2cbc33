"""The MLflow tracker's child process on its own: how the end of a run waits for it, and what it
stores when the run's process goes away (a real SQLite store, a real child)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlflowstore import seed_mlflow_store
from reprotune._trackers.base import RunDescription, TrackerSet
from reprotune._trackers.mlflow import MlflowTracker


def _run(tmp_path: Path) -> RunDescription:
    return RunDescription(run_id="20260101-000000-abcdef12", run_dir=tmp_path, params={"a": "1"}, tags={})


def _can_raise_a_thread_back() -> bool:
    """Whether a thread of this process may lower its nice value again (CAP_SYS_NICE, RLIMIT_NICE)."""
    allowed: list[bool] = []

    def probe() -> None:
        tid = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, tid, 1)
            os.setpriority(os.PRIO_PROCESS, tid, 0)
            allowed.append(True)
        except OSError:
            allowed.append(False)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return allowed == [True]


@contextlib.contextmanager
def _busy_core(core: int, loops: int) -> Iterator[None]:
    """``loops`` processes spinning on ``core`` at normal priority until the block ends."""
    spin = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True:\n    pass\n"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(loops)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not _can_raise_a_thread_back(),
    reason="the serving thread is raised back at the loop's end only where a thread may be (Linux, "
    "CAP_SYS_NICE or RLIMIT_NICE); elsewhere it ends at nice 19, minutes behind busy processes",
)
def test_busy_processes_on_its_core_do_not_lose_the_mlflow_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes spin on the one core the MLflow child may use, from its start to the run's
    end: the run still reaches MLflow, well within the deadline (before, the thread that serves
    the run was at SCHED_IDLE, got no CPU behind them, and the main thread waited for it until
    the deadline stopped the child: no MLflow run, and the run's end held for the whole
    deadline)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("REPROTUNE_TRACKER_FINISH_TIMEOUT_S", "90")
    uri = seed_mlflow_store(tmp_path / "mlflow.db")
    core = max(os.sched_getaffinity(0))
    mask = os.sched_getaffinity(0)
    with _busy_core(core, loops=2):
        os.sched_setaffinity(0, {core})  # the child inherits it
        try:
            tracker = MlflowTracker(uri, tmp_path / "artifacts", "busy")
        finally:
            os.sched_setaffinity(0, mask)
        trackers = TrackerSet([tracker])
        trackers.start(_run(tmp_path))
        for step in range(1, 11):
            trackers.log_metrics(step, {"train_loss": 1.0 / step})
        started = time.monotonic()
        summary = trackers.finish("completed")["mlflow"]
        waited = time.monotonic() - started
    assert summary["ok"] is True and summary["metrics_logged"] == 10, summary
    assert waited < 60, waited
    run = MlflowClient(uri).get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.metrics["train_loss"] == 0.1


def test_the_end_of_a_run_does_not_wait_out_the_childs_flush_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread that serves the run waits between its batches; the loop's end cuts that wait
    short (before, it slept it out, and the main thread waited for it: with a 60 s interval the
    end of the run was stopped at a 20 s deadline, its MLflow run left RUNNING)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("REPROTUNE_TRACKER_FINISH_TIMEOUT_S", "20")
    uri = seed_mlflow_store(tmp_path / "mlflow.db")
    trackers = TrackerSet([MlflowTracker(uri, tmp_path / "artifacts", "slow", flush_interval_s=60)])
    trackers.start(_run(tmp_path))
    trackers.log_metrics(1, {"train_loss": 0.5})
    _wait_for_a_run(uri, "slow")  # the serving thread has taken the start and waits
    summary = trackers.finish("completed")["mlflow"]
    assert summary["ok"] is True and summary["metrics_logged"] == 1, summary
    assert MlflowClient(uri).get_run(summary["mlflow_run_id"]).info.status == "FINISHED"


def _wait_for_a_run(uri: str, experiment: str) -> str:
    """The id of the run the MLflow child made in ``experiment``, once it is there (2 minutes at most)."""
    from mlflow.tracking import MlflowClient

    client, deadline = MlflowClient(uri), time.monotonic() + 120
    while time.monotonic() < deadline:
        found = client.get_experiment_by_name(experiment)
        runs = client.search_runs([found.experiment_id]) if found is not None else []
        if runs:
            return str(runs[0].info.run_id)
        time.sleep(0.2)
    raise AssertionError(f"the MLflow child made no run in {experiment!r} within 2 minutes")


@pytest.mark.parametrize("closed", ["stdin", "stdin+stdout"], ids=["stdin-closed", "both-pipes-closed"])
def test_a_parent_gone_leaves_every_metric_it_handed_over_and_the_run_killed(
    tmp_path: Path, closed: str
) -> None:
    """The run's process dies (its pipes close) right after handing over 149 steps: the child
    stores every one and ends the MLflow run KILLED. Before, with both pipes closed, the child's
    "started" line to a closed stdout raised BrokenPipeError: it exited, the run FAILED with no
    metric; with stdin alone closed, it stored them and left the run RUNNING."""
    from mlflow.tracking import MlflowClient

    uri = seed_mlflow_store(tmp_path / "mlflow.db")
    tracker = MlflowTracker(uri, tmp_path / "artifacts", "orphaned", flush_interval_s=0)
    trackers = TrackerSet([tracker])
    trackers.start(_run(tmp_path))
    for step in range(1, 150):
        trackers.log_metrics(step, {"train_loss": 1.0 / step})
    proc = tracker._proc
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    if closed == "stdin+stdout":
        proc.stdout.close()
    proc.wait(timeout=120)
    run_id = _wait_for_a_run(uri, "orphaned")
    client = MlflowClient(uri)
    history = client.get_metric_history(run_id, "train_loss")
    assert sorted(m.step for m in history) == list(range(1, 150))
    assert client.get_run(run_id).info.status == "KILLED"
    tracker.close()
