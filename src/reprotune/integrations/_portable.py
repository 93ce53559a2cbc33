"""What a Trainer script's optimizer and kernels mean for ``determinism.cpu_isa``'s portable
mode: the facts of the callback's ``portable-mode-optimizer`` finding (``_findings``)."""

from __future__ import annotations

from typing import Any

import torch

from reprotune._determinism.isa import isa_in_force


def sqrt_taking_optimizer(optimizer: Any) -> str | None:
    """The optimizer's class name when its step may take a float32 square root with MKL's vector
    math on a CPU (``vsSqrt``, built on ``rsqrtps``: other bits on Intel and AMD CPUs); None for
    SGD, for Adam and AdamW with ``fused=True`` (ATen's own kernel) and for no optimizer."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the Trainer's optimizer
    if inner is None or isinstance(inner, torch.optim.SGD):
        return None
    groups = getattr(inner, "param_groups", [])
    if (
        isinstance(inner, (torch.optim.Adam, torch.optim.AdamW))
        and groups
        and all(g.get("fused") for g in groups)
    ):
        return None
    return type(inner).__name__


def portable_facts(optimizer: Any, model: Any) -> dict[str, Any]:
    """``cpu_isa`` and ``unfused_optimizer`` of :class:`TrainerFacts`: the mode in force, and the
    optimizer that may take MKL's square root when the model trains on a CPU."""
    on_cpu = next(iter(model.parameters())).device.type == "cpu"
    return {
        "cpu_isa": str(isa_in_force()["cpu_isa"]),
        "unfused_optimizer": sqrt_taking_optimizer(optimizer) if on_cpu else None,
    }
