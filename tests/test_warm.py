"""The suite's warm zygote (tests/warm.py, tests/inject/warm_legs.py): what a forked process keeps
of a real one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from warm import launcher, needs_cold_start


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.exists() else ""


def test_a_forked_leg_ends_when_the_process_that_asked_for_it_dies(tmp_path: Path) -> None:
    """A leg the zygote forked for another forked process (a verify leg, a torchrun rank) gets
    SIGTERM when that process dies, as PR_SET_PDEATHSIG ends a real verify's legs: a killed
    launcher leaves no orphan rank waiting for a collective."""
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\ntime.sleep(300)\n", encoding="utf-8")
    requester = tmp_path / "requester.py"
    requester.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            from reprotune._proof import processes
            leg = processes.subprocess.Popen([sys.executable, {str(sleeper)!r}], stdout=sys.stdout,
                                             stderr=sys.stderr)
            print(type(leg).__name__, leg.pid, flush=True)
            time.sleep(300)
            """
        ),
        encoding="utf-8",
    )
    warm = launcher()
    assert warm is not None
    asking = warm.start([], cwd=tmp_path, env=dict(os.environ), script=str(requester))
    leg_pid = 0
    try:
        deadline = time.monotonic() + 120
        while not _text(asking.stdout_path).strip():
            assert asking.poll() is None and time.monotonic() < deadline, _text(asking.stderr_path)
            time.sleep(0.05)
        kind, pid = _text(asking.stdout_path).split()
        leg_pid = int(pid)
        assert kind == "WarmPopen" and _alive(leg_pid)  # forked by the zygote, running
        asking.kill()
        assert asking.wait(30) == -signal.SIGKILL
        deadline = time.monotonic() + 30
        while _alive(leg_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(leg_pid), "the leg outlived the process that asked for it"
    finally:
        if leg_pid and _alive(leg_pid):
            os.kill(leg_pid, signal.SIGKILL)


def test_a_call_that_times_out_shows_where_it_waited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A forked call that outlives its timeout is killed, and what it was waiting on is printed
    first (every forked process's stacks, written on SIGUSR1): a hang in CI says where it hung."""
    script = tmp_path / "waits.py"
    script.write_text(
        "import time\n\ndef waiting_here():\n    time.sleep(300)\n\nwaiting_here()\n", encoding="utf-8"
    )
    warm = launcher()
    assert warm is not None
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run([], cwd=tmp_path, env=dict(os.environ), timeout=3, script=str(script))
    shown = capsys.readouterr().out
    assert "the call timed out" in shown
    assert "in waiting_here" in shown and "waits.py" in shown


def test_torchrun_may_signal_a_forked_rank_that_has_just_exited(tmp_path: Path) -> None:
    """torchrun closes a failed launch with ``killpg`` of every rank whose ``poll()`` said it still
    ran. A real rank that exits in between is a zombie in its process group until torchrun waits
    for it, so the signal finds it; a rank the zygote forked is reaped at once. Its close must not
    raise ProcessLookupError then (it crashed torchrun before its failure summary once in CI)."""
    rank = tmp_path / "rank.py"
    rank.write_text("pass\n", encoding="utf-8")
    closer = tmp_path / "closer.py"
    closer.write_text(
        textwrap.dedent(
            f"""
            import os, sys, time
            from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler
            handler = SubprocessHandler(sys.executable, ("-u", {str(rank)!r}), {{}}, None, None, 0, None)
            print(type(handler.proc).__name__, flush=True)
            deadline = time.monotonic() + 60
            while True:  # until the zygote has reaped it
                try:
                    os.kill(handler.proc.pid, 0)
                except ProcessLookupError:
                    break
                if time.monotonic() > deadline:
                    sys.exit("the rank was not reaped within 60 s")
                time.sleep(0.01)
            handler.close()  # as torchrun's close does after a poll that saw it running
            print("closed", flush=True)
            """
        ),
        encoding="utf-8",
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # a launcher zygote: torchrun's modules loaded
    warm = launcher(env)
    assert warm is not None
    done = warm.run([], cwd=tmp_path, env=env, timeout=120, script=str(closer))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["WarmPopen", "closed"]


def test_a_command_that_pins_its_runs_mode_on_a_portable_run_starts_cold(tmp_path: Path) -> None:
    """``trace``, ``eval`` and ``rerun`` of a run made in a portable CPU mode put that mode in force
    before torch loads: a fork of the zygote (torch loaded, native kernels) cannot, so such a call
    starts a real interpreter; reading the run (``compare``) or a native run forks."""
    for name, cpu_isa in (("portable", "avx2-compatible"), ("native", "native")):
        (tmp_path / name).mkdir()
        record = {"config": {"determinism": {"cpu_isa": cpu_isa}}}
        (tmp_path / name / "record.json").write_text(json.dumps(record), encoding="utf-8")
    env = dict(os.environ)
    for command in ("trace", "eval", "rerun"):
        assert needs_cold_start([command, "portable", "--step", "1"], env, env, tmp_path)
        assert not needs_cold_start([command, "native", "--step", "1"], env, env, tmp_path)
    assert not needs_cold_start(["compare", "portable", "native"], env, env, tmp_path)
    assert needs_cold_start(["run", "cfg.yaml", "--set", "determinism.cpu_isa=avx2-compatible"], env, env)


def test_a_mirrored_runs_mlflow_child_is_forked_and_stores_everything(tmp_path: Path) -> None:
    """A forked run with MLflow on: its MLflow child is forked from the zygote too (no interpreter
    runs ``-m reprotune._trackers.mlflow_worker``), fed through the pipes handed over, and the
    store holds the run with its metrics."""
    import psutil
    from mlflow.tracking import MlflowClient

    from tinyrun import TinyProject

    project = TinyProject.create(tmp_path)
    project.config(tracking={"mlflow": True}, train={"max_steps": 4, "eval_every": 4, "save_every": 0})
    run = project.start_cli("run", "cfg.yaml", "--run-dir", "run", "--no-progress")
    real = set()
    while run.poll() is None:
        for process in psutil.process_iter(["cmdline"]):
            if (process.info["cmdline"] or [])[1:3] == ["-m", "reprotune._trackers.mlflow_worker"]:
                real.add(process.pid)
        time.sleep(0.05)
    assert run.returncode == 0, run.result().stderr[-3000:]
    assert real == set()
    mirrored = json.loads((tmp_path / "run" / "record.json").read_text())["trackers"]["mlflow"]
    assert mirrored["ok"] is True
    client = MlflowClient(tracking_uri=mirrored["tracking_uri"])
    history = client.get_metric_history(mirrored["mlflow_run_id"], "train_loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]
