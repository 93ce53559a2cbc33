"""``integrations._ranks``: what a rank will restore from a Trainer checkpoint, read as the
Trainer's loaders read it, and a gather that never leaves a rank waiting when another fails."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from trainer_scripts import OFFLINE_ENV, ScriptProject

from reprotune._errors import InputError
from reprotune.integrations import _ranks as ranks


def _args(**changes: Any) -> SimpleNamespace:
    values = {"process_index": 0, "local_process_index": 0, "world_size": 1, "device": "cpu"}
    return SimpleNamespace(**{**values, **changes})


def _checkpoint(root: Path, *names: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name.endswith("/"):
            (root / name).mkdir()
        else:
            (root / name).write_bytes(name.encode())
    return root


def test_a_whole_checkpoint_misses_nothing(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path / "c", "rng_state.pth", "optimizer.pt", "scheduler.pt")
    plan = ranks.restore_plan(str(checkpoint), _args(), mid_epoch=True, scaling=False)
    assert plan is not None and plan["missing"] == [] and plan["host"] == socket.gethostname()
    assert ranks.restore_plan(None, _args(), mid_epoch=True, scaling=False) is None


@pytest.mark.parametrize(
    ("files", "args", "scaling", "missing"),
    [
        (("optimizer.pt", "scheduler.pt"), {}, False, ["rng_state.pth"]),
        (
            ("rng_state_1.pth", "optimizer.pt", "scheduler.pt"),
            {"process_index": 1, "world_size": 2},
            False,
            [],
        ),
        (("rng_state.pth", "scheduler.pt"), {}, False, ["optimizer.pt"]),
        (("rng_state.pth", "optimizer_0/", "scheduler.pt"), {}, False, []),  # sharded FSDP's folder
        (("rng_state.pth",), {"deepspeed": "ds.json"}, False, []),  # DeepSpeed restores its own
        (("rng_state.pth", "optimizer.pt", "scheduler.pt"), {}, True, ["scaler.pt"]),
        (
            ("rng_state.pth", "optimizer.pt", "scheduler.pt"),
            {"ignore_data_skip": True},
            False,
            [ranks.DATA_POSITION],
        ),
    ],
    ids=[
        "no-rng",
        "rank-1-file",
        "no-optimizer",
        "fsdp-folder",
        "deepspeed",
        "fp16-no-scaler",
        "data-skip-off",
    ],
)
def test_each_missing_piece_is_named(
    tmp_path: Path, files: tuple[str, ...], args: dict[str, Any], scaling: bool, missing: list[str]
) -> None:
    checkpoint = _checkpoint(tmp_path / "c", *files)
    plan = ranks.restore_plan(str(checkpoint), _args(**args), mid_epoch=True, scaling=scaling)
    assert plan is not None and plan["missing"] == missing


def test_an_rng_file_other_than_the_one_saved_is_found_by_its_hash(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path / "c", "rng_state.pth", "optimizer.pt", "scheduler.pt")
    saved = ranks.saved_state(checkpoint, _args())
    (checkpoint / ranks.CHECKPOINT_MARKER).write_text(json.dumps({"ranks": [saved]}))
    plan = ranks.restore_plan(str(checkpoint), _args(), mid_epoch=True, scaling=False)
    assert plan is not None and ranks.rng_changed([plan], str(checkpoint)) == []
    (checkpoint / "rng_state.pth").write_bytes(b"another run's draws")
    plan = ranks.restore_plan(str(checkpoint), _args(), mid_epoch=True, scaling=False)
    assert plan is not None and ranks.rng_changed([plan], str(checkpoint)) == ["rng_state.pth"]
    assert (
        "the run resumes with another RNG state than it saved"
        in ranks.resume_problems([plan], str(checkpoint), ["rng_state.pth"])[0]
    )


def _gather_on_rank(rank: int, store: str, results: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:

        def build() -> int:
            if rank == 1:
                raise OSError(5, "Input/output error")
            return rank

        try:
            ranks.gather(build)
            outcome = "returned"
        except RuntimeError as exc:
            outcome = str(exc)
        Path(results, f"{rank}.txt").write_text(outcome)
    finally:
        dist.destroy_process_group()


def test_a_rank_that_fails_to_build_its_fact_fails_every_rank_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 cannot read its facts: both ranks leave the gather with the same error naming it."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_gather_on_rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        text = (tmp_path / f"{rank}.txt").read_text()
        assert (
            text
            == "reprotune could not read every rank's facts: rank 1: OSError: [Errno 5] Input/output error"
        )


def _begin_on_rank(rank: int, store: str, results: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    began = []
    try:

        def begin(run_dir: str) -> None:
            began.append(rank)
            raise InputError("the run directory holds files", source=run_dir, fix="choose a new one")

        try:
            ranks.on_rank_zero(rank == 0, begin, "runs/a")
            outcome = "returned"
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        Path(results, f"{rank}.txt").write_text(f"{began} {outcome}")
    finally:
        dist.destroy_process_group()


def test_a_refusal_on_rank_zero_stops_every_rank_instead_of_leaving_them_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 alone begins, and refuses: it raises its own error, rank 1 an error naming it (rank
    1 went on to train before, and waited at its first collective for a rank that had died)."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_begin_on_rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    refusal = "InputError: runs/a: the run directory holds files\nfix: choose a new one"
    assert (tmp_path / "0.txt").read_text() == f"[0] {refusal}"
    assert (tmp_path / "1.txt").read_text() == (
        f"[] RuntimeError: reprotune stopped the run at train begin on rank 0: {refusal}"
    )


def test_one_process_begins_only_on_rank_zero() -> None:
    began: list[str] = []
    ranks.on_rank_zero(True, began.append, "zero")
    ranks.on_rank_zero(False, began.append, "another process without a process group")
    assert began == ["zero"]


@pytest.mark.distributed
@pytest.mark.slow
def test_a_trainer_script_whose_rank_zero_refuses_ends_on_every_rank(tmp_path: Path) -> None:
    """The example Trainer script at world size 2, each rank started on its own as ``srun`` starts
    them (no torchrun to end the others), into a run directory that holds a stranger's file: rank
    0 refuses it, and rank 1 ends too, naming that refusal (before, rank 1 went on to train and
    failed at its first collective with the process group's own error, or under NCCL waited for
    its timeout)."""
    project = ScriptProject.create(tmp_path)
    (project.root / "run").mkdir()
    (project.root / "run" / "notes.txt").write_text("mine")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    argv = project.argv("hf_trainer.py", "--run-dir", "run", "--output-dir", "out")
    world = {
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "GLOO_SOCKET_IFNAME": "lo",
    }
    started = [
        subprocess.Popen(
            argv,
            cwd=project.root,
            env={**os.environ, **OFFLINE_ENV, **world, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        ended = [process.communicate(timeout=600) for process in started]
    finally:
        for process in started:
            process.kill()
    assert [process.returncode for process in started] != [0, 0]
    refusal = "exists and is not empty"
    assert "InputError" in ended[0][1] and refusal in ended[0][1], ended[0][1][-3000:]
    rank_1 = ended[1][1]
    assert "reprotune stopped the run at train begin on rank 0: InputError" in rank_1, rank_1[-3000:]
    assert refusal in rank_1 and started[1].returncode != 0
    assert sorted(p.name for p in (project.root / "run").iterdir()) == ["notes.txt"]
