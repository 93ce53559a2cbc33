"""One optimizer step and one validation pass of a distributed run, with fixed-order reductions.

The same arithmetic as the single-process step (``_train.loop.train_step``), spread over ranks:
each micro-batch's loss is ``loss_sum / n_tokens`` of the whole global batch, so the gradients
summed over ranks are the gradients of the step's mean token loss. Per step, one float64
all-gather carries every rank's per-micro-batch losses, its gradient shards' sum of squares (FSDP),
its token count and a 48-bit prefix of its rows' hash; every rank then adds them in the same
order, so every rank (and every rerun) gets the same bits, and rank 0 checks that each rank
trained the rows the ledger names.

With ``train.world_size_invariant`` the backend's sum of the gradients (DDP's all-reduce, FSDP2's
reduce-scatter: rank partial sums, added in an order that depends on the world size) is replaced:
each micro-batch's gradient of the trainable (LoRA) parameters is kept apart, every rank's are
all-gathered, and they are added one after another in global micro-batch order, the left fold a
single process's backward accumulates. Each micro-batch's gradient is the same bits whichever rank
computes it (same weights, rows, dropout seed), so every step is the same bits at every world size.
"""

from __future__ import annotations

import math

import torch

from reprotune._errors import RunFailedError
from reprotune._run.ledger import batch_sha256
from reprotune._train.batches import IGNORE_INDEX, micro_batches
from reprotune._train.distributed import (
    DistContext,
    gather_f64,
    micro_batch_seed,
    ordered_sum,
    rank_micro_batches,
)
from reprotune._train.loss import autocast, logits_to_keep, token_loss_sum
from reprotune._train.setup import Setup
from reprotune._train.sharding import (
    add_in_global_order,
    grad_square_sum,
    gradient_sync,
    scale_grads,
    take_gradients,
)
from reprotune._train.step import apply_update, max_grad_norm

#: ``torch.nn.utils.clip_grad_norm_``'s epsilon, so clipping means the same as in a single process.
_CLIP_EPS = 1e-6


def _context(setup: Setup) -> DistContext:
    if setup.dist is None:
        raise ValueError("a distributed step needs a distributed setup")
    return setup.dist


def _batch(setup: Setup, rows: list[int]) -> dict[str, torch.Tensor]:
    return setup.examples.batch(
        rows, pad_token_id=setup.pad_token_id, padding_side=setup.cfg.model.padding_side
    )


def _tokens(batch: dict[str, torch.Tensor]) -> int:
    """Scored tokens of a padded batch, counted as the single-process step counts them."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def _hash48(rows: list[int]) -> float:
    """The first 48 bits of the rows' batch hash, as an exact float64."""
    return float(int(batch_sha256(rows)[:12], 16))


