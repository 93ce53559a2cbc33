"""One optimizer step and one validation pass, written once for a plain run and a torchrun rank:
what a run computes each step (``reprotune trace`` replays the same function).

Where a rank's work differs from a lone process's, the step asks the setup's ``Distribution``
(``_train.strategy``) for its share of the step (:class:`StepShare`): which micro-batches this
process trains, what surrounds each one (a torchrun rank seeds dropout per micro-batch and holds
its gradient sync back until its last), how the step's loss and gradient norm are finished (one
process adds its own losses and clips with torch's norm; ranks gather theirs in float64 and clip
with the norm of every rank's gradients); and which validation batches it scores and how their
sums are gathered. A plain run's answers are its own work, with no collective: its arithmetic is a
lone process's, float for float.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from reprotune._config.schema import ExperimentConfig
from reprotune._train.batches import IGNORE_INDEX, micro_batches
from reprotune._train.loss import autocast, logits_to_keep, token_loss_sum

if TYPE_CHECKING:
    from reprotune._train.setup import Setup


@dataclass(frozen=True)
class StepTally:
    """What a step's micro-batches gave, for the distribution to finish the step with: the step's
    micro-batches (their rows) and scored tokens, those this process trained (``mine``), each
    one's loss (``loss_sum / n_tokens``; 0.0 for another rank's), the global batch's tokens."""

    step: int
    chunks: Sequence[list[int]]
    counts: Sequence[int]
    mine: Sequence[int]
    losses: Sequence[float]
    n_tokens: int


class StepShare(Protocol):
    """This process's share of one optimizer step (``Distribution.step_share``)."""

    def mine(self, n_micro: int) -> Sequence[int]:
        """The step's micro-batches this process trains, in order (all of them in a plain run)."""
        ...

    def micro_batch(self, index: int, *, last: bool) -> AbstractContextManager[None]:
        """Around the forward and backward of micro-batch ``index`` (``last``: this process's last)."""
        ...

    def finish(self, tally: StepTally) -> tuple[float, float]:
        """The step's loss and gradient norm, the gradients clipped (before the optimizer's update)."""
        ...


def max_grad_norm(cfg: ExperimentConfig) -> float:
    """The clipping threshold (infinite when clipping is off: the norm is still measured)."""
    return cfg.train.max_grad_norm if cfg.train.max_grad_norm is not None else math.inf


def ordered_sum(parts: Sequence[float]) -> float:
    """``parts`` added one after another from 0.0, in the order given (micro-batch, batch or rank
    order): the left fold a lone process's running sum makes (never ``sum``, whose float algorithm
    changed in Python 3.12)."""
    total = 0.0
    for part in parts:
        total += part
    return total


def scored_tokens(batch: dict[str, torch.Tensor]) -> int:
    """The tokens a padded (CPU) batch's loss scores: every labelled next token."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def _no_mark(phase: str) -> None:
    return None


def train_step(
    setup: Setup, rows: list[int], step: int, mark: Callable[[str], None] = _no_mark
) -> tuple[float, int, float, float]:
    """Optimizer step ``step`` over the global batch ``rows``; return (mean token loss, tokens, lr
    used, grad norm): the sum, in micro-batch order, of each micro-batch's ``loss_sum / n_tokens``
    over the whole global batch's tokens (every rank returns the same numbers).

    ``mark`` is told each part of the step as it begins (``data``, ``forward.J``, ``backward.J``
    for micro-batch J, ``optimizer``): ``reprotune trace`` labels the ops it sees with it.
    """
    cfg, optimizer, scaler = setup.cfg, setup.optimizer, setup.scaler
    module = setup.train_module if setup.train_module is not None else setup.model
    share = setup.distribution.step_share(setup, module, step)
    mark("data")
    chunks = list(micro_batches(rows, cfg.train.batch_size))
    # Every rank pads every micro-batch and counts the whole global batch's tokens itself (no
    # collective for the denominator), before the copy to the device (no host sync per micro-batch).
    on_cpu = [_padded(setup, chunk) for chunk in chunks]
    counts = [scored_tokens(batch) for batch in on_cpu]
    n_tokens = sum(counts)
    mine = share.mine(len(chunks))
    keeps = {k: logits_to_keep(on_cpu[k]["labels"]) if setup.keep_logits else None for k in mine}
    batches = {k: {key: value.to(setup.device) for key, value in on_cpu[k].items()} for k in mine}
    lr = optimizer.param_groups[0]["lr"]
    losses = [0.0] * len(chunks)
    for j, k in enumerate(mine):
        with share.micro_batch(k, last=j == len(mine) - 1):
            mark(f"forward.{j}")
            with autocast(cfg.train.precision, setup.device):
                loss_sum = token_loss_sum(module, batches[k], keep=keeps[k])
            loss = loss_sum / max(n_tokens, 1)
            mark(f"backward.{j}")
            (scaler.scale(loss) if scaler else loss).backward()
        losses[k] = float(loss.detach())
    mark("optimizer")
    if scaler:
        scaler.unscale_(optimizer)
    tally = StepTally(step, chunks, counts, mine, losses, n_tokens)
    step_loss, grad_norm = share.finish(tally)
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


@torch.no_grad()
def validation_loss(setup: Setup) -> tuple[float, int]:
    """The mean token loss of the current weights over ``setup.val_rows``, and its token count:
    each batch's loss sum in float64, added in batch order (so the eval batch size barely matters,
    and a torchrun rank's share adds up to what one process computes)."""
    cfg, model, distribution = setup.cfg, setup.model, setup.distribution
    chunks = list(micro_batches(setup.val_rows, cfg.eval.batch_size))
    sums, counts = [0.0] * len(chunks), [0] * len(chunks)
    was_training = model.training
    model.eval()
    for b, scored in distribution.validation_batches(len(chunks)):
        on_cpu = _padded(setup, chunks[b])
        keep = logits_to_keep(on_cpu["labels"]) if setup.keep_logits else None
        n = scored_tokens(on_cpu)
        batch = {key: value.to(setup.device) for key, value in on_cpu.items()}
        with autocast(cfg.train.precision, setup.device):
            loss_sum = token_loss_sum(model, batch, keep=keep)
        if scored:
            sums[b], counts[b] = float(loss_sum), n
    model.train(was_training)
    sums, counts = distribution.gather_validation(sums, counts)
    tokens = sum(counts)
    return (ordered_sum(sums) / tokens if tokens else math.nan), tokens


def _padded(setup: Setup, rows: list[int]) -> dict[str, torch.Tensor]:
    return setup.examples.batch(
        rows, pad_token_id=setup.pad_token_id, padding_side=setup.cfg.model.padding_side
    )
