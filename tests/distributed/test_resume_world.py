"""Resumes of a ``torchrun`` run (CPU, gloo, 2 processes, the tiny model) that touch its world size
or its ranks' environments: the world size a resume is checked against is the one its checkpoint
was saved at, not the one an earlier resume tried; a world size that cannot place the step's
micro-batches is refused before anything is written, naming those that can; a rank whose
environment moved since the start is said and noted as rank 0's is; and a run whose world size
changed is not rerun bit for bit.

The config: 8 optimizer steps of 4 global micro-batches of 2 rows, a checkpoint every 4 steps
(tests/torchruns.py). The launches are module fixtures and tests run one after another: 10 in all.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from reprotune._jsonio import write_json_atomic
from reprotune._proof.compare import compare_runs
from reprotune._proof.differences import Verdict
from reprotune._run.checkpoint_files import STATE_FILE, _state_sha256
from reprotune._run.ledger import read_ledger
from reprotune._run.record import load_record
from tinyrun import TinyProject
from torchruns import QUIET, TRAIN, completed, launch
from warm import run_module

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> TinyProject:
    tiny = TinyProject.create(tmp_path_factory.mktemp("resume-world"))
    tiny.config(
        "ddp.yaml",
        train=TRAIN,
        determinism={"mode": "strict", "threads": 1, "device": "cpu"},
        distributed={"strategy": "ddp", "timeout_s": 120},
    )
    return tiny


@pytest.fixture(scope="module")
def whole(project: TinyProject) -> Path:
    """The uninterrupted run at world size 2."""
    return completed(launch(project, 2, "run", "ddp.yaml", "--run-dir", "runs/whole", *QUIET)).run_dir


@pytest.fixture(scope="module")
def stopped(project: TinyProject) -> Path:
    """The same run at world size 2, stopped after its step-4 checkpoint; each test resumes a copy."""
    args = ("ddp.yaml", "--run-dir", "runs/stopped", "--stop-after-step", "4", *QUIET)
    return completed(launch(project, 2, "run", *args)).run_dir


def _copy(stopped: Path, name: str) -> Path:
    return Path(shutil.copytree(stopped, stopped.parent / name))


def _unchanged(run_dir: Path) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in ("record.json", "ledger.jsonl")}


def test_a_resume_goes_on_at_the_world_size_of_its_checkpoint_after_an_attempt_at_another(
    project: TinyProject, stopped: Path, whole: Path
) -> None:
    """Resumed at world size 1 (allowed) and killed after step 5, before any checkpoint of its own;
    then resumed as the run started, at 2, without the option: it goes on from the step-4
    checkpoint, saved at 2, to the uninterrupted run's bytes, and the record keeps no world-size
    change (before: refused, "trains at world size 1 ... launch 1 processes"; with the option, the
    record kept a 2 -> 1 and a 1 -> 2 change that no step of the ledger trained under)."""
    run_dir = _copy(stopped, "back")
    killed = launch(
        project,
        1,
        "resume",
        str(run_dir),
        "--allow-world-size-change",
        *QUIET,
        env={"REPROTUNE_KILL_AT": "rank0/step-end:1"},
    )
    assert killed.returncode != 0
    assert read_ledger(run_dir / "ledger.jsonl").train[-1].step == 5
    assert [c["to"] for c in load_record(run_dir)["distributed"]["world_size_changes"]] == [1]

    resumed = completed(launch(project, 2, "resume", str(run_dir), *QUIET))
    assert f"resuming {run_dir} from step 4 (step-00000004)" in resumed.output
    assert (run_dir / "ledger.jsonl").read_bytes() == (whole / "ledger.jsonl").read_bytes()
    adapter = run_dir / "adapter" / "adapter_model.safetensors"
    assert adapter.read_bytes() == (whole / "adapter" / "adapter_model.safetensors").read_bytes()
    assert compare_runs(whole, run_dir).verdict is Verdict.IDENTICAL
    record = load_record(run_dir)
    assert "world_size_changes" not in record["distributed"]
    assert "world_size_change" not in record["attempts"][-1]
    # the attempt that trained step 5 at world size 1 still says so
    assert record["attempts"][-2]["world_size_change"]["to"] == 1


def test_an_older_checkpoint_restored_in_place_of_the_newest_is_checked_for_its_world_size(
    project: TinyProject, stopped: Path
) -> None:
    """Beside the step-4 checkpoint (world size 2), a step-8 one that says world size 1 and verifies,
    but which the ledger (4 steps) does not reach. A resume at 1 is checked against step 8 and
    passes; the restore refuses step 8 and takes step 4: refused then, on every rank, since the
    world size would change unallowed. With the option it goes on, and records 2 -> 1 at step 4."""
    run_dir = _copy(stopped, "older")
    newest = run_dir / "checkpoints" / "step-00000008"
    shutil.copytree(run_dir / "checkpoints" / "step-00000004", newest)
    state = json.loads((newest / STATE_FILE).read_text(encoding="utf-8"))
    state["step"], state["distributed"]["world_size"] = 8, 1
    state["state_sha256"] = _state_sha256(state)
    write_json_atomic(newest / STATE_FILE, state)

    ledger = (run_dir / "ledger.jsonl").read_bytes()
    refused = launch(project, 1, "resume", str(run_dir), *QUIET)
    assert refused.returncode != 0
    assert load_record(run_dir)["status"] == "failed"  # the attempt had begun
    assert (run_dir / "ledger.jsonl").read_bytes() == ledger
    assert (
        f"the run in {run_dir} resumes at world size 1, but the checkpoint it restores, step-00000004, "
        "was saved at world size 2 (the newer checkpoint the world size was checked against could not "
        "be restored)"
    ) in refused.output
    completed(launch(project, 1, "resume", str(run_dir), "--allow-world-size-change", *QUIET))
    changes = load_record(run_dir)["distributed"]["world_size_changes"]
    assert [{k: c[k] for k in ("from", "to", "at_step")} for c in changes] == [
        {"from": 2, "to": 1, "at_step": 4}
    ]


def test_a_resume_at_a_world_size_that_cannot_place_the_micro_batches_names_those_that_can(
    project: TinyProject, stopped: Path
) -> None:
    """At world size 3 with --allow-world-size-change (4 micro-batches a step): refused before
    anything is written, naming the world sizes that divide 4 (before: "--set
    train.grad_accum_steps=3", an option resume does not have, and the record said failed)."""
    run_dir = _copy(stopped, "w3")
    before = _unchanged(run_dir)
    refused = launch(project, 3, "resume", str(run_dir), "--allow-world-size-change", *QUIET)
    assert refused.returncode != 0
    assert (
        "reprotune resume: error: "
        f"{run_dir}/record.json (key config.train.grad_accum_steps): train.grad_accum_steps 4 is not a "
        "multiple of the world size 3: each rank must train the same number of the step's micro-batches\n"
        "fix: resume at a world size that divides 4: 1, 2 or 4 (a resume keeps the run's config)"
    ) in refused.output
    assert "--set" not in refused.output
    assert _unchanged(run_dir) == before


def test_a_resume_where_a_ranks_environment_moved_says_so_and_notes_it(
    project: TinyProject, stopped: Path
) -> None:
    """Rank 1 resumed with ATen's kernels for no vector instructions (ATEN_CPU_CAPABILITY=default),
    rank 0 as at the start: the resume warns and notes rank 1's change on the attempt, as it does
    rank 0's own (before: nothing said, distributed_drift empty, and the run then differed from the
    uninterrupted one from step 5)."""
    run_dir = _copy(stopped, "moved")
    wrapper = project.root / "rank1-default-kernels.sh"
    wrapper.write_text(
        '#!/bin/sh\nif [ "$RANK" = 1 ]; then export ATEN_CPU_CAPABILITY=default; fi\n'
        f'exec {sys.executable} -m reprotune "$@"\n'
    )
    wrapper.chmod(0o755)
    args = ["--standalone", "--nproc_per_node", "2", "--no-python", str(wrapper), "resume", str(run_dir)]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "OMP_NUM_THREADS": "1"}
    done = run_module("torch.distributed.run", [*args, *QUIET], cwd=project.root, env=env, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]

    native = torch.backends.cpu.get_cpu_capability()
    moved = [
        f"distributed.ranks[1].environment.kernels.cpu.aten_capability: recorded {native!r}, now 'DEFAULT'",
        "distributed.ranks[1].environment.kernels.steering_env.ATEN_CPU_CAPABILITY: "
        "recorded None, now 'default'",
    ]
    attempt = load_record(run_dir)["attempts"][-1]
    # What moved on both ranks alike (rank 0's environment_drift: none, unless this session's
    # environment gained a variable since the run started, such as torch's TORCHINDUCTOR_CACHE_DIR)
    # is rank 1's too; the kernels moved on rank 1 alone.
    both = [
        line.replace("environment.", "distributed.ranks[1].environment.", 1)
        for line in attempt["environment_drift"]
    ]
    assert attempt["distributed_drift"] == sorted(both + moved)
    assert not any("aten_capability" in line for line in attempt["environment_drift"])
    for line in moved:
        assert f"warning: differs from the run's start: {line}" in done.stdout + done.stderr


def test_a_run_whose_world_size_changed_is_not_rerun_bit_for_bit(project: TinyProject, stopped: Path) -> None:
    """Stopped at world size 2, finished at 1 (allowed): a rerun at 2, as the run started, is
    refused before it trains, naming the change and a comparison within a tolerance (before: it
    trained the whole run to print DIVERGED)."""
    run_dir = _copy(stopped, "changed")
    completed(launch(project, 1, "resume", str(run_dir), "--allow-world-size-change", *QUIET))
    rerun_dir = project.root / "runs" / "changed-rerun"
    refused = launch(project, 2, "rerun", str(run_dir), "--run-dir", str(rerun_dir), "--no-progress")
    assert refused.returncode != 0
    assert "the run changed its world size when it resumed (2 -> 1 at step 4)" in refused.output
    assert (
        f"fix: compare within a tolerance instead: `torchrun --standalone --nproc_per_node 2 -m reprotune "
        f"rerun {run_dir} --tolerance 1e-6`"
    ) in refused.output
    assert not rerun_dir.exists()
