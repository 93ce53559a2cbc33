"""``reprotune verify --command "torchrun ... train.py"``: a user's Trainer script at world size 2
(CPU, gloo). The callback applies verify's stop after step K and its data-seed control on every
rank (on rank 0 alone, the stop left rank 1 waiting forever and the control trained the ranks on
different data orders), so the verification ends, with a resume leg at a step that is not a save
step; and a leg that cannot finish is stopped within a bound, saying why."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from trainer_scripts import OFFLINE_ENV, ScriptProject

from reprotune._proof import verify_command

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _torchrun(project: ScriptProject, *extra: str) -> str:
    argv = project.argv("hf_trainer.py", *extra)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return shlex.join([*launch, *argv[1:]])


def test_verify_command_under_torchrun_passes_with_a_resume_leg(tmp_path: Path) -> None:
    """World size 2, --resume-at 3 (no Trainer checkpoint there but the one the stop makes): the
    rerun IDENTICAL, the control DIVERGED, the stop-and-resume leg ends (it once hung) and is
    judged; PASS."""
    project = ScriptProject.create(tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reprotune",
            "verify",
            "--out",
            "ver",
            "--command",
            _torchrun(project),
            "--resume-at",
            "3",
        ],
        cwd=project.root,
        env={**os.environ, **OFFLINE_ENV, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    report = json.loads((project.root / "ver" / "verification.json").read_text(encoding="utf-8"))
    legs = {leg["name"]: leg for leg in report["legs"]}
    assert legs["rerun"]["verdict"] == "IDENTICAL"
    assert legs["control-data-seed"]["verdict"] == "DIVERGED"
    assert legs["resume"]["verdict"] == "IDENTICAL" and legs["resume"]["evidence"]["resumed_at"] == 3
    checkpoint = project.root / "ver" / "resume" / "trainer-output" / "checkpoint-3"
    assert sorted(p.name for p in checkpoint.glob("rng_state*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]


def test_a_leg_that_cannot_finish_is_stopped_within_the_bound(tmp_path: Path) -> None:
    """A leg past its bound (here 1 s, for the test) is stopped with SIGTERM and fails saying it
    did not finish and why that happens under torchrun; no process of it is left."""
    script = tmp_path / "sleepy.py"
    script.write_text("import time\ntime.sleep(600)\n")
    runner = verify_command._Runner([sys.executable, str(script)], tmp_path / "log", tmp_path, print, 1.0)
    from reprotune._errors import RunFailedError
    from reprotune.integrations.controls import Controls

    with pytest.raises(RunFailedError) as caught:
        runner.leg("rerun", Controls(run_dir=tmp_path / "rerun"))
    assert "the rerun leg did not finish within 1 s" in caught.value.message
    assert "a rank waiting for another that stopped" in caught.value.message
    left = [p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]
    assert left == []
