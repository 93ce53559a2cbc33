"""The doctor's distributed checks: NCCL's tuning variables on CUDA, and the ranks of a launch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from reprotune._config.loading import config_from_dict
from reprotune._doctor.checks import CHECKS
from reprotune._doctor.dist_checks import check_nccl, check_ranks
from reprotune._doctor.findings import FINDING_CODES, Context


def _context(
    tmp_path: Path, *, device: str = "cuda", env: dict[str, str] | None = None, **cfg: object
) -> Context:
    return Context(
        cfg=config_from_dict(dict(cfg)),
        has_config=True,
        device=device,
        device_ok=True,
        flags={},
        env=env or {},
        code_dir=tmp_path,
    )


def test_the_checks_are_installed_and_documented() -> None:
    """Both checks run with the others; their codes are known (docs/doctor.md lists every code)."""
    assert check_nccl in CHECKS and check_ranks in CHECKS
    for code in ("nccl-algo-unpinned", "nccl-env-set", "distributed-placement", "distributed-ranks-differ"):
        assert code in FINDING_CODES


def test_nccl_order_unpinned_on_cuda_is_a_warning(tmp_path: Path) -> None:
    """On CUDA without NCCL_ALGO/NCCL_PROTO: a warning naming both and the values to pin."""
    (finding,) = check_nccl(_context(tmp_path))
    assert (finding.code, finding.severity) == ("nccl-algo-unpinned", "warning")
    assert "NCCL_ALGO and NCCL_PROTO" in finding.title
    assert "NCCL_ALGO=Ring NCCL_PROTO=Simple" in finding.fix


def test_pinned_nccl_is_noted_with_its_values(tmp_path: Path) -> None:
    """Pinned (and a channel count set): no warning, one note listing every tuning value."""
    env = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_MAX_NCHANNELS": "4"}
    (finding,) = check_nccl(_context(tmp_path, env=env))
    assert (finding.code, finding.severity) == ("nccl-env-set", "info")
    assert "NCCL_ALGO=Ring, NCCL_PROTO=Simple, NCCL_MAX_NCHANNELS=4" in finding.title


def test_nccl_is_not_checked_on_cpu_or_gloo(tmp_path: Path) -> None:
    """CPU, or gloo forced on CUDA: NCCL plays no part, nothing is said."""
    assert check_nccl(_context(tmp_path, device="cpu")) == []
    assert check_nccl(_context(tmp_path, distributed={"backend": "gloo"})) == []


def test_ranks_are_not_checked_outside_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain doctor run has no ranks to compare."""
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert check_ranks(_context(tmp_path, device="cpu")) == []


@pytest.fixture
def one_rank_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A real one-process gloo group, as torchrun's environment names it."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "doctor-test")
    monkeypatch.setenv("RANK", "0")  # torchrun sets it with the others; the doctor reads it now
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_ranks_under_torchrun_agree_and_placement_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_rank_group: None
) -> None:
    """Under torchrun the ranks' packages are gathered and agree; a world size of 2 with one
    micro-batch per step is an error naming both numbers."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    codes = [f.code for f in check_ranks(_context(tmp_path, device="cpu"))]
    assert codes == ["distributed-ranks-agree"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    found = check_ranks(_context(tmp_path, device="cpu", train={"grad_accum_steps": 3}))
    assert [f.code for f in found] == ["distributed-placement", "distributed-ranks-agree"]
    assert "train.grad_accum_steps 3 is not a multiple of the world size 2" in found[0].title
