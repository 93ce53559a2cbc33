"""Determinism modes: set torch's flags for a mode, and read back the flags actually in force.

``strict`` makes torch raise on an operation without a deterministic implementation, ``warn``
makes it warn, ``off`` puts torch's own defaults back (so a run's behaviour is a function of its
config, not of whatever ran earlier in the process). In every mode the record keeps
:func:`determinism_flags`, read back from torch and the environment, never the request.

Float32 precision (TF32) has two APIs in torch 2.9 and later: the legacy flags
(``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``,
``torch.set_float32_matmul_precision``) and the ``fp32_precision`` settings (a global one,
``torch.backends.fp32_precision``, and one per backend and operation, :data:`PRECISION_SETTINGS`).
Once the second is set (by a user, or by transformers for ``TrainingArguments.tf32``), torch
refuses to read a legacy flag it contradicts. So a mode sets both, the legacy flags first (each
legacy setter also sets some of the new settings), then every new setting; and reading falls back
on the new settings for a legacy flag torch refuses to read, naming it (``fp32_precision_mixed``).
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Literal

from reprotune._determinism.device import resolve_device
from reprotune._determinism.isa import require_isa
from reprotune._errors import InputError

Mode = Literal["strict", "warn", "off"]

#: cuBLAS needs a fixed workspace for reproducible results (CUDA >= 10.2); these two are documented.
CUBLAS_DETERMINISTIC_VALUES = (":4096:8", ":16:8")
CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"
_CUBLAS_DEFAULT = ":4096:8"

#: torch's ``fp32_precision`` settings (torch >= 2.9): the record's key for each, and the path to
#: the object under ``torch.backends`` that holds it. The global comes first: setting it resets
#: every setting below that was not set on its own.
PRECISION_SETTINGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("fp32_precision", ()),
    ("fp32_precision_cuda_matmul", ("cuda", "matmul")),
    ("fp32_precision_cudnn", ("cudnn",)),
    ("fp32_precision_cudnn_conv", ("cudnn", "conv")),
    ("fp32_precision_cudnn_rnn", ("cudnn", "rnn")),
    ("fp32_precision_mkldnn", ("mkldnn",)),
    ("fp32_precision_mkldnn_matmul", ("mkldnn", "matmul")),
    ("fp32_precision_mkldnn_conv", ("mkldnn", "conv")),
    ("fp32_precision_mkldnn_rnn", ("mkldnn", "rnn")),
)
#: What a fresh process reads for each (torch's defaults: "none" follows the level above; cuDNN's
#: convolutions and RNNs take TF32, as the legacy ``cudnn.allow_tf32`` does by default).
_PRECISION_DEFAULTS = {key: "none" for key, _ in PRECISION_SETTINGS} | {
    "fp32_precision_cudnn_conv": "tf32",
    "fp32_precision_cudnn_rnn": "tf32",
}


def apply_determinism(
    mode: Mode, threads: int | None, device: str, *, cpu_isa: str = "native"
) -> dict[str, Any]:
    """Set torch's determinism flags for ``mode`` and pin the thread count, after refusing what
    cannot be put in force, so that a refused call leaves the process as it was.

    - strict / warn: deterministic algorithms on (``warn_only`` for warn), cuDNN deterministic,
      cuDNN benchmark off, TF32 off for matmul and cuDNN, float32 matmul precision "highest" (and
      on torch >= 2.9 every ``fp32_precision`` setting ``ieee``), and
      ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` on CUDA unless already set to a deterministic value.
    - off: torch's defaults for all of the above (nothing is enforced).

    Args:
        mode: ``strict``, ``warn`` or ``off``.
        threads: torch intra-op threads; None leaves the count as it is.
        device: ``cpu``, ``cuda`` or ``auto``.
        cpu_isa: the portable CPU mode the config asks for (``native`` asks nothing).

    Returns:
        :func:`determinism_flags`: what is now in force, read back.

    Raises:
        InputError: an unknown mode, a thread count below 1, ``cuda`` without a GPU, a
            ``cpu_isa`` baseline not in force in this process (``_determinism.isa.require_isa``),
            or, in strict mode, ``CUBLAS_WORKSPACE_CONFIG`` to be set after torch may already have
            used cuBLAS (:func:`cublas_may_be_in_use`; warn mode warns).
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
    require_isa(cpu_isa)
    enforce = mode != "off"
    set_cublas = (
        enforce and concrete == "cuda" and os.environ.get(CUBLAS_ENV) not in CUBLAS_DETERMINISTIC_VALUES
    )
    if set_cublas and cublas_may_be_in_use():
        _late_cublas(mode)
    torch.use_deterministic_algorithms(enforce, warn_only=mode == "warn")
    torch.backends.cudnn.deterministic = enforce
    torch.backends.cudnn.benchmark = False  # off is also torch's default
    _set_precision(enforce)
    if set_cublas:
        # Read by cuBLAS when its handle is created: effective if set before the first CUDA matmul.
        os.environ[CUBLAS_ENV] = _CUBLAS_DEFAULT
    if threads is not None:
        torch.set_num_threads(threads)
    return determinism_flags()


def cublas_may_be_in_use() -> bool:
    """Whether torch may already have made a cuBLAS handle in this process, which took the
    ``CUBLAS_WORKSPACE_CONFIG`` of that moment: CUDA is initialised and torch's allocator has
    handed out GPU memory (each handle's workspace comes from it, so none was made before the
    first allocation). Starting CUDA alone (``torch.cuda.set_device``, a NCCL process group)
    makes no handle. Never initialises CUDA."""
    import torch

    if not torch.cuda.is_initialized():
        return False
    try:  # statistics unavailable (another allocator): assume the worst
        return any(
            torch.cuda.memory_stats(index).get("allocation.all.allocated", 1) > 0
            for index in range(torch.cuda.device_count())
        )
    except Exception:
        return True


def _late_cublas(mode: Mode) -> None:
    """Refuse (strict) or warn (warn) that CUBLAS_WORKSPACE_CONFIG would be set too late."""
    message = (
        f"{CUBLAS_ENV} is not set to a deterministic value and this process has already used CUDA: "
        "a cuBLAS handle made before reads the workspace config of its time, so setting it now may "
        "not take effect"
    )
    fix = (
        f"export {CUBLAS_ENV}=:4096:8 before starting Python, or set os.environ[{CUBLAS_ENV!r}] "
        "before the process first uses CUDA"
    )
    if mode == "strict":
        raise InputError(message, source=CUBLAS_ENV, fix=fix)
    warnings.warn(f"{message}; {fix}", stacklevel=3)


def determinism_flags() -> dict[str, Any]:
    """Every determinism-relevant flag actually in force, read back from torch and the environment.

    Reading never initialises CUDA, and never fails on a mix of torch's two precision APIs.

    Returns:
        A JSON-safe dict: ``deterministic_algorithms``, ``deterministic_warn_only``,
        ``fill_uninitialized_memory``, ``cudnn_available``, ``cudnn_deterministic``,
        ``cudnn_benchmark``, ``cudnn_allow_tf32``, ``matmul_allow_tf32``,
        ``float32_matmul_precision``, ``cublas_workspace_config``, ``cuda_available``,
        ``torch_num_threads``, ``torch_num_interop_threads``; on torch >= 2.9 also each of
        :data:`PRECISION_SETTINGS` and ``fp32_precision_mixed`` (:func:`precision_flags`).
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
        **precision_flags(),
        "cublas_workspace_config": os.environ.get(CUBLAS_ENV),
        "cuda_available": torch.cuda.is_available(),
        "torch_num_threads": torch.get_num_threads(),
        "torch_num_interop_threads": torch.get_num_interop_threads(),
    }


def precision_flags() -> dict[str, Any]:
    """The float32 precision in force, read back.

    Returns:
        ``cudnn_allow_tf32``, ``matmul_allow_tf32`` and ``float32_matmul_precision`` (the legacy
        flags' meaning); on torch >= 2.9 also each of :data:`PRECISION_SETTINGS` as torch reads it
        and ``fp32_precision_mixed``: the legacy flags torch refuses to read because the new
        settings contradict them (each then given as the new settings put it: what the kernels
        follow), empty when the two agree.
    """
    new = _new_precision()
    found: dict[str, Any] = {}
    mixed = []
    for key, value in _read_legacy().items():
        if value is None:
            found[key] = _from_new_precision(key, new)
            mixed.append(key)
        else:
            found[key] = value
    if new:
        found.update(new)
        found["fp32_precision_mixed"] = mixed
    return found


def _read_legacy() -> dict[str, Any]:
    """Each legacy precision flag as torch reads it; None for one it refuses to read."""
    import torch

    readers: dict[str, Callable[[], Any]] = {
        "cudnn_allow_tf32": lambda: bool(torch.backends.cudnn.allow_tf32),
        "matmul_allow_tf32": lambda: bool(torch.backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision,
    }
    found: dict[str, Any] = {}
    for key, read in readers.items():
        try:
            found[key] = read()
        except RuntimeError:  # torch >= 2.9: "mix of the legacy and new APIs"
            found[key] = None
    return found


def _from_new_precision(key: str, new: Mapping[str, str]) -> Any:
    """The legacy flag ``key`` as the new precision settings put it."""
    if key == "matmul_allow_tf32":
        return new.get("fp32_precision_cuda_matmul") == "tf32"
    if key == "cudnn_allow_tf32":
        return "tf32" in (new.get("fp32_precision_cudnn_conv"), new.get("fp32_precision_cudnn_rnn"))
    mkldnn = new.get("fp32_precision_mkldnn_matmul")  # what torch's legacy setter maps it to
    if mkldnn == "bf16":
        return "medium"
    return "high" if "tf32" in (mkldnn, new.get("fp32_precision_cuda_matmul")) else "highest"


def _precision_holder(path: tuple[str, ...]) -> Any:
    """The object under ``torch.backends`` at ``path`` holding an ``fp32_precision`` setting, or
    None where this torch lacks it (before 2.9)."""
    import torch

    try:
        holder = functools.reduce(getattr, path, torch.backends)
    except AttributeError:
        return None
    return holder if hasattr(holder, "fp32_precision") else None


def _new_precision() -> dict[str, str]:
    """Each of :data:`PRECISION_SETTINGS` this torch has, as it reads (empty before torch 2.9)."""
    found = {}
    for key, path in PRECISION_SETTINGS:
        holder = _precision_holder(path)
        if holder is not None:
            found[key] = str(holder.fp32_precision)
    return found


def _set_precision(enforce: bool) -> None:
    """IEEE float32 everywhere (``enforce``), else torch's defaults, in both precision APIs."""
    import torch

    # Legacy first: torch >= 2.9 maps each legacy setter onto some new settings (cudnn.allow_tf32
    # False onto "none", which would follow a global "tf32"), so the new ones are set after.
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's default
    torch.backends.cudnn.allow_tf32 = not enforce  # torch's default: on
    torch.set_float32_matmul_precision("highest")
    _write_precision({key: "ieee" if enforce else _PRECISION_DEFAULTS[key] for key, _ in PRECISION_SETTINGS})


def _write_precision(values: Mapping[str, str]) -> None:
    """Set each new precision setting in ``values`` this torch has, the global first."""
    for key, path in PRECISION_SETTINGS:
        holder = _precision_holder(path)
        if holder is not None and key in values:
            holder.fp32_precision = values[key]


def save_precision() -> dict[str, Any]:
    """The float32 precision in force, for :func:`restore_precision`: the legacy flags torch
    reads (None for one it refuses to read) and the new settings."""
    return {"legacy": _read_legacy(), "new": _new_precision()}


def restore_precision(saved: Mapping[str, Any]) -> None:
    """Put back what :func:`save_precision` read: torch then reads the same values (a legacy flag
    it refused to read is left as it is)."""
    import torch

    legacy = saved["legacy"]
    if legacy["matmul_allow_tf32"] is not None:
        torch.backends.cuda.matmul.allow_tf32 = legacy["matmul_allow_tf32"]
    if legacy["cudnn_allow_tf32"] is not None:
        torch.backends.cudnn.allow_tf32 = legacy["cudnn_allow_tf32"]
    if legacy["float32_matmul_precision"] is not None:
        torch.set_float32_matmul_precision(legacy["float32_matmul_precision"])
    _write_precision(saved["new"])
