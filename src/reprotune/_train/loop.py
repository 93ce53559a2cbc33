"""The training loop, on one screen: one optimizer step is ``grad_accum_steps`` micro-batches.

Each step and validation pass is ``_train.step``'s, which asks the setup's
:class:`~reprotune._train.strategy.Distribution` for this process's share (a plain run's: all of it;
under torchrun: ``_train.dist_strategy``'s); the loop itself knows nothing of ranks.

The loop computes; everything that records or reacts (ledger, trackers, checkpoints, the progress
bar, a benchmark's stopwatch) is a :class:`StepHook` called at the end of each step with a
:class:`StepEnd`, in the order given.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from reprotune._run.signals import raise_if_interrupted
from reprotune._train.setup import Setup
from reprotune._train.step import train_step, validation_loss


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
        lost = setup.distribution.lost_rank(exc)  # another rank left: say so, not gloo's words
        if lost is None:
            raise
        raise lost from exc
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
        loss, n_tokens, lr, grad_norm = train_step(setup, rows, step)
        validation = validate(setup) if setup.validates_at(step) else None
        if validation is not None:
            final_val = validation.loss
        is_last = step == setup.total_steps
        shards = setup.distribution.rank_rows(setup, rows)
        end = StepEnd(step, epoch, rows, n_tokens, loss, lr, grad_norm, validation, is_last, shards)
        stop = False
        for hook in hooks:
            stop |= bool(hook.on_step_end(end))  # a hook returns True to stop the run here
        if stop_by_main and not is_last:
            stop = setup.distribution.agree_to_stop(stop)
        step_times.append(time.perf_counter() - t0)
        if (stop or (stop_after_step is not None and step >= stop_after_step)) and not is_last:
            return LoopResult(step, True, final_val, tuple(step_times))
    return LoopResult(step, False, final_val, tuple(step_times))


def validate(setup: Setup) -> Validation:
    """The validation loss of the current weights over ``setup.val_rows``."""
    loss, tokens = validation_loss(setup)
    return Validation(loss, len(setup.val_rows), tokens)
