"""``reprotune verify --command "torchrun ... train.py"``: a user's Trainer script at world size 2
(CPU, gloo). The callback applies verify's stop after step K and its data-seed control on every
rank (on rank 0 alone, the stop left rank 1 waiting forever and the control trained the ranks on
different data orders), so the verification ends, with a resume leg at a step that is not a save
step; and a leg that cannot finish is stopped within a bound, saying why."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from trainer_scripts import OFFLINE_ENV, ScriptProject

from reprotune._proof import command_legs, processes
from warm import run_module, run_reprotune

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _torchrun(project: ScriptProject, *extra: str, script: str = "hf_trainer.py") -> str:
    argv = project.argv(script, *extra)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return shlex.join([*launch, *argv[1:]])


def _verify(project: ScriptProject, command: str, resume_at: int) -> dict[str, dict[str, Any]]:
    """``reprotune verify --command COMMAND --resume-at K``: PASS, and its legs by name."""
    argv = ["verify", "--out", "ver", "--command", command, "--resume-at", str(resume_at)]
    # verify, its torchrun launches and their ranks forked from a warm zygote (tests/warm.py)
    env = {**os.environ, **OFFLINE_ENV, "OMP_NUM_THREADS": "1"}
    done = run_reprotune(argv, cwd=project.root, env=env, timeout=3000)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    report = json.loads((project.root / "ver" / "verification.json").read_text(encoding="utf-8"))
    legs = {leg["name"]: leg for leg in report["legs"]}
    assert legs["rerun"]["verdict"] == "IDENTICAL"
    assert legs["control-data-seed"]["verdict"] == "DIVERGED"
    assert legs["resume"]["verdict"] == "IDENTICAL" and legs["resume"]["evidence"]["resumed_at"] == resume_at
    return legs


def test_verify_command_under_torchrun_passes_with_a_resume_leg(tmp_path: Path) -> None:
    """Trainer, world size 2, --resume-at 3 (no Trainer checkpoint there but the one the stop
    makes): the rerun IDENTICAL, the control DIVERGED, the stop-and-resume leg ends (it once hung)
    and is judged; PASS."""
    project = ScriptProject.create(tmp_path)
    _verify(project, _torchrun(project), resume_at=3)
    checkpoint = project.root / "ver" / "resume" / "trainer-output" / "checkpoint-3"
    assert sorted(p.name for p in checkpoint.glob("rng_state*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]


def test_verify_command_sft_trainer_under_torchrun_resumes_at_a_save_step(tmp_path: Path) -> None:
    """TRL's SFTTrainer, world size 2, saving every 2 steps, --resume-at 2 (a save step): PASS,
    and the resumed leg started from the Trainer's own step-2 checkpoint, which names its run."""
    project = ScriptProject.create(tmp_path)
    _verify(project, _torchrun(project, "--save-steps", "2", script="trl_sft.py"), resume_at=2)
    checkpoint = project.root / "ver" / "resume" / "trainer-output" / "checkpoint-2"
    assert sorted(p.name for p in checkpoint.glob("rng_state*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]
    record = json.loads((project.root / "ver" / "resume" / "record.json").read_text(encoding="utf-8"))
    assert record["trainer"]["class"] == "trl.trainer.sft_trainer.SFTTrainer"
    assert [a.get("from_step") for a in record["attempts"]] == [None, 2]


def test_a_leg_that_cannot_finish_is_stopped_within_the_bound(tmp_path: Path) -> None:
    """A leg past its bound (here 1 s, for the test) is stopped with SIGTERM and fails saying it
    did not finish and what usually holds such a command; no process of it is left, also one the
    command started itself (`sh -c 'python sleepy.py; true'`: the SIGTERM reached only the shell,
    and the script slept on as an orphan)."""
    script = tmp_path / "sleepy.py"
    script.write_text("import time\ntime.sleep(600)\n")
    command = ["sh", "-c", f"{sys.executable} {script}; true"]
    runner = command_legs.Runner(command, tmp_path / "log", tmp_path, print, 1.0)
    from reprotune._errors import RunFailedError
    from reprotune.integrations.controls import Controls

    with pytest.raises(RunFailedError) as caught:
        runner.leg("rerun", Controls(run_dir=tmp_path / "rerun"))
    assert "the rerun leg did not finish within 1 s: stopped; the script hung" in caught.value.message
    torchrun = command_legs.Runner(
        ["torchrun", "--nproc_per_node", "2", "t.py"], tmp_path / "l", tmp_path, print
    )
    assert "a rank waiting for another that stopped" in torchrun._timeout_text()
    assert _still_running(script) == []


def test_a_leg_whose_child_ignores_sigterm_is_killed_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leg past its bound whose script ignores SIGTERM (started under `sh -c`, so a grandchild
    of verify): after the grace (here 1 s, for the test) the whole group gets SIGKILL; the leg
    fails saying it did not finish, and no process of it is left."""
    script = tmp_path / "stubborn.py"
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)\n")
    monkeypatch.setattr(processes, "STOP_GRACE_S", 1.0)
    command = ["sh", "-c", f"{sys.executable} {script}; true"]
    runner = command_legs.Runner(command, tmp_path / "log", tmp_path, print, 2.0)
    from reprotune._errors import RunFailedError
    from reprotune.integrations.controls import Controls

    started = time.monotonic()
    with pytest.raises(RunFailedError) as caught:
        runner.leg("rerun", Controls(run_dir=tmp_path / "rerun"))
    assert "the rerun leg did not finish within 2 s" in caught.value.message
    assert time.monotonic() - started < 20  # the 1 s grace (the default is 30 s)
    assert _still_running(script) == []


def test_a_killed_member_of_a_legs_group_is_gone_before_it_is_reaped() -> None:
    """The stop's "is any of the group still there" counts running processes: one killed and not
    yet reaped (a zombie) has ended, so the stop does not wait out its grace for it."""
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert processes.group_alive(process.pid)
        process.kill()
        deadline = time.monotonic() + 10
        while psutil.Process(process.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert psutil.Process(process.pid).status() == psutil.STATUS_ZOMBIE  # killed, not reaped
        assert not processes.group_alive(process.pid)
    finally:
        process.kill()
        process.wait()
    assert not processes.group_alive(process.pid)


def _still_running(script: Path) -> list[psutil.Process]:
    """The processes running ``script`` that have not ended. A zombie has ended: killed, it waits
    only for its parent to read its exit status, and a grandchild whose parent (``sh``) was killed
    too waits for the machine's init, which in a container may not read it soon (CI saw one)."""
    return [
        process
        for process in psutil.process_iter(["cmdline", "status"])
        if str(script) in " ".join(process.info["cmdline"] or [])
        and process.info["status"] != psutil.STATUS_ZOMBIE
    ]


def test_a_rank_resumed_without_its_rng_file_is_named_as_the_cause(tmp_path: Path) -> None:
    """A 2-rank Trainer run stopped after step 3, its checkpoint's rng_state_1.pth removed, then
    resumed: the callback warns at once and records what was restored; the finished run DIVERGES
    from an uninterrupted one, and the first cause names rank 1 and the file (the Trainer itself
    only logs it at INFO level)."""
    from reprotune._jsonio import sha256_file
    from reprotune._proof.compare import compare_runs
    from reprotune._run.checkpoint_files import TRAINER_CHECKPOINT_MARKER as CHECKPOINT_MARKER
    from reprotune._run.record import load_record
    from reprotune.integrations import controls

    project = ScriptProject.create(tmp_path)
    command = shlex.split(_torchrun(project))
    env = {**os.environ, **OFFLINE_ENV, "OMP_NUM_THREADS": "1"}

    def launch(run_dir: str, **steer: str) -> subprocess.CompletedProcess[str]:
        variables = {
            controls.RUN_DIR: str(project.root / run_dir),
            controls.OUTPUT_DIR: str(project.root / run_dir / "out"),
            **steer,
        }
        assert command[1:3] == ["-m", "torch.distributed.run"]
        done = run_module(command[2], command[3:], cwd=project.root, env={**env, **variables}, timeout=900)
        assert done.returncode == 0, done.stderr[-4000:]
        return done

    launch("whole")
    launch("cut", **{controls.STOP_AFTER: "3"})
    checkpoint = project.root / "cut" / "out" / "checkpoint-3"
    # Every rank's facts at the checkpoint, gathered to rank 0: who, and its own RNG file's hash.
    marker = json.loads((checkpoint / CHECKPOINT_MARKER).read_text(encoding="utf-8"))
    assert [(r["rank"], r["host"]) for r in marker["ranks"]] == [
        (0, socket.gethostname()),
        (1, socket.gethostname()),
    ]
    assert all(r["device"].startswith("cpu") for r in marker["ranks"]), marker["ranks"]
    assert [r["rng_sha256"] for r in marker["ranks"]] == [
        sha256_file(checkpoint / "rng_state_0.pth"),
        sha256_file(checkpoint / "rng_state_1.pth"),
    ]
    (checkpoint / "rng_state_1.pth").unlink()
    resumed = launch("cut", **{controls.RESUME_FROM: str(checkpoint)})
    assert f"rank 1 resumes without its RNG state: {checkpoint} has no rng_state_1.pth" in resumed.stderr
    record = load_record(project.root / "cut")
    assert [r["rank"] for r in record["trainer"]["ranks"]] == [0, 1]
    attempt = record["attempts"][-1]
    assert (attempt["rng_restored"], attempt["rng_missing"]) == (False, ["rng_state_1.pth"])
    assert [(r["rank"], r["missing"]) for r in attempt["ranks"]] == [(0, []), (1, ["rng_state_1.pth"])]
    comparison = compare_runs(project.root / "whole", project.root / "cut")
    assert comparison.verdict.value == "DIVERGED" and comparison.where.first_divergence_step == 4
    assert "without the RNG state of rank 1: the checkpoint has no rng_state_1.pth" in comparison.causes[0]
