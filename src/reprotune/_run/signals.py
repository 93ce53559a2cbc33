"""SIGTERM and SIGHUP handled as Ctrl-C is, for the life of a run.

``kill``, ``docker stop`` and job schedulers send SIGTERM; a closed terminal sends SIGHUP. Either
one, while a run trains, raises :class:`reprotune._errors.Interrupted` (a ``KeyboardInterrupt``)
in the main thread, so the run ends the way an interrupted run does: ledger flushed, record
``status: interrupted``, resumable. Ctrl-C (SIGINT, where Python's own handler is in force) still
raises a plain ``KeyboardInterrupt`` but counts as the first signal too: a second signal of any of
the three while the run is already stopping is ignored, so that the record gets written (a verify
leg gets Ctrl-C from the terminal and SIGTERM from its verify at once). The previous handlers are
restored when the run ends.

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
from collections.abc import Callable, Iterator
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
        raise interruption(signum)

    previous: dict[signal.Signals, Any] = {}
    for sig in SIGNALS:
        current = signal.getsignal(sig)
        if current is signal.SIG_IGN or current is None or (default_only and current is not signal.SIG_DFL):
            continue
        previous[sig] = signal.signal(sig, handler)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not a script's own, nor ignored
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        _scopes.remove(raised)


#: The signals taken in each open :func:`interrupt_on_signals` block, innermost last.
_scopes: list[list[int]] = []


def raise_if_interrupted() -> None:
    """Raise the interruption of a signal taken in the innermost block whose exception never
    arrived (dropped by a ``__del__`` or callback it was raised in); else nothing."""
    if _scopes and _scopes[-1]:
        raise interruption(_scopes[-1][0])


def interruption(signum: int) -> KeyboardInterrupt:
    """The exception a signal stops with: ``KeyboardInterrupt`` for Ctrl-C (SIGINT), as Python
    raises it, else :class:`Interrupted` naming the signal (the CLI exits 128 + its number)."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Interrupted(signum)


@contextlib.contextmanager
def recording_the_end() -> Iterator[None]:
    """While a run records how it ended (failed or interrupted), Ctrl-C, SIGTERM and SIGHUP are
    ignored: a launcher's stop arriving then (torchrun stops every rank as soon as one fails) would
    cut the record's write short and leave it ``running``. The run exits right after; handlers
    restored. Outside the main thread this does nothing."""
    with _held(lambda signum: None):
        yield


@contextlib.contextmanager
def waiting_out_a_stop() -> Iterator[list[int]]:
    """While verify gives the legs it stopped their (bounded) grace to record their end, Ctrl-C,
    SIGTERM and SIGHUP do not interrupt it (a second press would kill the legs mid-write, leaving
    their records ``running``): each is held in the list this yields, for the caller to act on
    after (a stop that came on its own, at a leg's time limit, must still end verify). Handlers
    restored after; outside the main thread this does nothing."""
    taken: list[int] = []
    with _held(taken.append):
        yield taken


@contextlib.contextmanager
def _held(take: Callable[[int], None]) -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP handed to ``take`` instead of their handlers (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: take(signum)) for sig in (signal.SIGINT, *SIGNALS)
    }
    try:
        yield
    finally:
        for sig, old in previous.items():
            if old is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(sig, old)
