"""Two machines' kernel facts (``_run.kernels``) told apart, in words: which differ, which are
settings of a run rather than facts of its machine, and which a run did not use (the GPU of a run
that computed on the CPU). No torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Steering variables that set how many threads compute (a run's setting, not its machine's).
THREAD_VARIABLES = frozenset(
    {"MKL_NUM_THREADS", "MKL_DYNAMIC", "OMP_NUM_THREADS", "OMP_DYNAMIC", "OPENBLAS_NUM_THREADS"}
)
#: Steering variables only CUDA's libraries read.
CUDA_VARIABLES = frozenset(
    {
        "CUBLAS_WORKSPACE_CONFIG",
        "NVIDIA_TF32_OVERRIDE",
        "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
        "NCCL_ALGO",
        "NCCL_PROTO",
    }
)
#: The thread variables among the steering variables, as :data:`KERNEL_LABELS` names them.
THREADS = "steering_env.threads"

#: Kernel facts worth naming when two runs' numbers differ, most telling first: key (under
#: ``environment.kernels``) -> how people call it. The portable CPU mode comes first: where the
#: runs' modes differ, that setting chose the kernel facts after it (on an Intel CPU it moves four
#: of them, and a cause names three: it was left out there).
KERNEL_LABELS: tuple[tuple[str, str], ...] = (
    ("portable.cpu_isa", "determinism.cpu_isa"),
    ("cpu.aten_capability", "CPU capability"),
    ("blas.mkl_code_path", "MKL code path"),
    ("blas.mkl_cbwr", "MKL CNR mode"),
    ("cuda.devices", "GPU"),
    ("cuda.cublas", "cuBLAS"),
    ("cuda.cudnn", "cuDNN"),
    ("cuda.nccl", "NCCL"),
    ("algorithms", "torch's algorithm settings"),
    ("cuda.math", "CUDA math modes"),
    ("cuda.cuda_runtime", "CUDA runtime"),
    ("attention.implementation", "attention"),
    ("cpu.model", "CPU"),
    ("cpu.isa", "CPU instruction sets"),
    ("cpu.vendor", "CPU vendor"),
    ("cpu.family", "CPU family"),
    ("cpu.model_number", "CPU model number"),
    ("cpu.arch", "CPU architecture"),
    ("blas.blas", "BLAS"),
    ("blas.lapack", "LAPACK"),
    ("blas.mkl_version", "MKL"),
    ("blas.onednn_version", "oneDNN"),
    ("blas.mkldnn_enabled", "oneDNN enabled"),
    ("blas.openmp", "OpenMP"),
    ("steering_env", "kernel environment variables"),
    (THREADS, "thread variables"),
    ("attention", "SDPA backends"),
)

#: Kernel facts that are settings of a run, not facts of its machine: one machine runs both.
SETTINGS = ("algorithms", "cuda.math", "attention", THREADS)

#: Kernel facts that are builds of the libraries torch computes with (another torch build, or other
#: CUDA libraries, on the same hardware).
BUILDS = (
    "blas.blas",
    "blas.lapack",
    "blas.mkl_version",
    "blas.onednn_version",
    "blas.openmp",
    "cuda.cuda_runtime",
    "cuda.cublas",
    "cuda.cudnn",
    "cuda.nccl",
)

#: Sections that records and traces from before them lack: a difference there is unknown, not named.
ADDED_LATER = frozenset({"algorithms"})


def comparable(facts: Mapping[str, Any], *, on_gpu: bool | None) -> dict[str, Any]:
    """A machine's kernel facts as two runs' are compared: a run that computed on the CPU
    (``on_gpu`` False) has no CUDA facts or CUDA variables (a GPU it did not use chose none of its
    kernels); the GPUs are the distinct models (name, compute capability, SM
    count), not how many a machine has or their indices; ``deterministic_warn_only`` is left out
    (where a deterministic run that only warns runs another kernel, a strict one stops)."""
    out = dict(facts)
    steering, algorithms = out.get("steering_env"), out.get("algorithms")
    if isinstance(algorithms, Mapping):
        out["algorithms"] = {k: v for k, v in algorithms.items() if k != "deterministic_warn_only"}
    if on_gpu is False:  # unset, as on a machine without a GPU
        out["cuda"] = None
        if isinstance(steering, Mapping):
            out["steering_env"] = {k: None if k in CUDA_VARIABLES else v for k, v in steering.items()}
    cuda = out.get("cuda")
    if isinstance(cuda, Mapping) and isinstance(cuda.get("devices"), list):
        models = {
            (str(d.get("name")), str(d.get("capability")), d.get("sm_count"))
            for d in cuda["devices"]
            if isinstance(d, Mapping)
        }
        devices = [{"name": n, "capability": c, "sm_count": m} for n, c, m in sorted(models, key=str)]
        out["cuda"] = {**cuda, "devices": devices}
    return out


def machine_facts(facts: Mapping[str, Any], *, builds: bool = True) -> dict[str, Any]:
    """``facts`` without the run's settings (:data:`SETTINGS`): what the machine decides; without
    ``builds``, also without the libraries' builds (:data:`BUILDS`): its hardware alone."""
    out = dict(facts)
    for key in SETTINGS + (() if builds else BUILDS):
        section, _, name = key.partition(".")
        if key == THREADS and isinstance(out.get(section), Mapping):
            out[section] = {k: v for k, v in out[section].items() if k not in THREAD_VARIABLES}
        elif not name:
            out.pop(section, None)
        elif isinstance(out.get(section), Mapping):
            out[section] = {k: v for k, v in out[section].items() if k != name}
    return out


