"""The processes of verify's legs (reprotune._proof.processes): side by side, each logged whole
in the order started, a failure named with its own output; one at a time, nothing runs after a
failure; a stopped leg gets its grace to record its end, a second stop of verify notwithstanding."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from reprotune._errors import RunFailedError
from reprotune._proof import processes as leg_processes
from reprotune._proof.processes import LegProcesses


def test_side_by_side_logs_in_order_and_reports_the_failing_one(tmp_path: Path) -> None:
    log = tmp_path / "verify.log"
    log.write_text("earlier leg\n")
    missing = tmp_path / "missing.yaml"
    # Neither command trains, so neither takes a turn; --train-lock is still accepted.
    with pytest.raises(RunFailedError) as caught, LegProcesses(log, together=True) as processes:
        failing = processes.start(["run", str(missing)])
        processes.start(["run", str(tmp_path / "other.yaml")])
        processes.wait(failing)
    message = str(caught.value)
    assert f"`reprotune run {missing}` failed with exit code 2" in message
    assert "missing.yaml" in message.split("\n", 1)[1]  # the failing process's own output
    text = log.read_text()
    assert text.startswith("earlier leg\n")  # appended, never overwritten
    assert text.index(f"reprotune run {missing}") < text.index("other.yaml")  # whole, in order
    assert [p.name for p in tmp_path.iterdir()] == ["verify.log"]  # no part log, no lock left


def test_a_failure_not_waited_for_still_raises(tmp_path: Path) -> None:
    log = tmp_path / "verify.log"
    with (
        pytest.raises(RunFailedError, match=r"never-waited\.yaml"),
        LegProcesses(log, together=True) as processes,
    ):
        processes.start(["--version"])
        processes.start(["run", str(tmp_path / "never-waited.yaml")])
    assert "reprotune 0." in log.read_text()


def test_one_at_a_time_runs_nothing_after_a_failure(tmp_path: Path) -> None:
    log = tmp_path / "verify.log"
    missing = tmp_path / "missing.yaml"
    with pytest.raises(RunFailedError, match="missing"), LegProcesses(log, together=False) as processes:
        processes.start(["run", str(missing)])
        processes.start(["--version"])
    text = log.read_text()
    assert f"reprotune run {missing}" in text and "--version" not in text
    assert [p.name for p in tmp_path.iterdir()] == ["verify.log"]


def test_a_second_stop_during_the_grace_does_not_kill_a_leg_mid_record(tmp_path: Path) -> None:
    """A stopped leg that takes a while to record its end after SIGTERM (as a run writes its
    record) ends on its own even when verify is told to stop again meanwhile (a second Ctrl-C): it
    was SIGKILLed there, its record left ``running``."""
    recorded = tmp_path / "recorded"
    script = tmp_path / "leg.py"
    script.write_text(
        "import signal, sys, time\n"
        "def end(*_):\n"
        "    time.sleep(1.5)\n"
        f"    open({str(recorded)!r}, 'w').write('interrupted')\n"
        "    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, end)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "log"
    with open(log, "wb") as out:
        leg = leg_processes.start_leg([sys.executable, str(script)], out, dict(os.environ), own_group=False)
    deadline = time.monotonic() + 60
    while b"ready" not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    second = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))  # during the grace
    second.start()
    started = time.monotonic()
    leg_processes.stop_legs([leg])
    second.join()
    assert recorded.read_text() == "interrupted" and leg.returncode == 143
    assert time.monotonic() - started < leg_processes.STOP_GRACE_S


def test_under_torchrun_at_world_size_1_a_leg_is_a_torchrun_launch_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A verify under torchrun with one process starts its legs as torchrun launches of one, not
    as plain processes that inherit torchrun's variables (before, they ran as torchrun runs of
    their own making); outside torchrun a leg is a plain process."""
    from reprotune._config.schema import ExperimentConfig
    from reprotune._proof.verification import Leg
    from reprotune._proof.verify import _inconclusive_control

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    plain, _ = leg_processes._command(["run", "c.yaml"])
    assert plain == [sys.executable, "-m", "reprotune", "run", "c.yaml"]
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "verify-1")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    launch, env = leg_processes._command(["run", "c.yaml"])
    assert launch[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "-m"]
    assert "TORCHELASTIC_RUN_ID" not in env and "RANK" not in env
    # and its RNG-skip control, which cannot part there (dropout reseeded per micro-batch), is
    # inconclusive rather than failed
    cfg = ExperimentConfig.model_validate({"lora": {"dropout": 0.1}})
    failed = Leg("control-resume", "d", "DIVERGED", passed=False)
    assert _inconclusive_control(cfg, failed).passed is None
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert _inconclusive_control(cfg, failed).passed is False
