"""Fault injection for crash tests: kill this process at a named point, on request.

``REPROTUNE_KILL_AT=<point>:<n>`` sends SIGKILL to the process the n-th time (from 1) it passes
``kill_point("<point>")``. Unset (always, outside the crash tests), ``kill_point`` costs one dict
lookup. Points: ``step-end`` (after a step's ledger line), ``ledger-append`` (half a line written),
``replace:<file name>`` (temporary file written, not yet renamed over ``<file name>``), and
``checkpoint-file`` (after each file of a checkpoint, and after its rename).
"""

from __future__ import annotations

import os
import signal

_ENV = "REPROTUNE_KILL_AT"
_counts: dict[str, int] = {}


def enabled() -> bool:
    """True when a kill point is armed (only in crash tests)."""
    return bool(os.environ.get(_ENV))


def kill_point(name: str) -> None:
    """SIGKILL this process if ``REPROTUNE_KILL_AT`` names this point and occurrence."""
    spec = os.environ.get(_ENV)
    if not spec:
        return
    point, _, nth = spec.rpartition(":")
    if point != name:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
