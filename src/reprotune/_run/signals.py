"""SIGTERM and SIGHUP handled as Ctrl-C is, for the life of a run.

``kill``, ``docker stop`` and job schedulers send SIGTERM; a closed terminal sends SIGHUP. Either
one, while a run trains, raises :class:`reprotune._errors.Interrupted` (a ``KeyboardInterrupt``)
in the main thread, so the run ends the way an interrupted run does: ledger flushed, record
``status: interrupted``, resumable. A second signal while the run is already stopping is ignored,
so that the record gets written. The previous handlers are restored when the run ends.

Python runs a handler wherever the main thread happens to be, and an exception raised inside a
``__del__`` or a weakref callback (the garbage collector runs them at any moment) is printed and
dropped: such a stop once let a run train on to ``completed``, deaf to further signals. So the
signal taken is also remembered, and :func:`raise_if_interrupted` (at every step's start, so
also after the setup, and while verify waits for a leg) raises it again where it cannot be dropped.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from reprotune._errors import Interrupted

#: The signals turned into an interruption (those that exist on this platform).
SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)


@contextlib.contextmanager
def interrupt_on_signals(*, default_only: bool = False) -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Interrupted`; restored after.

    A signal that is ignored (``nohup`` ignores SIGHUP: training goes on when the terminal
    closes), or whose handler was set outside Python, is left as it is; with ``default_only`` (in
    a user's script) also one that has a handler of the script's own. Outside the main thread
    (where Python cannot set handlers) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised: list[int] = []
    _scopes.append(raised)

    def handler(signum: int, _frame: FrameType | None) -> None:
        if raised:  # already stopping: let the record be written
            return
        raised.append(signum)
        raise Interrupted(signum)

    previous: dict[signal.Signals, Any] = {}
    for sig in SIGNALS:
        current = signal.getsignal(sig)
        if current is signal.SIG_IGN or current is None or (default_only and current is not signal.SIG_DFL):
            continue
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        _scopes.remove(raised)


#: The signals taken in each open :func:`interrupt_on_signals` block, innermost last.
_scopes: list[list[int]] = []


def raise_if_interrupted() -> None:
    """Raise :class:`Interrupted` if a signal was taken in the innermost block and its exception
    never arrived (dropped by a ``__del__`` or callback it was raised in); else nothing."""
    if _scopes and _scopes[-1]:
        raise Interrupted(_scopes[-1][0])


@contextlib.contextmanager
def recording_the_end() -> Iterator[None]:
    """While a run records how it ended (failed or interrupted), SIGTERM and SIGHUP are ignored:
    a launcher's stop arriving then (torchrun stops every rank as soon as one fails) would cut the
    record's write short and leave it ``running``. The run exits right after; handlers restored.
    Outside the main thread this does nothing."""
    with _ignored(SIGNALS):
        yield


@contextlib.contextmanager
def waiting_out_a_stop() -> Iterator[None]:
    """While verify gives the legs it stopped their (bounded) grace to record their end, Ctrl-C,
    SIGTERM and SIGHUP are ignored: a second press would otherwise kill them mid-write, leaving
    their records ``running``. Handlers restored after; outside the main thread this does nothing."""
    with _ignored((signal.SIGINT, *SIGNALS)):
        yield


@contextlib.contextmanager
def _ignored(signals: tuple[signal.Signals, ...]) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
