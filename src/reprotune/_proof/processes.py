"""The processes of ``reprotune verify``'s legs: ``python -m reprotune ...`` in a fresh process (or
a fresh torchrun launch when verify itself runs under torchrun), logged into the verification's
log, one at a time or several side by side (:class:`LegProcesses`); and how every process verify
starts, a user's ``--command`` included, is started and stopped (:func:`start_leg`,
:func:`wait_or_stop`, :func:`stop_legs`): ending with verify, and stopped SIGTERM first (a run
records itself interrupted, torchrun passes it on to its ranks), SIGKILL :data:`STOP_GRACE_S` later;
a command in a process group of its own, stopped as a whole (what it started: ``sh -c ...``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from reprotune._errors import InputError, RunFailedError
from reprotune._run.signals import interruption, raise_if_interrupted, waiting_out_a_stop

#: Seconds a stopped leg's processes get to end after SIGTERM before they are killed (SIGKILL).
STOP_GRACE_S = 30.0

# Variables torchrun sets for its workers: a leg launched from a verify under torchrun is a new
# torchrun launch of its own, which must not inherit them.
_TORCHRUN_ENV = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
)  # fmt: skip


def launched_by_torchrun() -> bool:
    """Whether verify runs under torchrun (at any world size, 1 included: its legs are torchrun
    runs, dropout seeded per micro-batch, whatever the number of processes)."""
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None  # as torch (and a run) decides it


def launch_world_size() -> int:
    """The world size verify was launched at: torchrun's ``WORLD_SIZE``, else 1."""
    if not launched_by_torchrun():
        return 1
    return max(1, int(os.environ.get("WORLD_SIZE", "1")))


