"""Kernel facts: what decides which kernel computes an op on this machine, read back as in force.

Two machines that run the same code on the same inputs still compute other bits when another
kernel runs: ATen picks a vectorised CPU kernel by the CPU capability in force (AVX2, AVX512,
...), MKL picks its sgemm code path by the CPU (and by ``MKL_ENABLE_INSTRUCTIONS`` and its
conditional numerical reproducibility mode, ``MKL_CBWR``), oneDNN by its ISA cap, cuBLAS and
cuDNN by the GPU's architecture and their versions, and the attention by the implementation the
model runs with. :func:`kernel_facts` writes all of these down, each read from the library
where the library can say (``torch.backends.cpu.get_cpu_capability()``, MKL's own
``mkl_serv_cbwr_get``), so a record states what was in force, not what was asked for.

The record keeps them under ``environment.kernels`` (docs/run-directory.md); ``compare`` ranks a
difference among them as a numbers cause (``_proof.causes``, in words ``_run.kernel_compare``
gives), and ``reprotune trace`` puts them in a trace's header.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from reprotune._determinism.cpu import cpu_flags, cpuinfo, is_arm, mkl_cbwr, mkl_code_path
from reprotune._determinism.flags import determinism_flags, precision_flags
from reprotune._determinism.isa import isa_in_force

#: The schema of the ``environment.kernels`` section.
KERNELS_VERSION = 1

#: CPU flags (as /proc/cpuinfo names them) that select kernels: vector widths and the dot-product,
#: reduced-precision and matrix extensions that BLAS, oneDNN and ATen dispatch on.
ISA_FLAGS_X86: tuple[str, ...] = (
    "sse4_1",
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512dq",
    "avx512cd",
    "avx512bw",
    "avx512vl",
    "avx512ifma",
    "avx512vbmi",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
)
ISA_FLAGS_ARM: tuple[str, ...] = ("asimd", "asimdhp", "asimddp", "fphp", "sve", "sve2", "bf16", "i8mm", "sme")

#: Environment variables that steer kernel choice or the order of a reduction, recorded as set
#: (None when unset): ATen's capability override, MKL's instruction cap, code-path and
#: reproducibility modes, oneDNN's ISA cap and math mode, OpenMP / Intel OpenMP threading, and
#: the CUDA libraries' math and workspace settings.
STEERING_ENV: tuple[str, ...] = (
    "ATEN_CPU_CAPABILITY",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_DEBUG_CPU_TYPE",
    "MKL_NUM_THREADS",
    "MKL_DYNAMIC",
    "MKL_THREADING_LAYER",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "ONEDNN_DEFAULT_FPMATH_MODE",
    "DNNL_DEFAULT_FPMATH_MODE",
    "ONEDNN_CPU_ISA_HINTS",
    "OMP_NUM_THREADS",
    "OMP_DYNAMIC",
    "OMP_SCHEDULE",
    "OMP_PROC_BIND",
    "KMP_AFFINITY",
    "KMP_DETERMINISTIC_REDUCTION",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_NUM_THREADS",
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "NCCL_ALGO",
    "NCCL_PROTO",
)


def _cpu_section() -> dict[str, Any]:
    import torch

    info = cpuinfo()
    flags = cpu_flags() or frozenset()
    known = ISA_FLAGS_ARM if is_arm() else ISA_FLAGS_X86
    return {
        "arch": platform.machine(),
        "vendor": info.get("vendor_id") or info.get("cpu implementer"),
        "model": info.get("model name") or info.get("cpu part") or platform.processor() or None,
        "family": info.get("cpu family"),
        "model_number": info.get("model"),
        "isa": [flag for flag in known if flag in flags],
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
    }


def _build_value(config: str, key: str) -> str | None:
    match = re.search(rf"\b{key}=([^,\s]+)", config)
    return match.group(1) if match else None


@lru_cache(maxsize=1)
def _torch_config() -> str:
    import torch

    return str(torch.__config__.show())


def _blas_section() -> dict[str, Any]:
    import torch

    config = _torch_config()
    mkl = re.search(r"Math Kernel Library Version ([^\s]+)", config)
    onednn = re.search(r"MKL-DNN (v[^\s]+)", config)
    openmp = re.search(r"OpenMP (\d+)", config)
    section: dict[str, Any] = {
        "blas": _build_value(config, "BLAS_INFO"),
        "lapack": _build_value(config, "LAPACK_INFO"),
        "mkl_version": mkl.group(1) if mkl else None,
        "onednn_version": onednn.group(1) if onednn else None,
        "mkldnn_enabled": bool(torch.backends.mkldnn.enabled) and bool(torch.backends.mkldnn.is_available()),
        "openmp": openmp.group(1) if openmp else None,
        "mkl_cbwr": None,
        "mkl_code_path": None,
    }
    if section["blas"] == "mkl" or section["mkl_version"]:
        section["mkl_cbwr"], section["mkl_code_path"] = mkl_cbwr(), mkl_code_path()
    return section


def _attention_section(implementation: str | None) -> dict[str, Any]:
    import torch

    cuda = torch.backends.cuda
    return {
        "implementation": implementation,
        "sdpa_flash": bool(cuda.flash_sdp_enabled()),
        "sdpa_mem_efficient": bool(cuda.mem_efficient_sdp_enabled()),
        "sdpa_math": bool(cuda.math_sdp_enabled()),
        "sdpa_cudnn": bool(getattr(cuda, "cudnn_sdp_enabled", lambda: False)()),
    }


def _cuda_section() -> dict[str, Any] | None:
    """GPU architecture, library versions and math modes; None without a usable CUDA device."""
    import torch

    if not torch.cuda.is_available():
        return None
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        devices.append(
            {
                "index": index,
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "sm_count": int(props.multi_processor_count),
            }
        )
    nccl: Any = None
    try:
        version = torch.cuda.nccl.version()
        nccl = ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)
    except Exception:  # no NCCL in this build
        nccl = None
    matmul = torch.backends.cuda.matmul
    # read through precision_flags: torch >= 2.9 refuses to read a legacy TF32 flag that its
    # fp32_precision settings contradict (set by transformers' tf32 argument)
    precision = precision_flags()
    return {
        "devices": devices,
        "cuda_runtime": torch.version.cuda,
        "cublas": _cublas_version(),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": nccl,
        "math": {
            "matmul_allow_tf32": bool(precision["matmul_allow_tf32"]),
            "cudnn_allow_tf32": bool(precision["cudnn_allow_tf32"]),
            "fp16_reduced_precision_reduction": bool(matmul.allow_fp16_reduced_precision_reduction),
            "bf16_reduced_precision_reduction": bool(matmul.allow_bf16_reduced_precision_reduction),
            "float32_matmul_precision": precision["float32_matmul_precision"],
        },
    }


def _cublas_version() -> int | None:
    """cuBLAS's own version number (``cublasGetVersion``), or None where it cannot be asked."""
    import torch

    try:
        handle = torch.cuda.current_blas_handle()
        for name in ("libcublas.so", "libcublas.so.13", "libcublas.so.12", "libcublas.so.11"):
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            return None
        version = ctypes.c_int()
        status = lib.cublasGetVersion_v2(ctypes.c_void_p(handle), ctypes.byref(version))
        return int(version.value) if status == 0 else None
    except Exception:
        return None


