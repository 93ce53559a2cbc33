"""Training in turns (reprotune._train.turn): a turn excludes every other process's turn on the
same lock file until it ends, however it ends."""

from __future__ import annotations

import errno
import fcntl
from pathlib import Path

import pytest

from reprotune._train.turn import training_turn


def _free(lock: Path) -> bool:
    with open(lock, "ab") as other:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(other, fcntl.LOCK_UN)
        return True


def test_a_turn_excludes_others_until_it_ends(tmp_path: Path) -> None:
    lock = tmp_path / ".train-lock"
    with training_turn(lock):
        assert not _free(lock)  # another open file (another process's) must wait
    assert _free(lock)
    with pytest.raises(RuntimeError), training_turn(lock):
        raise RuntimeError("a failed run")
    assert _free(lock)


def test_no_lock_file_means_no_turns(tmp_path: Path) -> None:
    with training_turn(None):
        assert list(tmp_path.iterdir()) == []


def test_a_filesystem_that_cannot_lock_trains_without_a_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flock refused as unsupported (ENOLCK, some network filesystems): the block still runs; any
    other error is raised."""

    def refuse(handle: object, operation: int, code: int = errno.ENOLCK) -> None:
        raise OSError(code, "no locks here")

    monkeypatch.setattr(fcntl, "flock", refuse)
    ran = []
    with training_turn(tmp_path / ".train-lock"):
        ran.append(True)
    assert ran == [True]
    monkeypatch.setattr(fcntl, "flock", lambda handle, operation: refuse(handle, operation, errno.EBADF))
    with pytest.raises(OSError, match="no locks here"), training_turn(tmp_path / ".train-lock"):
        pass
