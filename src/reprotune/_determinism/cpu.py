"""What the CPU and its math library do here: the CPU's flags, and MKL's own account of the code
path and reproducibility mode it runs with.

MKL is linked statically into torch's CPU library; it still exports its service functions, so
``mkl_serv_cbwr_get`` (the conditional numerical reproducibility mode in force, ``MKL_CBWR``) and
``mkl_serv_cbwr_get_auto_branch`` (the code path MKL chose for this CPU under the instruction cap
in force, ``MKL_ENABLE_INSTRUCTIONS``) can be asked directly. Where they cannot (another BLAS,
another platform), the answers are None. Nothing here imports torch at module level.
"""

from __future__ import annotations

import ctypes
import platform
from functools import lru_cache
from pathlib import Path

# MKL's conditional numerical reproducibility branches (mkl_cbwr.h): the integer that
# mkl_serv_cbwr_get returns -> the name MKL_CBWR takes.
_CBWR_BRANCHES: dict[int, str] = {
    1: "OFF",
    2: "AUTO",
    3: "COMPATIBLE",
    4: "SSE2",
    6: "SSSE3",
    7: "SSE4_1",
    8: "SSE4_2",
    9: "AVX",
    10: "AVX2",
    11: "AVX512_MIC",
    12: "AVX512",
    13: "AVX512_MIC_E1",
    14: "AVX512_E1",
}
_CBWR_STRICT = 0x10000
_CBWR_ALL = -1


def cbwr_name(value: int) -> str:
    """MKL's CNR setting as ``MKL_CBWR`` spells it (``AVX2,STRICT``), from its integer.

    Example:
        >>> cbwr_name(10 | 0x10000), cbwr_name(1)
        ('AVX2,STRICT', 'OFF')
    """
    branch = _CBWR_BRANCHES.get(value & 0xFFFF, f"BRANCH_{value & 0xFFFF}")
    return f"{branch},STRICT" if value & _CBWR_STRICT else branch


@lru_cache(maxsize=1)
def cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo, keys lower-case (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    return fields


def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags (x86 ``flags``, Arm ``Features``), or None where none are readable."""
    info = cpuinfo()
    text = info.get("flags") or info.get("features")
    return frozenset(text.split()) if text else None


def cpu_vendor() -> str | None:
    """The CPU's vendor as /proc/cpuinfo names it (``GenuineIntel``, ``AuthenticAMD``), or None."""
    return cpuinfo().get("vendor_id") or None


def is_arm() -> bool:
    return platform.machine().lower() in ("aarch64", "arm64")


@lru_cache(maxsize=1)
def _mkl() -> ctypes.CDLL | None:
    """torch's CPU library, when it exports MKL's service functions; else None."""
    import torch

    lib_dir = Path(torch.__file__).parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib"):
        path = lib_dir / name
        if not path.exists():
            continue
        try:
            lib = ctypes.CDLL(str(path))
            get, auto = lib.mkl_serv_cbwr_get, lib.mkl_serv_cbwr_get_auto_branch
        except (OSError, AttributeError):
            return None
        get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
        auto.restype, auto.argtypes = ctypes.c_int, []
        return lib
    return None


def mkl_cbwr() -> str | None:
    """MKL's conditional numerical reproducibility mode in force (``OFF``, ``AVX2,STRICT``, ...)."""
    lib = _mkl()
    return None if lib is None else cbwr_name(int(lib.mkl_serv_cbwr_get(_CBWR_ALL)))


def mkl_code_path() -> str | None:
    """The code path MKL dispatches to on this CPU under the instruction cap in force."""
    lib = _mkl()
    return None if lib is None else cbwr_name(int(lib.mkl_serv_cbwr_get_auto_branch()))
