"""Tests for reprotune._determinism.flags: each mode's flags, read back from torch, not from the request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from typing import Any

import pytest
import torch

from precision import FRESH_PRECISION
from reprotune._determinism import flags as flags_module
from reprotune._determinism.flags import CUBLAS_ENV, Mode, apply_determinism, determinism_flags
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


# --- float32 precision: torch's legacy flags and its fp32_precision settings (torch >= 2.9) -------

needs_new_precision_api = pytest.mark.skipif(
    not hasattr(torch.backends, "fp32_precision"), reason="torch before 2.9 has no fp32_precision"
)


def _fresh_process_precision() -> dict[str, Any]:
    """What ``determinism_flags`` reads for the float32 precision in a new interpreter."""
    code = (
        "import json; from reprotune._determinism.flags import determinism_flags as f; "
        "print(json.dumps({k: v for k, v in f().items() if 'tf32' in k or 'precision' in k}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return dict(json.loads(done.stdout))


def _precision(flags: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in flags.items() if "tf32" in k or "precision" in k}


@needs_new_precision_api
@pytest.mark.parametrize("value", ["ieee", "tf32"])
@pytest.mark.usefixtures("fresh_precision")
def test_the_new_precision_api_is_read_back_not_refused(value: str) -> None:
    """torch.backends.fp32_precision set (as transformers does for tf32=True): reading the flags
    does not raise, gives each setting as torch reads it, and names the legacy flags torch refuses
    to read, given as the new settings put them."""
    torch.backends.cudnn.allow_tf32 = True  # the legacy flags as a fresh process has them
    torch.set_float32_matmul_precision("highest")
    for _, holder, _ in FRESH_PRECISION:  # the global, and each setting (an earlier test set some)
        holder().fp32_precision = value
    flags = determinism_flags()
    assert all(flags[key] == value for key, _, _ in FRESH_PRECISION)
    assert flags["matmul_allow_tf32"] is flags["cudnn_allow_tf32"] is (value == "tf32")
    assert flags["float32_matmul_precision"] == ("high" if value == "tf32" else "highest")
    assert flags["fp32_precision_mixed"] == (
        ["matmul_allow_tf32", "float32_matmul_precision"] if value == "tf32" else ["cudnn_allow_tf32"]
    )


@needs_new_precision_api
@pytest.mark.parametrize("mode", ["strict", "warn"])
@pytest.mark.usefixtures("fresh_precision")
def test_strict_sets_ieee_everywhere_over_a_global_tf32(mode: Mode) -> None:
    """strict and warn over a global fp32_precision tf32: every setting ieee (cuDNN's convolutions and
    RNNs too, which would otherwise follow the global's TF32 while the legacy flag says off), the
    legacy flags off and readable again, and that is what is recorded."""
    torch.backends.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "tf32"  # set on its own: the global alone would not reset it
    flags = apply_determinism(mode, None, "cpu")
    assert all(getter().fp32_precision == "ieee" for _, getter, _ in FRESH_PRECISION)
    assert all(flags[key] == "ieee" for key, _, _ in FRESH_PRECISION)
    assert flags["fp32_precision_mixed"] == []
    assert flags["matmul_allow_tf32"] is flags["cudnn_allow_tf32"] is False
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    assert torch.get_float32_matmul_precision() == "highest" == flags["float32_matmul_precision"]


@needs_new_precision_api
@pytest.mark.usefixtures("fresh_precision")
def test_off_puts_a_fresh_process_s_precision_back() -> None:
    """off after a global fp32_precision tf32 and strict reads back what a new interpreter reads."""
    torch.backends.fp32_precision = "tf32"
    apply_determinism("strict", None, "cpu")
    torch.backends.fp32_precision = "tf32"
    assert _precision(apply_determinism("off", None, "cpu")) == _fresh_process_precision()


def test_a_process_that_set_the_new_api_still_fingerprints() -> None:
    """The reported crash, in a new interpreter: torch.backends.fp32_precision set, then the
    environment fingerprint and the determinism flags read it back (no mix-of-APIs error)."""
    if not hasattr(torch.backends, "fp32_precision"):
        pytest.skip("torch before 2.9 has no fp32_precision")
    code = (
        "import torch; torch.backends.fp32_precision = 'ieee'\n"
        "from reprotune._run.fingerprint import environment_fingerprint\n"
        "from reprotune._determinism.flags import determinism_flags\n"
        "assert environment_fingerprint()['determinism']['fp32_precision'] == 'ieee'\n"
        "print(determinism_flags()['fp32_precision_cudnn_conv'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ieee", done.stderr


@pytest.mark.usefixtures("fresh_precision")
def test_a_torch_without_the_new_api_keeps_the_legacy_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where torch has no fp32_precision (before 2.9), the legacy flags alone are set and read."""
    monkeypatch.setattr(flags_module, "_precision_holder", lambda path: None)
    flags = apply_determinism("strict", None, "cpu")
    assert _precision(flags) == {
        "cudnn_allow_tf32": False,
        "matmul_allow_tf32": False,
        "float32_matmul_precision": "highest",
    }
    assert _precision(apply_determinism("off", None, "cpu"))["cudnn_allow_tf32"] is True


# --- what apply_determinism refuses, it refuses before changing anything ----------------------------


def _in_force() -> dict[str, Any]:
    return {**determinism_flags(), "env": os.environ.get(CUBLAS_ENV)}


def test_a_refused_cpu_isa_leaves_the_process_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """A determinism.cpu_isa not in force is refused before torch's flags or threads change."""

    def refuse(mode: str) -> dict[str, Any]:
        raise InputError(f"determinism.cpu_isa {mode!r} is not in force", source="determinism.cpu_isa")

    monkeypatch.setattr(flags_module, "require_isa", refuse)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = True
    before = _in_force()
    with pytest.raises(InputError, match="cpu_isa"):
        apply_determinism("strict", 2 if torch.get_num_threads() == 1 else 1, "cpu", cpu_isa="avx2")
    assert _in_force() == before


@pytest.fixture
def used_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that has used CUDA (initialised, memory handed out), on a device named cuda."""
    monkeypatch.setattr(flags_module, "resolve_device", lambda name: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {"allocation.all.allocated": 3})
    monkeypatch.delenv(CUBLAS_ENV, raising=False)


@pytest.mark.usefixtures("used_cuda")
def test_strict_refuses_a_cublas_workspace_set_after_cuda_was_used() -> None:
    """strict, CUBLAS_WORKSPACE_CONFIG unset in a process that used CUDA: refused, naming the fix,
    and nothing changed (setting it now may not reach cuBLAS)."""
    before = _in_force()
    with pytest.raises(InputError, match=CUBLAS_ENV) as info:
        apply_determinism("strict", None, "cuda")
    assert "before" in (info.value.fix or "") and _in_force() == before


@pytest.mark.usefixtures("used_cuda")
def test_warn_warns_of_a_cublas_workspace_set_after_cuda_was_used() -> None:
    """warn: the same case warns, and sets the variable (it takes effect for handles made later)."""
    with pytest.warns(UserWarning, match=f"{CUBLAS_ENV}.*before the process first uses CUDA"):
        flags = apply_determinism("warn", None, "cuda")
    assert os.environ[CUBLAS_ENV] == ":4096:8" == flags["cublas_workspace_config"]


@pytest.mark.usefixtures("used_cuda")
@pytest.mark.parametrize(
    ("preset", "allocated"), [(":16:8", 3), (None, 0)], ids=["already-in-force", "cuda-started-unused"]
)
def test_strict_sets_the_cublas_workspace_where_it_can_take_effect(
    monkeypatch: pytest.MonkeyPatch, preset: str | None, allocated: int
) -> None:
    """No refusal where the variable is in force already, nor where CUDA was only started (a
    torchrun rank's set_device and NCCL group, no tensor yet: no cuBLAS handle can exist)."""
    if preset is not None:
        monkeypatch.setenv(CUBLAS_ENV, preset)
    monkeypatch.setattr(
        torch.cuda, "memory_stats", lambda device=None: {"allocation.all.allocated": allocated}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flags = apply_determinism("strict", None, "cuda")
    assert flags["cublas_workspace_config"] == (preset or ":4096:8")
