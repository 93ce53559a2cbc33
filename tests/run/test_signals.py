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
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
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


def test_ctrl_c_then_sigterm_stops_once(restored: None) -> None:
    """Ctrl-C raises Python's plain KeyboardInterrupt and counts as the first stop: a SIGTERM right
    after (a verify leg gets the terminal's Ctrl-C and its verify's SIGTERM at once) is ignored
    while the run records its end, where it raised a second time and cut that short; Python's own
    Ctrl-C handler is back after the block."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background shell's child ignores it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with interrupt_on_signals():
        with pytest.raises(KeyboardInterrupt) as caught:
            signal.raise_signal(signal.SIGINT)
        assert type(caught.value) is KeyboardInterrupt  # not Interrupted: the CLI says "interrupted"
        signal.raise_signal(signal.SIGTERM)  # already stopping: nothing happens
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_signal_while_verify_waits_out_a_stop_is_held_for_after(restored: None) -> None:
    """During a stopped leg's grace, Ctrl-C and SIGTERM do not interrupt verify (they would kill the
    leg mid-record) but are held, so that a stop at a leg's time limit still ends verify after."""
    from reprotune._run.signals import waiting_out_a_stop

    signal.signal(signal.SIGINT, signal.default_int_handler)
    with waiting_out_a_stop() as taken:
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
    assert taken == [signal.SIGTERM, signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
