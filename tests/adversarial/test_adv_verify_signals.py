"""Issue 24, clean ends: a verify killed (SIGKILL) or stopped (SIGTERM) takes its legs with it,
says so when it can, and a second verify into its directory is refused clearly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tinyrun import TinyProject


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> TinyProject:
    """A config whose legs train long enough to be caught training."""
    project = TinyProject.create(tmp_path_factory.mktemp("adv-verify-signals"))
    project.config("long.yaml", train={"max_steps": 5000, "save_every": 0, "eval_every": 5000})
    return project


def _start_verify(project: TinyProject, out: str) -> tuple[subprocess.Popen[str], psutil.Process]:
    """`reprotune verify long.yaml --out OUT` in a new interpreter, and its first leg once it runs."""
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
    verify = subprocess.Popen(
        [sys.executable, "-m", "reprotune", "verify", "long.yaml", "--out", out, "--no-resume"],
        cwd=project.root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        legs = [p for p in psutil.Process(verify.pid).children() if "reprotune" in " ".join(p.cmdline())]
        if legs:
            return verify, legs[0]
        assert verify.poll() is None, verify.communicate()
        time.sleep(0.2)
    verify.kill()
    raise AssertionError("verify started no leg in 300 s")


def _wait_for_a_record(out: Path) -> None:
    """Until the first leg has made its run directory (it trains, its stop handlers in place)."""
    deadline = time.monotonic() + 300
    while not any(out.rglob("record.json")) and time.monotonic() < deadline:
        time.sleep(0.1)


def _gone(process: psutil.Process, within: float = 120) -> bool:
    try:
        process.wait(timeout=within)
    except psutil.TimeoutExpired:
        process.kill()
        return False
    return True


def test_a_killed_verify_leaves_no_orphan_leg(project: TinyProject) -> None:
    """SIGKILL of verify (nothing of it runs after): its training leg ends too, on the kernel's
    word (it once trained on, an orphan, into the verification directory)."""
    verify, leg = _start_verify(project, "v-kill")
    _wait_for_a_record(project.root / "v-kill")
    os.kill(verify.pid, signal.SIGKILL)
    verify.communicate()
    assert _gone(leg), "the leg trained on after its verify was killed"
    # Stopped, not finished: the leg got SIGTERM from the kernel and handled it as Ctrl-C (its log
    # says so); an orphan would have trained its 5,000 steps to "completed".
    assert "interrupted by SIGTERM" in (project.root / "v-kill" / "verify.log").read_text()
    statuses = {json.loads(r.read_text())["status"] for r in (project.root / "v-kill").rglob("record.json")}
    assert statuses and "completed" not in statuses


def test_a_stopped_verify_says_so_and_is_not_continued_blindly(project: TinyProject) -> None:
    """SIGTERM of verify: exit 143 with a message, the leg stopped and recorded ``interrupted`` (it
    gets SIGTERM and a grace: it was once SIGKILLed, its record left ``running``); a second verify
    into the same directory is refused, saying the first did not finish."""
    verify, leg = _start_verify(project, "v-term")
    _wait_for_a_record(project.root / "v-term")
    os.kill(verify.pid, signal.SIGTERM)
    _, err = verify.communicate(timeout=300)
    assert verify.returncode == 128 + signal.SIGTERM
    assert "reprotune verify: interrupted by SIGTERM" in err
    assert _gone(leg)
    statuses = {json.loads(r.read_text())["status"] for r in (project.root / "v-term").rglob("record.json")}
    assert statuses == {"interrupted"}
    again = project.run_cli("verify", "long.yaml", "--out", "v-term", "--no-resume", check=False)
    assert again.returncode == 2
    assert "holds a verification that did not finish" in again.stderr


def test_a_killed_verify_takes_the_users_command_with_it(tmp_path: Path) -> None:
    """SIGKILL of `verify --command`: the user's own script (here one that would run ten minutes;
    a torchrun launch is stopped the same way and passes it on to its workers) ends too."""
    script = tmp_path / "train.py"
    script.write_text("import time\ntime.sleep(600)\n")
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
    verify = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reprotune",
            "verify",
            "--command",
            f"{sys.executable} train.py",
            "--out",
            "v",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    legs: list[psutil.Process] = []
    while not legs and time.monotonic() < deadline:
        assert verify.poll() is None, "verify ended before it ran the command"
        legs = [p for p in psutil.Process(verify.pid).children() if "train.py" in " ".join(p.cmdline())]
        time.sleep(0.1)
    assert legs, "verify did not run the command in 120 s"
    os.kill(verify.pid, signal.SIGKILL)
    verify.wait()
    assert _gone(legs[0], within=30), "the user's command ran on after its verify was killed"
