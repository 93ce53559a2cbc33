"""The training loop, on one screen: one optimizer step is ``grad_accum_steps`` micro-batches.

The loop computes; everything that records or reacts (ledger, trackers, checkpoints, the progress
bar, a benchmark's stopwatch) is a :class:`StepHook` called at the end of each step with a
:class:`StepEnd`, in the order given.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from reprotune._train.batches import micro_batches
from reprotune._train.dist_step import distributed_train_step, distributed_validate
from reprotune._train.distributed import broadcast_object, is_transport_error, lost_rank_error, shard_rows
from reprotune._train.loss import autocast, evaluate, logits_to_keep, token_loss_sum
from reprotune._train.setup import Setup, max_grad_norm
from reprotune._train.signals import raise_if_interrupted


@dataclass(frozen=True)
class Validation:
    """One validation pass: mean token loss over ``n_rows`` rows and ``n_tokens`` tokens."""

    loss: float
    n_rows: int
    n_tokens: int


@dataclass(frozen=True)
class StepEnd:
    """What optimizer step ``step`` did, as the hooks see it.

    Attributes:
        step: the optimizer step, counting from 1.
        epoch: the epoch its first row belongs to.
        rows: the dataset row indices it trained on, in order.
        n_tokens: response tokens in those rows (the loss's denominator).
        loss: the step's mean token loss.
        lr: the learning rate the step used.
        grad_norm: the gradient norm before clipping.
        validation: the validation pass after this step, if one ran.
        is_last: whether this is the run's last step.
        rank_rows: in a distributed run, each rank's rows of the step, by rank; else None.
    """

    step: int
    epoch: int
    rows: list[int]
    n_tokens: int
    loss: float
    lr: float
    grad_norm: float
    validation: Validation | None
    is_last: bool
    rank_rows: list[list[int]] | None = None


class StepHook(Protocol):
    """Something that acts at the end of every optimizer step (after the weights were updated).

    It returns True to stop the run after this step (as ``--stop-after-step`` would: resumable),
    anything else to go on.
    """

    def on_step_end(self, end: StepEnd) -> bool | None: ...


@dataclass(frozen=True)
class LoopResult:
    """What the loop did: the last step done, whether it stopped early, each step's wall time."""

    steps_done: int
    stopped: bool
    final_val_loss: float | None
    step_times_s: tuple[float, ...]


def train_loop(
    setup: Setup,
    hooks: Sequence[StepHook],
    *,
    start_step: int = 0,
    stop_after_step: int | None = None,
    stop_by_main: bool = False,
) -> LoopResult:
    """Train from ``start_step`` to ``setup.total_steps`` (or stop after ``stop_after_step``).

    ``stop_by_main`` (distributed runs, every rank alike): rank 0's hooks decide after each step
    whether the run stops, and the other ranks follow (a hook such as ``--watch-reference`` that
    only rank 0 runs); without it each rank's own hooks decide.
    """
    setup.model.train()
    # Everything loaded so far (torch, transformers, the model) lives for the whole run: keep it
    # out of the garbage collector's full passes, which otherwise stall steps at random.
    gc.collect()
    gc.freeze()
    try:
        return _loop(setup, hooks, start_step, stop_after_step, stop_by_main)
    except RuntimeError as exc:
        if setup.dist is None or not is_transport_error(exc):
            raise
        raise lost_rank_error(setup.dist, exc) from exc  # another rank left: say so, not gloo's words
    finally:
        gc.unfreeze()


def _loop(
    setup: Setup, hooks: Sequence[StepHook], start_step: int, stop_after_step: int | None, stop_by_main: bool
) -> LoopResult:
    step_times: list[float] = []
    final_val: float | None = None
    step = start_step
    for step in range(start_step + 1, setup.total_steps + 1):
        raise_if_interrupted()  # a stop whose exception a __del__ dropped is not lost
        t0 = time.perf_counter()
        rows = setup.order.step_rows(step)
        epoch, _ = setup.order.position(step)
        if setup.dist is None:
            loss, n_tokens, lr, grad_norm = train_step(setup, rows)
        else:
            loss, n_tokens, lr, grad_norm = distributed_train_step(setup, rows, step)
        validation = validate(setup) if setup.validates_at(step) else None
        if validation is not None:
            final_val = validation.loss
        is_last = step == setup.total_steps
        shards = _rank_rows(setup, rows)
        end = StepEnd(step, epoch, rows, n_tokens, loss, lr, grad_norm, validation, is_last, shards)
        stop = False
        for hook in hooks:
            stop |= bool(hook.on_step_end(end))  # a hook returns True to stop the run here
        if stop_by_main and setup.dist is not None and not is_last:
            stop = broadcast_object(setup.dist, stop)
        step_times.append(time.perf_counter() - t0)
        if (stop or (stop_after_step is not None and step >= stop_after_step)) and not is_last:
            return LoopResult(step, True, final_val, tuple(step_times))
    return LoopResult(step, False, final_val, tuple(step_times))


def _rank_rows(setup: Setup, rows: list[int]) -> list[list[int]] | None:
    """Each rank's rows of a step (distributed runs only)."""
    if setup.dist is None:
        return None
    return shard_rows(rows, setup.cfg.train.batch_size, setup.dist.world_size)


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
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    setup.scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return step_loss, n_tokens, lr, grad_norm


def validate(setup: Setup) -> Validation:
    """The validation loss of the current weights over ``setup.val_rows``."""
    if setup.dist is not None:
        loss, tokens = distributed_validate(setup)
        return Validation(loss, len(setup.val_rows), tokens)
    loss, tokens = evaluate(
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
    return Validation(loss, len(setup.val_rows), tokens)
