"""``integrations._ranks``: what a rank will restore from a Trainer checkpoint, read as the
Trainer's loaders read it, and a gather that never leaves a rank waiting when another fails."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

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
