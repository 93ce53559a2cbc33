"""The overhead benchmark's switch, outside reprotune: record only some steps of the runs trained in
a block (bench/bench_train.py, and tests/train/test_run.py, which checks it changes no number). A
plain run records every step; no option of ``reprotune run`` turns that off."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from reprotune._train.hooks import LedgerHook, TrackerHook
from reprotune._train.loop import StepEnd


@contextlib.contextmanager
def recorded_steps(records_step: Callable[[int], bool]) -> Iterator[None]:
    """Within the block, runs trained in this process record only the optimizer steps that
    ``records_step`` (1-based step -> bool) picks: the other steps write no ledger line, hash no
    weights and send no metrics (validation lines are still written). Training is unchanged.

    The overhead benchmark compares recorded and unrecorded steps of one loop with it. A run made
    so has an incomplete ledger: ``compare``, ``verify`` and ``resume`` cannot use it. It wraps the
    ledger's and the trackers' step hooks (class-wide, so not for threads that train at the same
    time) and restores them on exit.
    """
    record_step, send_metrics = LedgerHook.record_step, TrackerHook.on_step_end

    def ledger_line(self: LedgerHook, end: StepEnd) -> None:
        if records_step(end.step):
            record_step(self, end)

    def tracker_metrics(self: TrackerHook, end: StepEnd) -> None:
        if records_step(end.step):
            send_metrics(self, end)

    LedgerHook.record_step = ledger_line  # type: ignore[method-assign]
    TrackerHook.on_step_end = tracker_metrics  # type: ignore[method-assign]
    try:
        yield
    finally:
        LedgerHook.record_step = record_step  # type: ignore[method-assign]
        TrackerHook.on_step_end = send_metrics  # type: ignore[method-assign]
