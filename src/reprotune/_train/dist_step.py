"""A torchrun rank's share of an optimizer step and of a validation pass, with fixed-order
reductions: what ``_train.step`` asks a rank's ``_train.dist_strategy.Distributed`` for.

The same arithmetic as one process, spread over ranks: each micro-batch's loss is
``loss_sum / n_tokens`` of the whole global batch, so the gradients summed over ranks are the
gradients of the step's mean token loss. Per step, one float64 all-gather carries every rank's
per-micro-batch losses, its gradient shards' sum of squares (FSDP), its token count and a 48-bit
prefix of its rows' hash; every rank then adds them in the same order, so every rank (and every
rerun) gets the same bits, and rank 0 checks that each rank trained the rows the ledger names.

With ``train.world_size_invariant`` the backend's sum of the gradients (DDP's all-reduce, FSDP2's
reduce-scatter: rank partial sums, added in an order that depends on the world size) is replaced:
each micro-batch's gradient of the trainable (LoRA) parameters is kept apart, every rank's are
all-gathered, and they are added one after another in global micro-batch order, the left fold a
single process's backward accumulates. Each micro-batch's gradient is the same bits whichever rank
computes it (same weights, rows, dropout seed), so every step is the same bits at every world size.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch

from reprotune._errors import RunFailedError
from reprotune._run.ledger import batch_sha256
from reprotune._train.distributed import DistContext, gather_f64, micro_batch_seed, rank_micro_batches
from reprotune._train.setup import Setup
from reprotune._train.sharding import (
    add_in_global_order,
    grad_square_sum,
    gradient_sync,
    scale_grads,
    take_gradients,
)
from reprotune._train.step import StepTally, max_grad_norm, ordered_sum

#: ``torch.nn.utils.clip_grad_norm_``'s epsilon, so clipping means the same as in a single process.
_CLIP_EPS = 1e-6


class RankStep:
    """A torchrun rank's share of optimizer step ``step`` (``_train.step.StepShare``)."""

    def __init__(self, ctx: DistContext, setup: Setup, module: torch.nn.Module, step: int) -> None:
        self.ctx, self.setup, self.module, self.step = ctx, setup, module, step
        self.kept: list[torch.Tensor] = []  # invariant mode: this rank's micro-batches' gradients

    def mine(self, n_micro: int) -> Sequence[int]:
        return rank_micro_batches(n_micro, self.ctx.rank, self.ctx.world_size)

    @contextlib.contextmanager
    def micro_batch(self, index: int, *, last: bool) -> Iterator[None]:
        ctx, trainable = self.ctx, self.setup.trainable
        # Dropout masks belong to the micro-batch, whichever rank trains it.
        torch.manual_seed(micro_batch_seed(self.setup.seeds["dropout"], self.step, index))
        with gradient_sync(self.module, ctx, sync=last):
            yield
        if ctx.world_size_invariant:
            self.kept.append(take_gradients(trainable))
            if last:
                add_in_global_order(ctx, trainable, self.kept)

    def finish(self, tally: StepTally) -> tuple[float, float]:
        """Every rank's losses, gradient square sums, tokens and rows gathered in float64 and added
        in the same order on every rank; the norm of the whole gradient, the gradients clipped."""
        ctx, setup, n = self.ctx, self.setup, len(tally.chunks)
        my_rows = [row for k in tally.mine for row in tally.chunks[k]]
        local_tokens = sum(tally.counts[k] for k in tally.mine)
        square = grad_square_sum(setup.trainable)
        gathered = gather_f64(ctx, [*tally.losses, square, float(local_tokens), _hash48(my_rows)])
        _check_ranks(ctx, gathered, tally.chunks, tally.n_tokens, tally.step)
        step_loss = ordered_sum([gathered[_owner(k, n, ctx)][k] for k in range(n)])
        # DDP and the invariant mode: every rank holds the whole summed gradient; FSDP: each a shard.
        total = ordered_sum([part[n] for part in gathered]) if ctx.trainable_sharded else square
        grad_norm = math.sqrt(total)
        coef = max_grad_norm(setup.cfg) / (grad_norm + _CLIP_EPS)
        if coef < 1.0:
            scale_grads(setup.trainable, coef)
        return step_loss, grad_norm


def _hash48(rows: list[int]) -> float:
    """The first 48 bits of the rows' batch hash, as an exact float64."""
    return float(int(batch_sha256(rows)[:12], 16))


def _owner(k: int, n_micro: int, ctx: DistContext) -> int:
    return k // (n_micro // ctx.world_size)


def _check_ranks(
    ctx: DistContext, gathered: list[list[float]], chunks: Sequence[list[int]], n_tokens: int, step: int
) -> None:
    """Each rank trained the rows the placement gives it and all the step's tokens were counted."""
    n = len(chunks)
    counted = sum(int(part[n + 1]) for part in gathered)
    if counted != n_tokens:
        raise RunFailedError(
            f"step {step}: the ranks trained {counted} tokens, the global batch has {n_tokens}"
        )
    for rank, part in enumerate(gathered):
        expected = [row for k in rank_micro_batches(n, rank, ctx.world_size) for row in chunks[k]]
        if part[n + 2] != _hash48(expected):
            raise RunFailedError(
                f"step {step}: rank {rank} trained other rows than the placement gives it",
                fix="every rank must run the same reprotune version on the same data",
            )


def rank_validation_batches(ctx: DistContext, n_batches: int) -> Iterator[tuple[int, bool]]:
    """Validation batch ``b`` runs on rank ``b % world_size``: this rank's, each with whether it is
    scored. Under FSDP a forward is a collective, so a rank with no batch left repeats the first
    one, unscored."""
    for start in range(0, n_batches, ctx.world_size):
        b = start + ctx.rank
        if b < n_batches:
            yield b, True
        elif ctx.strategy == "ddp":
            return
        else:
            yield 0, False


def gather_validation(
    ctx: DistContext, sums: list[float], counts: list[int]
) -> tuple[list[float], list[int]]:
    """Every validation batch's float64 loss sum and token count, gathered from the rank that
    scored it, in batch order."""
    n = len(sums)
    gathered = gather_f64(ctx, [*sums, *(float(c) for c in counts)])
    owners = [gathered[b % ctx.world_size] for b in range(n)]
    return [owner[b] for b, owner in enumerate(owners)], [int(owner[n + b]) for b, owner in enumerate(owners)]
