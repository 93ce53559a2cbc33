"""Kernel facts (reprotune._run.kernels, _determinism.cpu): what selects each kernel here, read back
from the libraries as in force, and how two machines' facts are told apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from reprotune._determinism.cpu import cbwr_name, cpu_flags, cpu_vendor, mkl_cbwr
from reprotune._determinism.flags import precision_flags, restore_precision, save_precision
from reprotune._run import kernels
from reprotune._run.fingerprint import environment_fingerprint
from reprotune._run.kernel_compare import kernel_differences
from reprotune._run.kernels import ISA_FLAGS_X86, STEERING_ENV, kernel_facts

PRECISION_KEYS = ("matmul_allow_tf32", "cudnn_allow_tf32", "float32_matmul_precision")


def test_facts_are_read_back_from_the_libraries() -> None:
    """The ATen capability is torch's own answer; the ISA flags are the CPU's; the steering
    variables are the environment given; the attention is the one named; no CUDA section on a
    machine without a GPU."""
    facts = kernel_facts(attention="sdpa", env={"MKL_CBWR": "AVX2", "OMP_NUM_THREADS": "2"})
    assert facts["cpu"]["aten_capability"] == torch.backends.cpu.get_cpu_capability()
    flags = cpu_flags() or frozenset()
    assert (
        set(facts["cpu"]["isa"]) == {f for f in ISA_FLAGS_X86 if f in flags}
        or facts["cpu"]["arch"] != "x86_64"
    )
    assert set(facts["steering_env"]) == set(STEERING_ENV)
    assert (
        facts["steering_env"]["MKL_CBWR"] == "AVX2" and facts["steering_env"]["ATEN_CPU_CAPABILITY"] is None
    )
    assert facts["attention"]["implementation"] == "sdpa"
    assert facts["cuda"] is (None if not torch.cuda.is_available() else facts["cuda"])
    assert facts["portable"] == {"cpu_isa": "native"}
    assert environment_fingerprint(attention="eager")["kernels"]["attention"]["implementation"] == "eager"


def _blas_in(env: dict[str, str]) -> dict[str, str]:
    code = "from reprotune._run.kernels import kernel_facts as k; import json; print(json.dumps(k()['blas']))"
    done = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, check=True
    )
    return dict(json.loads(done.stdout))


def test_mkl_reports_its_own_mode_not_the_variable() -> None:
    """MKL's CNR mode is asked from MKL itself: processes started with MKL_CBWR=AVX2,STRICT (on an
    Intel CPU; AUTO,STRICT elsewhere) and =COMPATIBLE read back those modes (and MKL's code path);
    one started with a value MKL does not take (lower case) reads back what MKL fell back to, not
    the variable; this process runs with CNR off."""
    if not torch.backends.mkl.is_available():
        assert mkl_cbwr() is None
        return
    assert mkl_cbwr() == "OFF"
    # MKL takes its AVX2 branch on Intel CPUs only; elsewhere it keeps its own path (AUTO), and
    # the record says that, not the variable.
    expected = "AVX2,STRICT" if cpu_vendor() in (None, "GenuineIntel") else "AUTO,STRICT"
    assert _blas_in({"MKL_CBWR": "AVX2,STRICT"})["mkl_cbwr"] == expected
    compatible = _blas_in({"MKL_CBWR": "COMPATIBLE"})
    assert compatible["mkl_cbwr"] == "COMPATIBLE" and compatible["mkl_code_path"]
    assert _blas_in({"MKL_CBWR": "avx2,strict"})["mkl_cbwr"] != "AVX2,STRICT"
    assert cbwr_name(10 | 0x10000) == "AVX2,STRICT" and cbwr_name(99) == "BRANCH_99"


def test_differences_are_named_in_words() -> None:
    """Two machines' facts: what differs, in the order that tells most, each named once."""
    a = {
        "cpu": {"aten_capability": "AVX512", "isa": ["avx2", "avx512f"]},
        "blas": {"mkl_code_path": "AVX512_E1"},
    }
    b = {"cpu": {"aten_capability": "AVX2", "isa": ["avx2"]}, "blas": {"mkl_code_path": "AVX2"}}
    assert kernel_differences(a, b) == [
        "CPU capability AVX512 vs AVX2",
        "MKL code path AVX512_E1 vs AVX2",
        "CPU instruction sets only avx512f vs a subset",
    ]
    gpu_a = {"cuda": {"devices": [{"name": "H200", "capability": "9.0", "sm_count": 132}], "cublas": 130100}}
    gpu_b = {"cuda": {"devices": [{"name": "A100", "capability": "8.0", "sm_count": 108}], "cublas": 120100}}
    assert kernel_differences(gpu_a, gpu_b) == ["GPU H200 9.0 132 vs A100 8.0 108", "cuBLAS 130100 vs 120100"]
    assert kernel_differences(a, a) == []


def test_the_cuda_section_as_far_as_a_cpu_machine_can_show_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: torch's CUDA queries are stood in for (the one place this suite does so) to show
    the section's shape and that a library that cannot be asked (cuBLAS without a handle) is None,
    never an error. On a GPU, bench/gpu_determinism.py records the real one."""
    import types

    real_gpu = torch.cuda.is_available()
    props = types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    section = kernels._cuda_section()
    assert section is not None
    assert section["devices"] == [{"index": 0, "name": "NVIDIA H200", "capability": "9.0", "sm_count": 132}]
    assert section["nccl"] == "2.21.5"
    # cuBLAS without a handle cannot be asked; a real GPU (where this test also runs) answers
    assert section["cublas"] is None if not real_gpu else isinstance(section["cublas"], int)
    assert set(section["math"]) == {
        "matmul_allow_tf32",
        "cudnn_allow_tf32",
        "fp16_reduced_precision_reduction",
        "bf16_reduced_precision_reduction",
        "float32_matmul_precision",
    }
    if hasattr(torch.backends, "fp32_precision"):  # torch >= 2.9: transformers' tf32 sets it
        saved = save_precision()
        torch.backends.fp32_precision = "tf32"  # torch may now refuse to read a legacy flag
        try:
            math = kernels._cuda_section()["math"]  # type: ignore[index]  # raised before
            assert {k: math[k] for k in PRECISION_KEYS} == {k: precision_flags()[k] for k in PRECISION_KEYS}
        finally:
            restore_precision(saved)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_cuda_section_on_a_gpu() -> None:
    """On a GPU machine the section holds the real devices and library versions."""
    section = kernels._cuda_section()
    assert section is not None and len(section["devices"]) == torch.cuda.device_count()
    major, minor = torch.cuda.get_device_capability(0)
    assert section["devices"][0]["capability"] == f"{major}.{minor}"
    assert section["devices"][0]["name"] == torch.cuda.get_device_name(0)
    assert isinstance(section["cublas"], int) and section["cudnn"] == torch.backends.cudnn.version()


def test_the_algorithm_settings_are_kernel_facts_read_back() -> None:
    """``torch.use_deterministic_algorithms`` picks other kernels (on a GPU, the efficient attention's
    backward): the facts carry what is in force, and two machines' facts that differ there name it;
    facts from before the section existed leave it unknown, not named."""
    before = kernel_facts()["algorithms"]
    assert before["deterministic_algorithms"] is torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(not before["deterministic_algorithms"])
    try:
        after = kernel_facts()
    finally:
        torch.use_deterministic_algorithms(
            before["deterministic_algorithms"], warn_only=before["deterministic_warn_only"]
        )
    assert after["algorithms"]["deterministic_algorithms"] is not before["deterministic_algorithms"]
    facts = kernel_facts()
    named = kernel_differences(facts, after)
    assert len(named) == 1 and named[0].startswith("torch's algorithm settings deterministic_algorithms=")
    older = {k: v for k, v in facts.items() if k != "algorithms"}
    assert kernel_differences(older, after) == [] and kernel_differences(after, older) == []
