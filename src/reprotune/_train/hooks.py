"""The step hooks of ``reprotune run``: ledger, trackers, checkpoints, progress bar.

Each is a small object with ``on_step_end(end)``; ``_train.attempt`` installs them in this order:
ledger, trackers, checkpoints, progress. A benchmark adds its own (``RunOptions.hooks``) after
them.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprotune._run.checkpoint import CheckpointState
from reprotune._run.ledger import LedgerWriter, init_line, train_line, val_line
from reprotune._trackers.base import TrackerSet
from reprotune._train.loop import StepEnd
from reprotune._train.setup import Setup


@dataclass
class Stopwatch:
    """Time spent recording (ledger lines, weights hashes, tracker hand-offs), summed."""

    seconds: float = 0.0


class LedgerHook:
    """Writes each recorded step's ledger line (with the weights hash) and each validation line.

    Args:
        setup: the run.
        ledger: the open ledger; None on a distributed run's other ranks, which only take part in
            gathering the weights to hash (FSDP).
        stopwatch: where the time spent is added.
    """

    def __init__(self, setup: Setup, ledger: LedgerWriter | None, stopwatch: Stopwatch) -> None:
        self._ledger = ledger
        self._stopwatch = stopwatch
        self._hash_weights = setup.distribution.weights_hasher(setup)
        self.last_step = 0  # the last step whose line was queued (the writer flushes it on exit)

    def write_init(self) -> None:
        """The ledger's first line: the LoRA weights as created."""
        digest = self._hash_weights()
        if self._ledger is not None:
            self._ledger.write(init_line(digest))

    def on_step_end(self, end: StepEnd) -> None:
        self.record_step(end)
        if end.validation is not None and self._ledger is not None:
            v = end.validation
            self._ledger.write(val_line(end.step, v.loss, v.n_rows, v.n_tokens))

    def record_step(self, end: StepEnd) -> None:
        """The step's train line, with the weights hash (timed on the stopwatch)."""
        t0 = time.perf_counter()
        # The weights are hashed now (the next step changes them); the line is built at the
        # ledger's next flush, with the lines of the steps around it.
        digest = self._hash_weights()
        if self._ledger is None:
            return
        self._ledger.write(
            lambda: train_line(
                end.step,
                end.epoch,
                end.rows,
                end.n_tokens,
                end.loss,
                end.lr,
                end.grad_norm,
                digest,
                rank_rows=end.rank_rows,
            )
        )
        self.last_step = end.step
        self._stopwatch.seconds += time.perf_counter() - t0


class TrackerHook:
    """Sends each step's metrics (train loss, lr, grad norm, val loss) to the trackers."""

    def __init__(self, trackers: TrackerSet, stopwatch: Stopwatch) -> None:
        self._trackers = trackers
        self._stopwatch = stopwatch

    def on_step_end(self, end: StepEnd) -> None:
        t0 = time.perf_counter()
        metrics = {"train_loss": end.loss, "lr": end.lr, "grad_norm": end.grad_norm}
        if end.validation is not None:
            metrics["val_loss"] = end.validation.loss
        self._trackers.log_metrics(end.step, metrics)
        self._stopwatch.seconds += time.perf_counter() - t0


@dataclass
class CheckpointHook:
    """Saves a checkpoint every ``train.save_every`` steps (not after the last: the run ends there).

    The ledger is made durable first, so a checkpoint never runs ahead of the ledger it resumes.
    In a distributed run every rank saves together (rank 0 writes); the other ranks have no
    ledger and no directory.
    """

    setup: Setup
    ledger: LedgerWriter | None
    directory: Path | None
    save_times_s: list[float] = field(default_factory=list)

    def on_step_end(self, end: StepEnd) -> None:
        every = self.setup.cfg.train.save_every
        if not every or end.step % every != 0 or end.is_last:
            return
        t0 = time.perf_counter()
        if self.ledger is not None:
            self.ledger.sync()
        position = self.setup.order.position(end.step + 1)
        state = CheckpointState(step=end.step, epoch=end.epoch, position=position)
        self.setup.distribution.save_checkpoint(self.setup, self.directory, state)
        self.save_times_s.append(time.perf_counter() - t0)


class ProgressHook:
    """A tqdm bar on stderr: steps, the last loss and tokens per second."""

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        from tqdm.auto import tqdm

        self._bar: Any = tqdm(
            total=total,
            initial=initial,
            unit="step",
            desc="train",
            file=sys.stderr,
            disable=not enabled,
            dynamic_ncols=True,
            mininterval=0.5,
        )
        self._last = time.perf_counter()
        self.step = initial  # the last step done: what an interrupted run's record says it reached

    def on_step_end(self, end: StepEnd) -> None:
        self.step = end.step
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        self._bar.set_postfix(loss=f"{end.loss:.4f}", tok_s=f"{end.n_tokens / seconds:.0f}", refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


# --- around the hooks: transformers' progress bars ---


@contextlib.contextmanager
def hf_progress_bars(enabled: bool) -> Iterator[None]:
    """Show transformers' own progress bars (loading weights) only when ours are shown."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()
