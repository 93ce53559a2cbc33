"""Fault injection for crash tests: kill this process at a named point, on request.

``REPROTUNE_KILL_AT=<point>:<n>`` sends SIGKILL to the process the n-th time (from 1) it passes
``kill_point("<point>")``. Unset (always, outside the crash tests), ``kill_point`` costs one dict
lookup. Points: ``step-end``, ``ledger-append``, ``record-replace``, ``checkpoint-file``.
"""

from __future__ import annotations

import os
import signal

_ENV = "REPROTUNE_KILL_AT"
_counts: dict[str, int] = {}


def kill_point(name: str) -> None:
    """SIGKILL this process if ``REPROTUNE_KILL_AT`` names this point and occurrence."""
    spec = os.environ.get(_ENV)
    if not spec:
        return
    point, _, nth = spec.partition(":")
    if point != name:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