#: Flags of ``_determinism.flags.determinism_flags`` that choose among kernels (a deterministic
#: variant, or one found by timing), so a kernel fact: ``algorithms`` below.
ALGORITHM_FLAGS = (
    "deterministic_algorithms",
    "deterministic_warn_only",
    "fill_uninitialized_memory",
    "cudnn_deterministic",
    "cudnn_benchmark",
)


def kernel_facts(*, attention: str | None = None, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Everything that selects a kernel here, read back as in force.

    Args:
        attention: the attention implementation the model runs with (``eager``, ``sdpa``,
            ``flash_attention_2``, ...), when a model is loaded.
        env: the environment to read steering variables from (default ``os.environ``).

    Returns:
        A JSON-safe dict: ``version``; ``cpu`` (arch, vendor, model, ``isa`` flags present,
        ``aten_capability`` in force); ``blas`` (BLAS/LAPACK build, MKL and oneDNN versions, MKL's
        CNR mode and code path as MKL reports them); ``steering_env`` (each of
        :data:`STEERING_ENV`, None when unset); ``attention`` (implementation and SDPA backends
        enabled); ``cuda`` (None on a machine without a CUDA device; else each GPU's name,
        compute capability and SM count, cuBLAS, cuDNN and NCCL versions and the math modes);
        ``portable`` (``cpu_isa``: the ``determinism.cpu_isa`` mode in force, ``_determinism.isa``);
        ``algorithms`` (each of :data:`ALGORITHM_FLAGS` as in force: with
        ``deterministic_algorithms`` an op may run another kernel, such as the efficient
        attention's backward on a GPU; records from before it lack this section). Never raises
        for a missing library or device.
    """
    environ = os.environ if env is None else env
    flags = determinism_flags()
    return {
        "version": KERNELS_VERSION,
        "cpu": _cpu_section(),
        "blas": _blas_section(),
        "steering_env": {name: environ.get(name) for name in STEERING_ENV},
        "attention": _attention_section(attention),
        "cuda": _cuda_section(),
        "portable": {"cpu_isa": isa_in_force(environ)["cpu_isa"]},
        "algorithms": {name: flags[name] for name in ALGORITHM_FLAGS},
    }
