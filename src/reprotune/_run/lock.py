"""One writer per run directory: an exclusive ``fcntl.flock`` on a lock file inside it.

``run``, ``resume`` and ``rerun`` take the lock before they write anything into a run directory
and hold it while the run lasts (the operating system drops it when the process ends, however it
ends). A second writer is refused with the holder's pid and host. The lock file holds that holder
as JSON; a lock file left by a process that is gone (killed outright) holds no ``flock`` and is
taken over, with a note. Where the filesystem does not support ``flock`` (some network
filesystems), the holder named in the lock file is checked instead when it is on this host, and a
warning says that two writers cannot be excluded from other hosts.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprotune._errors import InputError, NoSpaceError
from reprotune._jsonio import is_no_space, no_space_error, read_json_object
from reprotune._run.layout import RunLayout
from reprotune._run.outputs import first_missing

try:  # POSIX; elsewhere every lock is "not supported" and said so
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

#: Errors that mean "this filesystem cannot lock", not "someone holds the lock".
UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL}
_BUSY = {errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES}


@dataclass
class RunDirLock:
    """The held lock of one run directory.

    Attributes:
        path: the lock file.
        locked: whether ``flock`` holds it (False where the filesystem cannot lock).
    """

    path: Path
    locked: bool
    _fd: int | None

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            if _same_file(self._fd, self.path):
                self.path.unlink()
        os.close(self._fd)  # closing the last descriptor drops the flock
        self._fd = None


def _hold(fd: int, path: Path, report: Callable[[str], None], *, locked: bool) -> RunDirLock:
    _note_stale(fd, path, report)
    try:
        _write_holder(fd)
    except OSError as exc:  # the first write of a run or resume: nothing of the run changed yet
        with contextlib.suppress(OSError):
            if _same_file(fd, path):
                path.unlink()  # ours, emptied: as a release removes it
        os.close(fd)  # the flock goes with it
        if is_no_space(exc):
            raise no_space_error(
                path.parent,
                needed=None,
                fix="free space on that device, then give the command again (the run's files are as "
                "they were)",
            ) from None
        raise
    return RunDirLock(path, locked, fd)


def holder_info() -> dict[str, Any]:
    """What this process writes into a lock it takes: pid, host and when."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def lock_run_dir(
    run_dir: Path, *, report: Callable[[str], None], what: str = "run directory", option: str = "--run-dir"
) -> RunDirLock:
    """Take the one-writer lock of ``run_dir`` (created if missing); return it, held.

    Args:
        run_dir: the run directory (or another directory with one writer: a study's).
        report: where notes go (a stale lock taken over, a filesystem that cannot lock).
        what, option: what the directory is and the option that chose it, for the messages.

    Raises:
        InputError: another live process holds the lock (its pid and host are named), or the
            directory cannot be created or written.
    """
    path = RunLayout(run_dir).lock
    made = first_missing(run_dir)  # removed again when not even the lock can be written
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise _not_a_directory(run_dir, option) from None
    except NotADirectoryError:
        raise InputError(
            f"cannot create the {what} {run_dir}: a parent of it is a file",
            source=str(run_dir),
            fix=f"choose a {option} whose parent directories are directories",
        ) from None
    except OSError as exc:
        raise InputError(
            f"cannot create the {what} {run_dir}: {exc.strerror}",
            source=str(run_dir),
            fix=f"choose a {option} in a directory you can write to",
        ) from None
    if not run_dir.is_dir():
        raise _not_a_directory(run_dir, option)
    try:
        return _take(path, run_dir, report)
    except _Busy as busy:
        raise _busy(run_dir, busy.holder, what, option) from None
    except NoSpaceError:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise


class _Busy(Exception):
    """Another live process holds the lock (its recorded holder)."""

    def __init__(self, holder: dict[str, Any]) -> None:
        super().__init__()
        self.holder = holder