def distributed_train_step(setup: Setup, rows: list[int], step: int) -> tuple[float, int, float, float]:
    """Optimizer step ``step`` over the global batch ``rows``; return (loss, tokens, lr, grad norm).

    Every rank returns the same numbers. The loss is the sum, in micro-batch order, of each
    micro-batch's ``loss_sum / n_tokens`` (as a single process adds them).
    """
    ctx, cfg, optimizer, scaler = _context(setup), setup.cfg, setup.optimizer, setup.scaler
    module = setup.train_module if setup.train_module is not None else setup.model
    chunks = list(micro_batches(rows, cfg.train.batch_size))
    mine = rank_micro_batches(len(chunks), ctx.rank, ctx.world_size)
    # Every rank pads every micro-batch and counts the whole global batch's tokens itself: no
    # collective for the denominator.
    padded = [_batch(setup, chunk) for chunk in chunks]
    counts = [_tokens(b) for b in padded]
    n_tokens = sum(counts)
    lr = optimizer.param_groups[0]["lr"]
    losses = [0.0] * len(chunks)
    local_tokens = 0
    invariant = ctx.world_size_invariant
    kept: list[torch.Tensor] = []  # invariant: this rank's micro-batches' gradients, apart
    for j, k in enumerate(mine):
        on_cpu = padded[k]
        keep = logits_to_keep(on_cpu["labels"]) if setup.keep_logits else None
        local_tokens += counts[k]
        batch = {key: value.to(setup.device) for key, value in on_cpu.items()}
        # Dropout masks belong to the micro-batch, whichever rank trains it.
        torch.manual_seed(micro_batch_seed(setup.seeds["dropout"], step, k))
        with gradient_sync(module, ctx, sync=j == len(mine) - 1):
            with autocast(cfg.train.precision, setup.device):
                loss_sum = token_loss_sum(module, batch, keep=keep)
            loss = loss_sum / max(n_tokens, 1)
            (scaler.scale(loss) if scaler else loss).backward()
        if invariant:
            kept.append(take_gradients(setup.trainable))
        losses[k] = float(loss.detach())
    if invariant:
        add_in_global_order(ctx, setup.trainable, kept)
    if scaler:
        scaler.unscale_(optimizer)
    my_rows = [row for k in mine for row in chunks[k]]
    square = grad_square_sum(setup.trainable)
    gathered = gather_f64(ctx, [*losses, square, float(local_tokens), _hash48(my_rows)])
    _check_ranks(ctx, gathered, chunks, n_tokens, step)
    step_loss = ordered_sum([gathered[_owner(k, len(chunks), ctx)][k] for k in range(len(chunks))])
    # DDP and the invariant mode: every rank holds the whole summed gradient; FSDP: each a shard.
    sharded = ctx.trainable_sharded
    total = ordered_sum([part[len(chunks)] for part in gathered]) if sharded else square
    grad_norm = math.sqrt(total)
    coef = max_grad_norm(cfg) / (grad_norm + _CLIP_EPS)
    if coef < 1.0:
        scale_grads(setup.trainable, coef)
    apply_update(setup)
    return step_loss, n_tokens, lr, grad_norm


def _owner(k: int, n_micro: int, ctx: DistContext) -> int:
    return k // (n_micro // ctx.world_size)


def _check_ranks(
    ctx: DistContext, gathered: list[list[float]], chunks: list[list[int]], n_tokens: int, step: int
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


@torch.no_grad()
def distributed_validate(setup: Setup) -> tuple[float, int]:
    """The validation loss over ``setup.val_rows`` with the current weights; (mean loss, tokens).

    Validation batch ``b`` runs on rank ``b % world_size``; each batch's float64 loss sum and its
    token count are gathered, and added in batch order, as a single process adds them. Under FSDP
    a forward is a collective, so a rank with no batch left repeats the first one and discards it.
    """
    ctx, cfg, model = _context(setup), setup.cfg, setup.model
    chunks = list(micro_batches(setup.val_rows, cfg.eval.batch_size))
    sums, counts = [0.0] * len(chunks), [0.0] * len(chunks)
    was_training = model.training
    model.eval()
    for start in range(0, len(chunks), ctx.world_size):
        b = start + ctx.rank
        if b >= len(chunks) and ctx.strategy == "ddp":
            break
        on_cpu = _batch(setup, chunks[b] if b < len(chunks) else chunks[0])
        keep = logits_to_keep(on_cpu["labels"]) if setup.keep_logits else None
        batch = {key: value.to(setup.device) for key, value in on_cpu.items()}
        with autocast(cfg.train.precision, setup.device):
            loss_sum = token_loss_sum(model, batch, keep=keep)
        if b < len(chunks):
            sums[b], counts[b] = float(loss_sum), float(_tokens(on_cpu))
    model.train(was_training)
    gathered = gather_f64(ctx, [*sums, *counts])
    n = len(chunks)
    total = ordered_sum([gathered[b % ctx.world_size][b] for b in range(n)])
    tokens = sum(int(gathered[b % ctx.world_size][n + b]) for b in range(n))
    return (total / tokens if tokens else math.nan), tokens
