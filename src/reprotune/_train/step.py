"""One optimizer step and one validation pass on this process alone: what a plain run computes
each step (``reprotune trace`` replays the same function). A torchrun rank computes its share in
``_train.dist_step`` instead; the loop reaches either through the setup's ``Distribution``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from reprotune._config.schema import ExperimentConfig
from reprotune._train.batches import micro_batches
from reprotune._train.loss import autocast, evaluate, logits_to_keep, token_loss_sum

if TYPE_CHECKING:
    from reprotune._train.setup import Setup


def max_grad_norm(cfg: ExperimentConfig) -> float:
    """The clipping threshold (infinite when clipping is off: the norm is still measured)."""
    return cfg.train.max_grad_norm if cfg.train.max_grad_norm is not None else math.inf


def _no_mark(phase: str) -> None:
    return None


def train_step(
    setup: Setup, rows: list[int], mark: Callable[[str], None] = _no_mark
) -> tuple[float, int, float, float]:
    """One optimizer step over ``rows``; return (mean token loss, tokens, lr used, grad norm).

    ``mark`` is told each part of the step as it begins (``data``, ``forward.J``, ``backward.J``
    for micro-batch J, ``optimizer``): ``reprotune trace`` labels the ops it sees with it.
    """
    cfg, model, optimizer, scaler = setup.cfg, setup.model, setup.optimizer, setup.scaler
    mark("data")
    on_cpu = [
        setup.examples.batch(chunk, pad_token_id=setup.pad_token_id, padding_side=cfg.model.padding_side)
        for chunk in micro_batches(rows, cfg.train.batch_size)
    ]
    # Counted before the copy to the device: no host sync per micro-batch.
    n_tokens = sum(int((b["labels"][:, 1:] != -100).sum()) for b in on_cpu)
    keeps = [logits_to_keep(b["labels"]) if setup.keep_logits else None for b in on_cpu]
    batches = [{k: v.to(setup.device) for k, v in b.items()} for b in on_cpu]
    lr = optimizer.param_groups[0]["lr"]
    step_loss = 0.0
    for j, (batch, keep) in enumerate(zip(batches, keeps, strict=True)):
        mark(f"forward.{j}")
        with autocast(cfg.train.precision, setup.device):
            loss_sum = token_loss_sum(model, batch, keep=keep)
        loss = loss_sum / max(n_tokens, 1)
        mark(f"backward.{j}")
        (scaler.scale(loss) if scaler else loss).backward()
        step_loss += float(loss.detach())
    mark("optimizer")
    if scaler:
        scaler.unscale_(optimizer)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(setup.trainable, max_grad_norm(cfg)))
    apply_update(setup)
    return step_loss, n_tokens, lr, grad_norm


def apply_update(setup: Setup) -> None:
    """The end of an optimizer step, its gradients clipped: the optimizer's update (through the
    loss scaler under fp16), the schedule's step, the gradients cleared."""
    if setup.scaler:
        setup.scaler.step(setup.optimizer)
        setup.scaler.update()
    else:
        setup.optimizer.step()
    setup.scheduler.step()
    setup.optimizer.zero_grad(set_to_none=True)


def validation_loss(setup: Setup) -> tuple[float, int]:
    """The mean token loss of the current weights over ``setup.val_rows``, and its token count."""
    return evaluate(
        setup.model,
        setup.examples,
        setup.val_rows,
        batch_size=setup.cfg.eval.batch_size,
        pad_token_id=setup.pad_token_id,
        padding_side=setup.cfg.model.padding_side,
        device=setup.device,
        precision=setup.cfg.train.precision,
        keep_logits=setup.keep_logits,
    )