def _take(path: Path, run_dir: Path, report: Callable[[str], None]) -> RunDirLock:
    for _attempt in range(10):
        fd = _open(path, run_dir)
        if not _try_flock(fd, path):
            # The filesystem cannot lock: check the recorded holder ourselves, and say so.
            _refuse_live_holder(path, fd)
            report(
                f"warning: the filesystem of {run_dir} does not support file locks (flock); "
                "reprotune cannot stop a second process on another host from writing this run "
                "directory at the same time: make sure only one does"
            )
            return _hold(fd, path, report, locked=False)
        if _same_file(fd, path):
            return _hold(fd, path, report, locked=True)
        os.close(fd)  # a releasing holder removed the file between our open and lock: again
    raise InputError(f"cannot take the lock {path}: it keeps being replaced", source=str(path))


@contextlib.contextmanager
def holding_run_dir(
    run_dir: Path, *, report: Callable[[str], None], what: str = "run directory", option: str = "--run-dir"
) -> Iterator[RunDirLock]:
    """``with holding_run_dir(d, report=...) as lock:`` the lock of ``d`` for the block."""
    lock = lock_run_dir(run_dir, report=report, what=what, option=option)
    try:
        yield lock
    finally:
        lock.release()


def read_holder(path: Path) -> dict[str, Any]:
    """The holder recorded in a lock file (``{}`` when it is empty or unreadable)."""
    return read_json_object(path)


def _open(path: Path, run_dir: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise InputError(
            f"cannot write in the run directory {run_dir}: {exc.strerror}",
            source=str(path),
            fix="choose a --run-dir in a directory you can write to",
        ) from None


def _try_flock(fd: int, path: Path) -> bool:
    """True when locked; False when the filesystem cannot lock. Raises when someone holds it."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in _BUSY:
            holder = read_holder(path)
            os.close(fd)
            raise _Busy(holder) from None
        if exc.errno in UNSUPPORTED:
            return False
        os.close(fd)
        raise
    return True


def _refuse_live_holder(path: Path, fd: int) -> None:
    """Without flock: refuse when the recorded holder is a live process on this host."""
    holder = read_holder(path)
    pid, host = holder.get("pid"), holder.get("host")
    if isinstance(pid, int) and pid != os.getpid() and host == socket.gethostname() and _alive(pid):
        os.close(fd)
        raise _Busy(holder)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _note_stale(fd: int, path: Path, report: Callable[[str], None]) -> None:
    """A holder recorded in the file we now hold is gone: say whose lock was taken over."""
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 4096).decode("utf-8", "replace").strip()
    if not text:
        return
    try:
        holder = json.loads(text)
    except ValueError:
        holder = {}
    if not isinstance(holder, dict):
        holder = {}
    who = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    report(f"note: took over the stale lock {path} of {who}, which no longer runs")


def _write_holder(fd: int) -> None:
    data = (json.dumps(holder_info(), sort_keys=True) + "\n").encode("utf-8")
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, data)


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not removed or replaced)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def refuse_if_held(run_dir: Path, *, what: str = "run directory", option: str = "--run-dir") -> None:
    """Raise the one-writer refusal, naming the holder, when a live process holds ``run_dir``'s
    lock now (probed: taken and released at once when free); for checks made before the lock is
    taken, so that a directory being written is said to be so, not to hold an unfinished run."""
    path = RunLayout(run_dir).lock
    if fcntl is None or not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = read_holder(path)
        ours = holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname()
        if exc.errno in _BUSY and not ours:
            raise _busy(run_dir, holder, what, option) from None
    finally:
        os.close(fd)  # closing releases a lock this probe took


def _busy(run_dir: Path, holder: dict[str, Any], what: str, option: str) -> InputError:
    pid, host = holder.get("pid", "?"), holder.get("host", "?")
    since = f" since {holder['since']}" if holder.get("since") else ""
    return InputError(
        f"{what} {run_dir} is being written by another process (pid {pid} on host {host}{since}); "
        f"a {what} has one writer",
        source=str(RunLayout(run_dir).lock),
        fix=f"wait for that process to end (or stop it), then try again; or choose another {option}",
    )


def _not_a_directory(run_dir: Path, option: str) -> InputError:
    return InputError(
        f"{option} {str(run_dir)!r} is a file, not a directory",
        source=option,
        fix="give a directory path (new, or holding an unfinished run)",
    )
