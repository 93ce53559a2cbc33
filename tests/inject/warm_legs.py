"""Verify's legs, forked from the tests' warm zygote (tests/warm.py) instead of started as new
interpreters, in the processes the zygote forked.

``reprotune verify`` starts each leg as ``python -m reprotune ...`` (``reprotune._proof.processes``),
and ``verify --command`` runs the user's command (``_proof.command_legs``); in a fresh interpreter
that is some 4 s of imports per leg, most of a tiny verify's time. In a process forked from the
zygote (``TESTS_WARM_ZYGOTE`` names the zygote's socket: a name no record keeps, unlike
``REPROTUNE_*``), this module gives ``reprotune._proof.processes`` (where every leg starts) a
``subprocess`` whose ``Popen`` hands ``python -m reprotune...`` or ``python SCRIPT.py``
(of this interpreter) to the zygote:
it forks the leg (its own pid, process group, working directory, environment, and the output files
verify passed), and tells its exit status back on the same connection. ``python -m
torch.distributed.run`` (a torchrun launch) is forked the same way, and in a launcher so forked
torchrun's ``SubprocessHandler`` forks each rank (``python -u -m reprotune`` or ``python -u
SCRIPT.py``) from the zygote too. Everything else (a user's other commands), and a process whose
environment differs in what a process reads when it starts (the zygote says so: the ranks'
``OMP_NUM_THREADS=1`` is served by a zygote started with it), still starts a real process.

The MLflow tracker's child (``python -m reprotune._trackers.mlflow_worker``, fed on stdin and
answering on stdout: pipes made here, whose far ends the zygote gives the child) is forked the
same way: about 1.7 s of importing MLflow less on every mirrored run.

A forked rank is reaped by the zygote the moment it exits, where a real one would stay a zombie in
its process group until torchrun waits for it; torchrun's ``killpg`` of a rank that has just exited
is therefore no error here (``SubprocessHandler.close`` below), as it is none for a real rank.

One difference from a real leg: its parent is the zygote, not verify, so verify's request that the
kernel end its legs with it (``PR_SET_PDEATHSIG``) does not hold. The zygote stands in for it: when
the process that asked for a leg dies (its connection closes while the leg runs), the leg gets
SIGTERM, as a real leg would from the kernel; a torchrun rank whose launcher is killed ends the same
way. The tests of the real thing (a killed verify leaves no orphan) start verify as a real
interpreter (``cold=True``), whose legs are real too.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
from typing import Any

ENV = "TESTS_WARM_ZYGOTE"
_TORCHRUN = "torch.distributed.run"
_HANDLER = "torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler"
_installed = False


class _Cold(Exception):
    """The zygote cannot fork this leg: start a real process."""


class WarmPopen:
    """A leg forked by the zygote, as verify uses a ``subprocess.Popen``."""

    def __init__(
        self, command: list[str], spec: dict[str, Any], *, stdout: Any, stderr: Any, stdin: Any = None
    ) -> None:
        self.args = command
        self.returncode: int | None = None
        self.stdin: Any = None
        self.stdout: Any = None
        theirs: list[int] = []  # the child's ends of the pipes asked for: closed here once sent
        fds = [
            stream.fileno() if stream not in (None, subprocess.PIPE) else fd
            for stream, fd in ((stdout, 1), (stderr, 2))
        ]
        if stdout == subprocess.PIPE:
            read, fds[0] = os.pipe()
            self.stdout, theirs = open(read, "rb"), [fds[0]]  # noqa: SIM115 (closed as Popen's are)
        if stdin == subprocess.PIPE:
            read, write = os.pipe()
            self.stdin, fds = open(write, "wb"), [read, *fds]  # noqa: SIM115
            theirs.append(read)
        self._connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._connection.connect(os.environ[ENV])
            socket.send_fds(self._connection, [json.dumps(spec).encode()], fds)
            answer = json.loads(self._connection.recv(1 << 16))
            if answer.get("cold"):
                raise _Cold
        except BaseException:  # a real process is started instead: nothing of this one is kept
            self._connection.close()
            for pipe in (self.stdin, self.stdout):
                if pipe is not None:
                    pipe.close()
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        self.pid: int = answer["started"]

    def _read_exit(self) -> None:
        data = self._connection.recv(1 << 16)
        self.returncode = json.loads(data)["code"] if data else -int(signal.SIGKILL)  # zygote gone
        self._connection.close()

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._connection], [], [], 0)[0]:
            self._read_exit()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._connection], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._read_exit()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _this_python(program: str) -> bool:
    found = shutil.which(program)
    return found is not None and os.path.realpath(found) == os.path.realpath(sys.executable)


def _fork_spec(command: Any, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """What the zygote needs to fork ``command``: ``python -m reprotune[.module] ARGS`` or ``python
    SCRIPT.py ARGS`` (a user's command) of this interpreter, with file (or inherited) output, or
    pipes to its stdin and from its stdout, and nothing else asked; None for anything else."""
    allowed = {
        "stdin",
        "stdout",
        "stderr",
        "env",
        "preexec_fn",
        "cwd",
        "start_new_session",
    }  # a forked leg leads its group
    streams_ok = (
        kwargs.get("stdin") in (None, subprocess.PIPE)  # pipes: the MLflow child's
        and (kwargs.get("stdout") in (None, subprocess.PIPE) or hasattr(kwargs["stdout"], "fileno"))
        and (kwargs.get("stderr") is None or hasattr(kwargs["stderr"], "fileno"))
    )
    if not (isinstance(command, list) and len(command) >= 2 and set(kwargs) <= allowed and streams_ok):
        return None
    if not _this_python(command[0]):
        return None
    cwd = os.path.abspath(kwargs.get("cwd") or os.getcwd())
    spec: dict[str, Any] = {"cwd": cwd, "env": dict(kwargs.get("env") or os.environ)}
    rest = list(command[1:])
    if rest[:1] == ["-u"]:  # torchrun starts its ranks unbuffered
        spec["unbuffered"], rest = True, rest[1:]
    module = rest[1] if rest[:1] == ["-m"] and len(rest) >= 2 else ""
    if module.split(".")[0] == "reprotune" or module == _TORCHRUN:
        return {**spec, "module": rest[1], "argv": rest[2:]}
    if rest and rest[0].endswith(".py") and not rest[0].startswith("-"):
        return {**spec, "script": os.path.join(cwd, rest[0]), "argv": rest[1:]}
    return None


class _Subprocess:
    """``subprocess`` for ``reprotune._proof.processes``, with legs forked where they can be."""

    @staticmethod
    def Popen(command: Any, **kwargs: Any) -> Any:
        spec = _fork_spec(command, kwargs)
        if spec is not None:
            try:
                streams = {k: kwargs.get(k) for k in ("stdin", "stdout", "stderr")}
                return WarmPopen(command, spec, **streams)
            except (_Cold, OSError):  # the zygote says no, or cannot be reached: a real process
                pass
        return subprocess.Popen(command, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)


def install_from_env() -> None:
    """In a process forked from the zygote: fork verify's legs from it too."""
    global _installed
    if _installed or not os.environ.get(ENV):
        return
    _installed = True
    from reprotune._proof import processes
    from reprotune._trackers import mlflow

    processes.subprocess = _Subprocess()  # type: ignore[assignment]  # every leg starts there
    mlflow.subprocess = _Subprocess()  # type: ignore[assignment]  # and the MLflow child
    if _HANDLER in sys.modules:  # a launcher zygote's child (tests/warm.py): torchrun is loaded
        _fork_torchrun_ranks()


def _fork_torchrun_ranks() -> None:
    """A torchrun launcher forked from the zygote forks its ranks from it too (torchrun's
    ``SubprocessHandler`` starts each rank with ``Popen(start_new_session=True)``; a forked rank
    leads its own process group, which torchrun signals with ``killpg``)."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    handler = subprocess_handler.SubprocessHandler
    started = handler._popen

    def _popen(self: Any, args: tuple[str, ...], env: dict[str, str]) -> Any:
        streams = {"stdout": self._stdout, "stderr": self._stderr}
        spec = _fork_spec(list(args), {"env": env, **streams})
        if spec is not None:
            try:
                return WarmPopen(list(args), spec, **streams)
            except (_Cold, OSError):
                pass
        return started(self, args, env)

    handler._popen = _popen  # type: ignore[method-assign]

    def close(self: Any, death_sig: Any = None) -> None:
        # torchrun's close (killpg, then its output files), but a rank gone already is no error: a
        # real rank that just exited stays a zombie in its process group until torchrun waits for
        # it, so torchrun's killpg finds it; a forked rank is reaped by the zygote at once, and a
        # rank that exited between torchrun's poll and its close made killpg raise
        # ProcessLookupError, crashing torchrun before its failure summary (seen once in CI).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, death_sig or subprocess_handler._get_default_signal())
        for stream in (self._stdout, self._stderr):
            if stream:
                stream.close()

    handler.close = close  # type: ignore[method-assign]
