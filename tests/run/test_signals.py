"""Which signals a run takes over (reprotune._run.signals.interrupt_on_signals): never one that is
ignored (nohup's SIGHUP: training goes on when the terminal closes) and, in a user's script, never
one the script handles itself; every handler is as it was after the block."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from reprotune._errors import Interrupted
from reprotune._run.signals import interrupt_on_signals


@pytest.fixture
def restored() -> Iterator[None]:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


def _own(signum: int, frame: object) -> None:  # a script's own handler
    pass


def test_an_ignored_signal_stays_ignored_and_a_default_one_is_taken(restored: None) -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with interrupt_on_signals():
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        with pytest.raises(Interrupted):
            signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGHUP)  # ignored: nothing happens
    assert (
        signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    )


def test_a_scripts_own_handler_is_left_to_it_with_default_only(restored: None) -> None:
    signal.signal(signal.SIGTERM, _own)
    with interrupt_on_signals(default_only=True):
        assert signal.getsignal(signal.SIGTERM) is _own
    with interrupt_on_signals():  # reprotune's own process (the CLI): taken, then given back
        assert signal.getsignal(signal.SIGTERM) is not _own
    assert signal.getsignal(signal.SIGTERM) is _own
