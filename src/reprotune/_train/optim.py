"""Optimizer and learning-rate schedule, built from the ``train`` section of the config."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from reprotune._config.schema import TrainConfig
from reprotune._determinism.isa import fused_adamw, isa_in_force


def build_optimizer(
    params: Iterable[torch.nn.Parameter],
    *,
    name: str,
    learning_rate: float,
    weight_decay: float,
    fused: bool = False,
) -> torch.optim.Optimizer:
    """AdamW or SGD over ``params``. ``foreach=False`` keeps the update order fixed across builds;
    ``fused`` runs AdamW as ATen's one fused kernel instead: other bits than the for-loop form, and
    a square root that is the same on every x86-64 CPU (``_determinism.isa.fused_adamw``)."""
    params = list(params)
    if name == "adamw" and fused:
        return torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay, fused=True)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay, foreach=False)
    if name == "sgd":
        return torch.optim.SGD(params, lr=learning_rate, weight_decay=weight_decay, foreach=False)
    raise ValueError(f"unknown optimizer {name!r}")


def lr_factor(step: int, *, schedule: str, warmup_steps: int, total_steps: int) -> float:
    """Multiplier of the base learning rate for optimizer step ``step`` (counting from 0).

    Linear warmup over ``warmup_steps``, then constant, linear decay to 0, or cosine decay to 0 at
    ``total_steps``.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown scheduler {schedule!r}")


def build_scheduler(
    optimizer: torch.optim.Optimizer, *, schedule: str, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` following :func:`lr_factor`; its state dict is plain numbers (safe to reload)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_factor(step, schedule=schedule, warmup_steps=warmup_steps, total_steps=total_steps),
    )


def optimizer_and_scheduler(
    trainable: list[torch.nn.Parameter], train: TrainConfig, total_steps: int, *, cpu_isa: str = "native"
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The run's optimizer over ``trainable`` and its schedule over ``total_steps``, as the
    ``train`` section says; AdamW fused where the ``determinism.cpu_isa`` mode needs it: the
    config's, or the one in force (a native config started in a mode's variables runs as that
    mode, which its record says was in force)."""
    optimizer = build_optimizer(
        trainable,
        name=train.optimizer,
        learning_rate=train.learning_rate,
        weight_decay=train.weight_decay,
        fused=fused_adamw(cpu_isa) or fused_adamw(isa_in_force()["cpu_isa"]),
    )
    scheduler = build_scheduler(
        optimizer, schedule=train.scheduler, warmup_steps=train.warmup_steps, total_steps=total_steps
    )
    return optimizer, scheduler
