"""Fault injection for crash tests: kill this process at a named point, on request.

``REPROTUNE_KILL_AT=<point>:<n>`` in a process's environment sends SIGKILL to it the n-th time
(from 1) it passes ``kill_point("<point>")``. Unset (always, outside the crash tests),
``kill_point`` costs one lookup in the environment. Points: ``step-end`` (after a step's
ledger line), ``ledger-append`` (half a line written), ``replace:<file name>`` (temporary file
written, not yet renamed over ``<file name>``), and
``checkpoint-file`` (after each file of a checkpoint, and after its rename).
"""

from __future__ import annotations

import os
import signal

_ENV = "REPROTUNE_KILL_AT"
_counts: dict[str, int] = {}


def armed() -> bool:
    """Whether this process runs under a crash test (``REPROTUNE_KILL_AT`` is set). Read when asked,
    not at import: a process forked from another that imported reprotune arms itself too."""
    return bool(os.environ.get(_ENV))


def kill_point(name: str) -> None:
    """SIGKILL this process if ``REPROTUNE_KILL_AT`` names this point and occurrence."""
    spec = os.environ.get(_ENV, "")
    if not spec:
        return
    point, _, nth = spec.rpartition(":")
    if point != name:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