def ending_with_this_process() -> Callable[[], None] | None:
    """A ``preexec_fn`` for every process verify starts (a ``reprotune`` leg, a torchrun launch,
    the user's ``--command``): the kernel sends it SIGTERM when this process ends, however it ends,
    SIGKILL included (Linux ``prctl(PR_SET_PDEATHSIG)``, kept across ``exec``), and one started
    after this process was already gone exits at once. So a leg never trains on as an orphan into
    the verification directory; torchrun passes the SIGTERM on to its workers, and a reprotune run
    records itself interrupted. None where the kernel has no such request (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def in_the_child() -> None:
        prctl(1, int(signal.SIGTERM))  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:  # this process ended between the fork and the request
            os._exit(128 + int(signal.SIGTERM))

    return in_the_child


def _command(args: Sequence[str], module: str = "reprotune") -> tuple[list[str], dict[str, str]]:
    """``python -m MODULE ARGS`` (``reprotune``: the CLI), or under torchrun a fresh ``torchrun
    --standalone`` launch of it at the same number of processes; and its environment."""
    env = dict(os.environ)
    if not launched_by_torchrun():
        return [sys.executable, "-m", module, *args], env
    size = launch_world_size()
    env = {k: v for k, v in env.items() if k not in _TORCHRUN_ENV and not k.startswith("TORCHELASTIC_")}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={size}"]
    return [*launch, "-m", module, *args], env


def run_logged(
    args: Sequence[str], log: Path, *, module: str = "reprotune", bad_input: bool = False
) -> float:
    """Run ``python -m MODULE ARGS`` (``reprotune``: the CLI) in a fresh process (a fresh torchrun
    launch under torchrun), its output into ``log``; return its wall time.

    Args:
        bad_input: the process's exit 2 (bad input) is this process's too: an
            :class:`InputError` of the process's message and fix.

    Raises:
        InputError: it exited 2, with ``bad_input``.
        RunFailedError: it exited with another code than 0 (the message holds its output's tail).
    """
    wall, code = _run_into(args, log, module)
    if code == 2 and bad_input:
        message, fix, _ = logged_refusal(log)
        raise InputError(message, fix=fix)
    if code != 0:
        shown = "reprotune" if module == "reprotune" else f"python -m {module}"
        raise _failed(args, code, log.read_bytes(), log, program=shown)
    return wall


def logged_refusal(log: Path) -> tuple[str, str | None, bool]:
    """The refusal a process wrote last into ``log`` (``reprotune run: error: SOURCE: MESSAGE``,
    then ``fix: FIX``): its message (the source in it), its fix, and whether an error line was
    found (when not, the message is the log's last lines)."""
    said = log.read_bytes().decode("utf-8", errors="replace").splitlines()
    errors = [i for i, line in enumerate(said) if ": error: " in line]
    text = "\n".join(said[errors[-1] :] if errors else said[-15:]).split(": error: ", 1)[-1]
    message, _, fix = text.partition("\nfix: ")
    return message, fix or None, bool(errors)


def _run_into(args: Sequence[str], log: Path, module: str = "reprotune") -> tuple[float, int]:
    command, env = _command(args, module)
    with open(log, "ab") as out:
        _header(out, command)
        started = time.perf_counter()
        code = wait_or_stop(start_leg(command, out, env, own_group=False))
    assert code is not None  # no time limit
    return time.perf_counter() - started, code


def start_leg(
    command: Sequence[str],
    out: BinaryIO,
    env: dict[str, str],
    *,
    cwd: Path | None = None,
    own_group: bool = True,
) -> subprocess.Popen[bytes]:
    """Start ``command``, its output into ``out``, ending with this process
    (:func:`ending_with_this_process`). With ``own_group`` (a user's command) it leads a process
    group of its own, which a stop reaches whole (``sh -c ...`` and what it started); without (a
    ``reprotune`` leg, or a torchrun launch of one, which stops its own ranks) it stays in this
    process's group, so a terminal's Ctrl-C and Ctrl-Z reach it as they reach verify.

    Raises:
        OSError: the command cannot be run (not found, not executable).
    """
    return subprocess.Popen(
        list(command),
        stdout=out,
        stderr=out,
        env=env,
        cwd=cwd,
        start_new_session=own_group,
        preexec_fn=ending_with_this_process(),
    )


def wait_or_stop(process: subprocess.Popen[bytes], timeout_s: float | None = None) -> int | None:
    """The exit code of ``process``; None when it ran past ``timeout_s`` and was stopped
    (:func:`stop_legs`). When this wait is itself interrupted (Ctrl-C, or SIGTERM of verify), the
    process is stopped first, then the interruption goes on."""
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        taken = stop_legs([process])
        if taken:  # verify was told to stop while the leg had its grace: it stops now
            raise interruption(taken[0]) from None
        return None
    except BaseException:
        stop_legs([process])
        raise


def stop_legs(processes: Sequence[subprocess.Popen[bytes]]) -> list[int]:
    """Stop each process (and its process group, where it leads one): SIGTERM, then, when any of
    it is still there :data:`STOP_GRACE_S` later, SIGKILL. A reprotune run records itself
    interrupted on SIGTERM; torchrun passes it on to its ranks (each in a session of its own, which
    only it can reach). While the grace runs, Ctrl-C, SIGTERM and SIGHUP of verify do not
    interrupt it (``waiting_out_a_stop``): they would SIGKILL legs in the middle of writing their
    records. Returns the signals so held, for a caller whose stop came on its own."""
    try:
        with waiting_out_a_stop() as taken:
            for process in processes:
                _signal_group(process, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while time.monotonic() < deadline and any(_running(process) for process in processes):
                time.sleep(0.1)
    finally:
        for process in processes:
            if _running(process):
                _signal_group(process, signal.SIGKILL)
            process.wait()
    return taken


def _running(process: subprocess.Popen[bytes]) -> bool:
    return process.poll() is None or group_alive(process.pid)


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(process.pid, sig)  # the group it leads: a command's, and what it started
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)  # no group of its own (a reprotune leg, or gone): the process


def group_alive(group: int) -> bool:
    """Whether a process of ``group`` is still running. A zombie is not: it has ended and waits
    for its parent (a grandchild whose ``sh`` was killed waits for init, which in a container
    may not reap it soon), so where /proc lists the group's members their states decide."""
    try:
        os.killpg(group, 0)  # any member, zombies included
    except (ProcessLookupError, PermissionError):
        return False
    states = _member_states(group)
    return not states or any(state != b"Z" for state in states)  # none seen: /proc cannot tell


def _member_states(group: int) -> list[bytes]:
    """The states (``R``, ``S``, ``Z``...) of the processes /proc lists in ``group``; empty where
    /proc lists none (not Linux, or another pid namespace)."""
    states = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_bytes().rsplit(b")", 1)[1].split()  # after "pid (comm)": any bytes
        except (OSError, IndexError):
            continue  # ended while read
        if len(fields) > 2 and fields[2] == str(group).encode():
            states.append(fields[0])
    return states


class LegProcesses:
    """The processes of verify's fast legs, side by side or one at a time.

    Side by side (``together``): each process starts at once, writes its own log next to ``log``
    and trains only in its turn (``--train-lock``, ``_train.turn``), so that their process starts
    and model loads overlap while no two train on the same cores. One at a time (under torchrun,
    or where files cannot be locked): each runs to its end when started, straight into ``log``.

    A context manager: on leaving it every process has ended (after an error, those still running
    are stopped: :func:`stop_legs`), their logs are in ``log`` in the order they started, the lock
    file is gone, and a failure not yet reported by :meth:`wait` raises.
    """

    def __init__(self, log: Path, *, together: bool) -> None:
        self.log = log
        self.together = together
        self.lock = log.with_name(".train-lock")
        self._started: list[_Started] = []

    def start(self, args: Sequence[str]) -> int:
        """Start ``python -m reprotune ARGS`` (``run`` or ``resume``); return its number.

        Raises:
            RunFailedError: one at a time, the process failed (side by side: :meth:`wait` says).
        """
        if not self.together:
            wall, code = _run_into(args, self.log)
            self._started.append(_Started(list(args), None, None, 0.0, wall, code, reported=code != 0))
            if code != 0:  # one at a time: nothing after a failed process runs
                raise _failed(args, code, self.log.read_bytes(), self.log)
            return len(self._started) - 1
        command, env = _command([*args, "--train-lock", str(self.lock)])
        part = self.log.with_name(f"{self.log.name}.{len(self._started)}")
        with open(part, "wb") as out:
            _header(out, command)
            process = start_leg(command, out, env, own_group=False)
        self._started.append(_Started(list(args), process, part, time.perf_counter()))
        return len(self._started) - 1

    def wait(self, number: int) -> float:
        """Wait for process ``number`` to end; return its wall time (start to end).

        Raises:
            RunFailedError: it exited with another code than 0.
        """
        started = self._started[number]
        while started.code is None:
            raise_if_interrupted()  # verify's stop, should a __del__ have dropped its exception
            self._poll()
            time.sleep(0.05)
        if started.code != 0:
            started.reported = True
            raise _failed(started.args, started.code, self._output(started), self.log)
        assert started.wall is not None
        return started.wall

    def ended(self, number: int) -> bool:
        """Whether process ``number`` has ended (:meth:`wait` then returns at once)."""
        self._poll()
        return self._started[number].code is not None

    def wall(self, number: int) -> float:
        """The wall time of process ``number``, which has ended (failed or not), start to end."""
        wall = self._started[number].wall
        assert wall is not None, "wall() of a process still running"
        return wall

    def _poll(self) -> None:
        for started in self._started:
            if started.code is None and started.process is not None and started.process.poll() is not None:
                started.code = started.process.returncode
                started.wall = time.perf_counter() - started.at

    def _output(self, started: _Started) -> bytes:
        return started.part.read_bytes() if started.part is not None else self.log.read_bytes()

    def __enter__(self) -> LegProcesses:
        return self

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        if error is not None:
            stop_legs([s.process for s in self._started if s.code is None and s.process is not None])
        while any(started.code is None for started in self._started):
            self._poll()
            time.sleep(0.05)
        failure = None
        for started in self._started:
            output = self._output(started)
            if started.part is not None:
                with open(self.log, "ab") as out:
                    out.write(output)
                started.part.unlink()
            if started.code and not started.reported and failure is None:
                failure = _failed(started.args, started.code, output, self.log)
        self.lock.unlink(missing_ok=True)
        if error is None and failure is not None:
            raise failure


@dataclass
class _Started:
    args: list[str]
    process: subprocess.Popen[bytes] | None  # None: run to its end when started
    part: Path | None  # its own log, while side by side
    at: float
    wall: float | None = None
    code: int | None = None
    reported: bool = False


def _header(out: BinaryIO, command: Sequence[str]) -> None:
    shown = len(command) - 1 - list(reversed(command)).index("-m")  # from the last -m: what runs
    out.write(f"$ {' '.join(command[shown:])}\n".encode())
    out.flush()


def _failed(
    args: Sequence[str], code: int, output: bytes, log: Path, *, program: str = "reprotune"
) -> RunFailedError:
    tail = output.decode("utf-8", errors="replace").splitlines()[-15:]
    return RunFailedError(
        f"`{program} {' '.join(args)}` failed with exit code {code}:\n" + "\n".join(tail),
        source=str(log),
        fix="fix the run itself first (try `reprotune run` on the config)",
    )
