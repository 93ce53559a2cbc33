"""What ``compare`` points at when two runs part at a kernel: the ``reprotune trace`` commands
to run on each machine, and the kernel facts each record holds. No torch."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from reprotune._proof.causes import is_kernel_cause
from reprotune._proof.differences import Where
from reprotune._run.rundir import RunDir


def kernels_of(run: RunDir) -> Mapping[str, Any] | None:
    """The record's kernel facts (``environment.kernels``), or None for a record made before
    reprotune recorded them."""
    kernels = run.section("environment").get("kernels")
    return kernels if isinstance(kernels, Mapping) else None


def _machine(run: RunDir) -> str:
    """The CPU (and GPU) a run's record names, for people."""
    for cpu in ((kernels_of(run) or {}).get("cpu"), run.section("environment").get("cpu")):
        if isinstance(cpu, Mapping) and cpu.get("model"):
            return str(cpu["model"])
    return "its CPU is not recorded"


def trace_commands(run_a: RunDir, run_b: RunDir, where: Where, causes: Sequence[str]) -> Iterable[str]:
    """The ``reprotune trace`` commands to run on each machine, when the runs part at a step whose
    cause is a kernel, a kernel fact nobody recorded, or nondeterminism (see ``_proof.causes``)."""
    step = where.first_divergence_step
    if step is None or step < 1 or not causes or not any(is_kernel_cause(c) for c in causes[:1]):
        return
    for label, run in (("A", run_a), ("B", run_b)):
        yield f"on {label}'s machine ({_machine(run)}):"
        yield f"  reprotune trace {run.path} --step {step} --out {label}-step-{step}.trace.jsonl"
    yield "then, with both files in one place:"
    yield f"  reprotune compare A-step-{step}.trace.jsonl B-step-{step}.trace.jsonl"
