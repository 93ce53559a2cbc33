"""The kernel cause of ``compare`` in words: which kernel facts differ, what pins them
(``determinism.cpu_isa``, and for a Trainer script the variables that put a mode in force), and
whether the trace commands follow. No torch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reprotune._determinism.isa import BASELINES
from reprotune._proof.cause_texts import MAX_SHOWN
from reprotune._run.kernel_compare import (
    THREADS,
    is_gpu_difference,
    kernel_differences,
    machine_facts,
    setting_differences,
)

KERNEL_CAUSE = (
    "CPU kernels differ",
    "GPU kernels differ",
    "kernel settings differ",
    "kernel libraries differ",
)


@dataclass(frozen=True)
class KernelAdvice:
    """How the two runs were made, as far as a kernel cause's advice depends on it."""

    trainer: bool = False
    traceable: bool = True


def kernel_text(a: Mapping[str, Any], b: Mapping[str, Any], made: KernelAdvice) -> str | None:
    """'CPU kernels differ: CPU capability AVX512 vs AVX2; ...: the same inputs give other bits'."""
    found = kernel_differences(a, b)
    if not found:
        return None
    more = f" (and {len(found) - MAX_SHOWN} more)" if len(found) > MAX_SHOWN else ""
    trace = (
        "the trace commands below find the first op"
        if made.traceable
        else "`reprotune trace` cannot replay these runs: below"
    )
    # each setting that differs too keeps its advice, whatever else the machines differ in
    settings = "".join(f"; {_SETTING_ADVICE[key]}" for key in setting_differences(a, b))
    machine_a, machine_b = machine_facts(a), machine_facts(b)
    if not kernel_differences(machine_a, machine_b):  # settings alone: one machine runs both
        return (
            f"{KERNEL_CAUSE[2]}: {'; '.join(found[:MAX_SHOWN])}{more}: with other settings torch runs "
            f"other kernels for some ops ({settings[2:]}; {trace})"
        )
    if not kernel_differences(machine_facts(a, builds=False), machine_facts(b, builds=False)):
        return (  # one hardware, other builds: another torch build (its MKL, oneDNN) or CUDA libraries
            f"{KERNEL_CAUSE[3]}: {'; '.join(found[:MAX_SHOWN])}{more}: other builds of the libraries "
            f"that compute the kernels give other bits (one torch build, with the same CUDA libraries, "
            f"on both{settings}; {trace})"
        )
    where = KERNEL_CAUSE[1] if is_gpu_difference(machine_a, machine_b) else KERNEL_CAUSE[0]
    shared = _shared_baseline(a, b)
    if where == KERNEL_CAUSE[1]:
        fix = "the same GPU model and CUDA libraries give the same kernels"
    elif shared:
        fix = (
            f"both ran in determinism.cpu_isa {shared}, which pins every kernel knob reprotune "
            "knows: a kernel it does not pin differs, or the mode does not hold on these two CPUs"
        )
    else:
        fix = _baseline_advice(a, b, made.trainer)
    return (
        f"{where}: {'; '.join(found[:MAX_SHOWN])}{more}: the same inputs give other bits on these two "
        f"machines ({fix}{settings}; {trace})"
    )


#: What sets each of a run's kernel settings (``kernel_compare.SETTINGS``), for the advice.
_SETTING_ADVICE = {
    "algorithms": "determinism.mode sets torch's algorithm settings",
    "cuda.math": "determinism.mode sets TF32 and the float32 matmul precision (a Trainer: its tf32 argument)",
    "attention": "the model's attn_implementation and torch's SDPA switches choose the attention",
    THREADS: "set the thread variables alike on both (determinism.threads pins torch's own threads)",
}

_SHARED_BY = {
    "avx2": "one baseline Intel CPUs share",
    "avx2-amd": "one baseline AMD CPUs share",
    "avx2-compatible": "the one baseline Intel and AMD CPUs share, on MKL's slower vendor-neutral branch",
}


def _advised_mode(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """The ``determinism.cpu_isa`` baseline both machines can hold, by their CPUs' vendors (None
    when a vendor is unknown or another)."""
    vendors = {_lookup_vendor(a), _lookup_vendor(b)}
    if vendors == {"GenuineIntel"}:
        return "avx2"
    if vendors == {"AuthenticAMD"}:
        return "avx2-amd"
    if vendors == {"GenuineIntel", "AuthenticAMD"}:
        return "avx2-compatible"
    return None


def _baseline_advice(a: Mapping[str, Any], b: Mapping[str, Any], trainer: bool) -> str:
    """Which ``determinism.cpu_isa`` baseline both machines can hold; for Trainer scripts, the
    variables that put it in force (set before Python starts; the callback records the mode)."""
    mode = _advised_mode(a, b)
    if mode is None:
        return (
            "determinism.cpu_isa pins CPU kernels to one baseline on both: avx2 on Intel CPUs, avx2-amd "
            "on AMD, avx2-compatible across them"
            + (": a Trainer script takes a mode's variables from its environment" if trainer else "")
        )
    advice = f"determinism.cpu_isa: {mode} on both pins CPU kernels to {_SHARED_BY[mode]}"
    if not trainer:
        return advice
    baseline = BASELINES[mode]
    assignments = " ".join(f"{k}={v}" for k, v in baseline.env.items())
    fused = ', with the fused AdamW (optim="adamw_torch_fused")' if baseline.fused_adamw else ""
    return f"{advice}: for a Trainer script, start both with {assignments} python ...{fused}"


def _lookup_vendor(facts: Mapping[str, Any]) -> str | None:
    vendor = (facts.get("cpu") or {}).get("vendor")
    return vendor if isinstance(vendor, str) else None


def _shared_baseline(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """The portable CPU mode both machines ran in, when it is one and not ``native``."""
    modes = {(facts.get("portable") or {}).get("cpu_isa") for facts in (a, b)}
    mode = modes.pop() if len(modes) == 1 else None
    return mode if isinstance(mode, str) and mode != "native" else None