def _lookup(facts: Mapping[str, Any], dotted: str) -> Any:
    value: Any = facts
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _shown(value: Any, other: Any) -> str:
    if isinstance(value, list) and all(isinstance(v, str) for v in value) and isinstance(other, list):
        only = [v for v in value if v not in other]
        return ("only " + ", ".join(only)) if only else "a subset"
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        return "; ".join(
            " ".join(f"{v.get(k)}" for k in ("name", "capability", "sm_count") if v.get(k) is not None)
            for v in value
        )
    if isinstance(value, Mapping):
        other_map = other if isinstance(other, Mapping) else {}
        changed = {k: v for k, v in sorted(value.items()) if other_map.get(k) != v}
        return ", ".join(f"{k}={'unset' if v is None else v}" for k, v in changed.items()) or "unset"
    return "none" if value is None else str(value)


def _fact(facts: Mapping[str, Any], key: str) -> Any:
    """The value of a :data:`KERNEL_LABELS` key: the steering variables apart from the thread
    variables (:data:`THREADS`), the SDPA backend switches apart from the implementation."""
    if key in ("steering_env", THREADS):
        steering = facts.get("steering_env")
        if not isinstance(steering, Mapping):
            return steering
        return {k: v for k, v in steering.items() if (k in THREAD_VARIABLES) == (key == THREADS)}
    value = _lookup(facts, key)
    if key == "attention" and isinstance(value, Mapping):
        return {k: v for k, v in value.items() if k != "implementation"}
    return value


def setting_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The :data:`SETTINGS` whose values differ between two runs' facts (a section one lacks:
    unknown, not listed)."""
    found = []
    for key in SETTINGS:
        va, vb = (_fact(f, key) if key == THREADS else _lookup(f, key) for f in (a, b))
        if key in ADDED_LATER and (va is None or vb is None):
            continue
        if (va or {}) != (vb or {}):
            found.append(key)
    return found


def kernel_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """``CPU capability AVX512 vs AVX2``: each kernel fact of two machines that differs, in
    :data:`KERNEL_LABELS` order (a key already named under a longer one is not named again)."""
    found: list[str] = []
    named: list[str] = []
    for key, label in KERNEL_LABELS:
        va, vb = _fact(a, key), _fact(b, key)
        if va == vb or any(n.startswith(key + ".") for n in named):
            continue
        if key in ADDED_LATER and (va is None or vb is None):  # one side recorded before it: unknown
            continue
        if key == "attention" and (va or {}) == (vb or {}):
            continue
        named.append(key)
        found.append(f"{label} {_shown(va, vb)} vs {_shown(vb, va)}")
    return found


def is_gpu_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether the machines' CUDA facts differ (a GPU on one side, or other GPUs or libraries)."""
    return bool(_lookup(a, "cuda") != _lookup(b, "cuda"))
