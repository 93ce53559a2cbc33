"""Tests for reprotune._determinism.flags: each mode's flags, read back from torch, not from the request."""

from __future__ import annotations

import os

import pytest
import torch

from reprotune._determinism.flags import CUBLAS_ENV, apply_determinism, determinism_flags
from reprotune._errors import InputError

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_strict_turns_everything_on() -> None:
    """strict: deterministic algorithms raise, cuDNN deterministic, benchmark and TF32 off, threads pinned."""
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    flags = apply_determinism("strict", 1, "cpu")
    assert flags["deterministic_algorithms"] is True and flags["deterministic_warn_only"] is False
    assert flags["cudnn_deterministic"] is True and flags["cudnn_benchmark"] is False
    assert flags["matmul_allow_tf32"] is False and flags["cudnn_allow_tf32"] is False
    assert flags["float32_matmul_precision"] == "highest"
    assert flags["torch_num_threads"] == 1 == torch.get_num_threads()
    assert torch.are_deterministic_algorithms_enabled()


def test_warn_only_warns() -> None:
    """warn: deterministic algorithms on with warn_only."""
    flags = apply_determinism("warn", None, "cpu")
    assert flags["deterministic_algorithms"] is True and flags["deterministic_warn_only"] is True


def test_off_restores_torch_defaults() -> None:
    """off after strict puts torch's defaults back (a run does not inherit an earlier run's flags)."""
    apply_determinism("strict", None, "cpu")
    flags = apply_determinism("off", None, "cpu")
    assert flags["deterministic_algorithms"] is False and flags["cudnn_deterministic"] is False
    assert flags["cudnn_allow_tf32"] is True and flags["matmul_allow_tf32"] is False


def test_flags_are_read_back_from_torch() -> None:
    """determinism_flags reports a flag changed behind reprotune's back."""
    apply_determinism("strict", None, "cpu")
    torch.backends.cudnn.benchmark = True
    assert determinism_flags()["cudnn_benchmark"] is True


def test_cpu_leaves_cublas_env_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU, CUBLAS_WORKSPACE_CONFIG is not set (it would be recorded as if it mattered)."""
    monkeypatch.delenv(CUBLAS_ENV, raising=False)
    flags = apply_determinism("strict", None, "cpu")
    assert CUBLAS_ENV not in os.environ and flags["cublas_workspace_config"] is None


@pytest.mark.parametrize(("mode", "threads"), [("strictest", None), ("strict", 0)], ids=["mode", "threads"])
def test_bad_arguments_are_refused(mode: str, threads: int | None) -> None:
    """An unknown mode or a thread count below 1 raises InputError."""
    with pytest.raises(InputError):
        apply_determinism(mode, threads, "cpu")  # type: ignore[arg-type]


@pytest.mark.gpu
@needs_gpu
def test_cuda_strict_sets_cublas_workspace(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA, strict sets CUBLAS_WORKSPACE_CONFIG=:4096:8 and reports it."""
    monkeypatch.delenv(CUBLAS_ENV, raising=False)
    flags = apply_determinism("strict", None, "cuda")
    assert os.environ[CUBLAS_ENV] == ":4096:8" == flags["cublas_workspace_config"]
