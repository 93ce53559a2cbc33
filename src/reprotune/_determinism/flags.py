"""Determinism modes: set torch's flags for a mode, and read back the flags actually in force.

``strict`` makes torch raise on an operation without a deterministic implementation, ``warn``
makes it warn, ``off`` puts torch's own defaults back (so a run's behaviour is a function of its
config, not of whatever ran earlier in the process). In every mode the record keeps
:func:`determinism_flags`, read back from torch and the environment, never the request.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from reprotune._determinism.device import resolve_device
from reprotune._determinism.isa import require_isa
from reprotune._errors import InputError

Mode = Literal["strict", "warn", "off"]

#: cuBLAS needs a fixed workspace for reproducible results (CUDA >= 10.2); these two are documented.
CUBLAS_DETERMINISTIC_VALUES = (":4096:8", ":16:8")
CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"
_CUBLAS_DEFAULT = ":4096:8"


def apply_determinism(
    mode: Mode, threads: int | None, device: str, *, cpu_isa: str = "native"
) -> dict[str, Any]:
    """Set torch's determinism flags for ``mode`` and pin the thread count; refuse a
    ``determinism.cpu_isa`` that is not in force (``_determinism.isa.require_isa``).

    - strict / warn: deterministic algorithms on (``warn_only`` for warn), cuDNN deterministic,
      cuDNN benchmark off, TF32 off for matmul and cuDNN, float32 matmul precision "highest",
      and ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` on CUDA unless already set to a deterministic value.
    - off: torch's defaults for all of the above (nothing is enforced).

    Args:
        mode: ``strict``, ``warn`` or ``off``.
        threads: torch intra-op threads; None leaves the count as it is.
        device: ``cpu``, ``cuda`` or ``auto``.
        cpu_isa: the portable CPU mode the config asks for (``native`` asks nothing).

    Returns:
        :func:`determinism_flags`: what is now in force, read back.

    Raises:
        InputError: an unknown mode, a thread count below 1, ``cuda`` without a GPU, or a
            ``cpu_isa`` baseline not in force in this process.
    """
    import torch

    if mode not in ("strict", "warn", "off"):
        raise InputError(
            f"unknown determinism mode {mode!r}", source="determinism.mode", fix="use strict, warn or off"
        )
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise InputError(
            f"thread count must be an integer >= 1 (got {threads!r})",
            source="determinism.threads",
            fix="use e.g. 2, or null to leave it unpinned",
        )
    concrete = resolve_device(device).type
    enforce = mode != "off"
    torch.use_deterministic_algorithms(enforce, warn_only=mode == "warn")
    torch.backends.cudnn.deterministic = enforce
    torch.backends.cudnn.benchmark = False  # off is also torch's default
    # torch's defaults: TF32 off for matmul, on for cuDNN convolutions.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = not enforce
    torch.set_float32_matmul_precision("highest")
    if enforce and concrete == "cuda" and os.environ.get(CUBLAS_ENV) not in CUBLAS_DETERMINISTIC_VALUES:
        # Read by cuBLAS when its handle is created: effective if set before the first CUDA matmul.
        os.environ[CUBLAS_ENV] = _CUBLAS_DEFAULT
    if threads is not None:
        torch.set_num_threads(threads)
    require_isa(cpu_isa)
    return determinism_flags()


def determinism_flags() -> dict[str, Any]:
    """Every determinism-relevant flag actually in force, read back from torch and the environment.

    Reading never initialises CUDA.

    Returns:
        A JSON-safe dict: ``deterministic_algorithms``, ``deterministic_warn_only``,
        ``fill_uninitialized_memory``, ``cudnn_available``, ``cudnn_deterministic``,
        ``cudnn_benchmark``, ``cudnn_allow_tf32``, ``matmul_allow_tf32``,
        ``float32_matmul_precision``, ``cublas_workspace_config``, ``cuda_available``,
        ``torch_num_threads``, ``torch_num_interop_threads``.
    """
    import torch
    import torch.utils.deterministic

    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        # An attribute set by a module-level hook, which type checkers do not see.
        "fill_uninitialized_memory": bool(
            getattr(torch.utils.deterministic, "fill_uninitialized_memory", False)
        ),
        "cudnn_available": bool(torch.backends.cudnn.is_available()),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cublas_workspace_config": os.environ.get(CUBLAS_ENV),
        "cuda_available": torch.cuda.is_available(),
        "torch_num_threads": torch.get_num_threads(),
        "torch_num_interop_threads": torch.get_num_interop_threads(),
    }
