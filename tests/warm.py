"""A warm launcher for ``python -m reprotune`` in tests: one process imports reprotune's heavy modules
once, and each CLI call becomes a fork of it.

A fresh interpreter spends about 4 of a tiny run's 5 seconds importing torch, transformers and PEFT;
the suite makes some two hundred such calls. The zygote (``_zygote`` below, started once per test
session) imports them and never computes anything (no op runs in it, so no thread pool exists to be
copied half-way); for each call it forks a child with its own pid, working directory, environment,
output files and argv, which runs ``reprotune._cli.main`` and exits with its code. Kill tests kill
that pid as they would a subprocess's; the zygote reaps it and reports the exit status.

What the children share stays cheap to share: the zygote freezes its objects out of the garbage
collector after its imports (a child's full collection would walk them all), and a child ends as
an interpreter does (its threads joined, atexit handlers run, output flushed) but then leaves with
``os._exit`` instead of tearing down every module it inherited. Measured on 2 cores (AMD EPYC): a
bare fork of the zygote took 1.8 s to exit with ``sys.exit``, 0.4 s once the objects were frozen,
0.1 s with the quick exit; a forked ``reprotune --version`` 0.5 s before the quick exit, 0.13 s
after; tests/train/test_crash.py with tests/proof/test_verify.py 232 s, 175 s, then 65.8 s in one
sitting.

A call still starts a real interpreter (:func:`needs_cold_start`) when its result may depend on what
a process reads only when it starts: the hash seed, the kernel-dispatch variables (ATen's
capability, MKL, oneDNN, OpenMP), the portable CPU mode (``determinism.cpu_isa``), or anything the
caller marks ``cold=True`` (a claim about a fresh interpreter itself). The claims under test are
about separate processes, and a fork is one: its own pid, memory and environment, started from the
state every fresh interpreter reaches after its imports.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprotune._cli._options import recorded_cpu_isa

#: Variables read when an interpreter or a math library starts: a child forked from the zygote
#: would keep the zygote's reading of them.
COLD_PREFIXES = (
    "PYTHONHASHSEED",
    "PYTHONPATH",
    "ATEN_",
    "MKL_",
    "ONEDNN_",
    "DNNL_",
    "OMP_",
    "KMP_",
    "OPENBLAS_",
    "CUDA_",
    "CUBLAS",
    "TORCH_",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
)
#: Of those, variables read later than start (torchrun gives every rank the first, read only when
#: an NCCL group is made): they need no fresh interpreter.
WARM_SAFE = ("TORCH_NCCL_ASYNC_ERROR_HANDLING",)
#: Start-time variables a launcher of its own may be started with (torchrun runs its ranks, and
#: the tests their launches, at ``OMP_NUM_THREADS=1``): a call that differs from the session's
#: environment only in these is forked from a zygote started with its values.
ZYGOTE_KEYS = ("OMP_NUM_THREADS",)

_ZYGOTE = r"""
import faulthandler, io, json, os, select, signal, socket, sys, traceback
import torch, transformers, peft, safetensors, numpy  # the imports every call shares
import reprotune._cli
from reprotune._cli import COMMANDS
import importlib
for module, _ in COMMANDS.values():
    importlib.import_module(module)
import reprotune._train.run, reprotune._proof.verify, reprotune._proof.rerun, reprotune._eval.evaluate
import reprotune._proof.trace, reprotune._doctor.doctor, reprotune._studies.study
import reprotune._proof.replay, reprotune._proof.processes, reprotune._train.dist_run
import reprotune._trackers.mlflow_worker, mlflow.tracking, mlflow.entities  # the MLflow child's
for module in json.loads(sys.argv[3]):  # a launcher zygote's: torchrun's own modules
    importlib.import_module(module)
import injected_faults, warm_legs  # tests/inject, on PYTHONPATH (tests/conftest.py)
import gc
# What every child shares (torch, transformers, PEFT...) stays out of the children's garbage
# collections: a full pass over it costs a forked run ~0.4 s, and touches (copies) its pages.
gc.collect()
gc.freeze()

# The rule for which calls need a real interpreter is tests/warm.py's own (argv[1]: that file),
# loaded without putting tests/ on the children's path.
import importlib.util
_spec = importlib.util.spec_from_file_location("_warm_rules", sys.argv[1])
_rules = sys.modules["_warm_rules"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_rules)
SOCKET = sys.argv[2]
START_ENV = dict(os.environ)
requests, replies = sys.stdin.buffer, sys.stdout.buffer
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *a: None)
listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
listener.bind(SOCKET)
listener.listen(64)
clients = {}  # connection -> pid of the process it started (None: not yet)
orphans = set()  # pids whose requester died: ended as PR_SET_PDEATHSIG ends a real leg


def reply(obj):
    replies.write((json.dumps(obj) + "\n").encode())
    replies.flush()


def needs_cold_start(spec):
    return _rules.needs_cold_start(spec["argv"], spec["env"], START_ENV, spec["cwd"])


def child(spec, fds=None):
    os.setpgid(0, 0)  # its own process group, as a started subprocess would lead one
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
    os.close(wake_r)
    os.close(wake_w)
    listener.close()
    for connection in clients:
        connection.close()
    os.chdir(spec["cwd"])
    os.environ.clear()
    os.environ.update(spec["env"])
    os.environ["TESTS_WARM_ZYGOTE"] = SOCKET  # the processes it starts fork from here too
    injected_faults.install_from_env()  # the faults a test asks for, as sitecustomize would
    warm_legs.install_from_env()
    if fds is None:
        out = os.open(spec["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(spec["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        fds = [out, err]
    if len(fds) == 2:
        fds = [os.open(os.devnull, os.O_RDONLY), *fds]
    for fd, target in zip(fds, (0, 1, 2)):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    sys.stdin = open(0, "r", closefd=False)
    through = bool(spec.get("unbuffered"))  # `python -u`, as torchrun starts its ranks
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), line_buffering=False, write_through=through)
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), line_buffering=True, write_through=through)
    # SIGUSR1 writes every thread's stack to stderr: what a call that timed out was waiting on.
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    script, module = spec.get("script"), spec.get("module", "reprotune")
    sys.argv = [script or module, *spec["argv"]]
    # As `python -m reprotune` (or `python SCRIPT`, `python -m MODULE`) ends: the exit code, then
    # the interpreter's shutdown (end_as_python_does), never back into the loop.
    try:
        import runpy
        if script:
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
            code = 0
        elif module == "reprotune":
            code = reprotune._cli.main(spec["argv"])
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        traceback.print_exc()
        code = 1
    end_as_python_does(code)


def end_as_python_does(code):
    # What an interpreter does when it ends (Py_FinalizeEx): wait for its non-daemon threads, run
    # the atexit handlers, flush its output; then _exit, skipping the teardown of every module
    # the zygote loaded (about 0.3 s of each forked call). An object left unclosed is not
    # finalized: a file a program never closes keeps what it did not flush.
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF
    else:
        print(code, file=sys.stderr)
        status = 1
    import atexit, threading
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(status)


def serve(connection):
    # A process started by one of the zygote's children (verify's legs): one request, its fds.
    if clients[connection] is not None:  # readable while its process runs: the requester is gone
        pid = clients.pop(connection)
        orphans.add(pid)
        connection.close()
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        return
    try:
        data, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    except OSError:
        data, fds = b"", []
    if not data:
        clients.pop(connection, None)
        connection.close()
        return
    spec = json.loads(data)
    if needs_cold_start(spec):
        for fd in fds:
            os.close(fd)
        connection.send(json.dumps({"cold": True}).encode())
        return
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        child(spec, fds)
    for fd in fds:
        os.close(fd)
    clients[connection] = pid
    connection.send(json.dumps({"started": pid}).encode())


def reap():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        if pid in orphans:
            orphans.discard(pid)
            continue
        owner = next((c for c, p in clients.items() if p == pid), None)
        if owner is None:
            reply({"exited": pid, "code": code})
            continue
        try:
            owner.send(json.dumps({"exited": pid, "code": code}).encode())
        except OSError:
            pass
        del clients[owner]
        owner.close()


reply({"ready": os.getpid()})
while True:
    # A new connection sends its request; one whose process runs sends nothing more, so its
    # becoming readable means the process that asked for the leg has died.
    waiting = list(clients)
    ready, _, _ = select.select([requests, wake_r, listener, *waiting], [], [])
    if wake_r in ready:
        os.read(wake_r, 4096)
        reap()
    if listener in ready:
        connection, _ = listener.accept()
        clients[connection] = None
    for connection in [c for c in ready if c in clients]:  # reap() may have closed some
        serve(connection)
    if requests in ready:
        line = requests.readline()
        if not line:
            break
        spec = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            child(spec)
        reply({"started": pid, "token": spec["token"]})
"""


def needs_cold_start(
    args: tuple[str, ...] | list[str],
    env: dict[str, str],
    base: dict[str, str] | None = None,
    cwd: str | Path | None = None,
) -> bool:
    """Whether a call must start a real interpreter (see the module docstring): ``env`` differs
    from ``base`` (the zygote's start) in a variable read at start, or the call pins CPU kernels:
    with ``--set determinism.cpu_isa=...``, or a command that pins the mode of the run it is
    given before torch loads (``trace``, ``eval``, ``rerun``, ``resume``, ``verify --spot``) naming
    a run (relative to ``cwd``) that ran in a portable mode."""
    base = dict(os.environ) if base is None else base
    args = list(args)
    pins_runs_mode = args[:1] in (["trace"], ["eval"], ["rerun"], ["resume"]) or (
        args[:1] == ["verify"] and "--spot" in args
    )
    return (
        bool(_start_differences(env, base))
        or any("cpu_isa" in arg and not arg.endswith("native") for arg in args)
        or (pins_runs_mode and any(_portable_run(Path(cwd or os.getcwd()) / a) for a in args[1:]))
    )


def _portable_run(path: Path) -> bool:
    """Whether ``path`` is a run directory whose record pins a CPU mode other than native."""
    return recorded_cpu_isa(path) not in (None, "native")


def _start_differences(env: dict[str, str], base: dict[str, str]) -> set[str]:
    """The variables read when an interpreter starts whose values differ between ``env`` and ``base``."""
    keys = {k for k in set(env) | set(base) if k.startswith(COLD_PREFIXES)} - set(WARM_SAFE)
    return {k for k in keys if env.get(k) != base.get(k)}


@dataclass
class WarmProcess:
    """A forked CLI call, as a test sees a subprocess: its pid, its exit code once it ends."""

    pid: int
    stdout_path: Path
    stderr_path: Path
    args: list[str]
    _done: threading.Event = field(default_factory=threading.Event)
    returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(9)

    def result(self) -> subprocess.CompletedProcess[str]:
        stdout = self.stdout_path.read_text(encoding="utf-8", errors="replace")
        stderr = self.stderr_path.read_text(encoding="utf-8", errors="replace")
        for path in (self.stdout_path, self.stderr_path):
            path.unlink(missing_ok=True)
        return subprocess.CompletedProcess(self.args, self.returncode or 0, stdout, stderr)


@dataclass
class ColdProcess(WarmProcess):
    """A call that needed a real interpreter, seen as a forked one is (:func:`start_reprotune`)."""

    popen: subprocess.Popen[bytes] | None = None

    def wait(self, timeout: float | None = None) -> int:
        assert self.popen is not None
        self.returncode = self.popen.wait(timeout)
        return self.returncode

    def poll(self) -> int | None:
        assert self.popen is not None
        self.returncode = self.popen.poll()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def result(self) -> subprocess.CompletedProcess[str]:
        done = super().result()
        self.stdout_path.parent.rmdir()
        return done


class WarmLauncher:
    """The zygote process and the bookkeeping of its children (one per test session)."""

    def __init__(self, overrides: dict[str, str] | None = None) -> None:
        self.env = {**os.environ, **(overrides or {})}
        self._tmp = Path(tempfile.mkdtemp(prefix="reprotune-warm-"))
        self.socket = self._tmp / "zygote.sock"  # where forked processes ask for their legs
        preload = _LAUNCH_MODULES if overrides else ()
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _ZYGOTE,
                __file__,
                str(self.socket),
                json.dumps(preload),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
            cwd=tempfile.gettempdir(),
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._stdin, self._stdout = self._proc.stdin, self._proc.stdout
        self._lock = threading.Lock()
        self._started: dict[str, threading.Event] = {}
        self._pids: dict[str, int] = {}
        self._children: dict[int, WarmProcess] = {}
        self._early: dict[int, int] = {}
        self._count = 0
        first = json.loads(self._stdout.readline())
        assert "ready" in first, first
        threading.Thread(target=self._read, daemon=True).start()
        atexit.register(self.close)

    def _read(self) -> None:
        for line in self._stdout:
            message = json.loads(line)
            with self._lock:
                if "started" in message:
                    self._pids[message["token"]] = message["started"]
                    self._started[message["token"]].set()
                elif "exited" in message:
                    child = self._children.pop(message["exited"], None)
                    if child is None:
                        self._early[message["exited"]] = message["code"]
                    else:
                        child.returncode = message["code"]
                        child._done.set()

    def start(
        self,
        args: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        script: str | None = None,
        module: str = "reprotune",
    ) -> WarmProcess:
        """Fork a child that runs ``reprotune ARGS`` (or ``python SCRIPT ARGS``, ``python -m MODULE
        ARGS``) in ``cwd`` with exactly ``env``."""
        with self._lock:
            self._count += 1
            token = f"{os.getpid()}-{self._count}"
            started = self._started[token] = threading.Event()
        out, err = self._tmp / f"{token}.out", self._tmp / f"{token}.err"
        spec = {
            "argv": args,
            "script": script,
            "module": module,
            "cwd": str(cwd),
            "env": env,
            "stdout": str(out),
            "stderr": str(err),
            "token": token,
        }
        with self._lock:
            self._stdin.write((json.dumps(spec) + "\n").encode())
            self._stdin.flush()
        if not started.wait(60):
            raise RuntimeError("the warm launcher did not start the call")
        with self._lock:
            pid = self._pids.pop(token)
            del self._started[token]
            child = WarmProcess(pid, out, err, [script or module, *args])
            if pid in self._early:  # it ended before we could register it
                child.returncode = self._early.pop(pid)
                child._done.set()
            else:
                self._children[pid] = child
        return child

    def run(
        self,
        args: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        timeout: float,
        script: str | None = None,
        module: str = "reprotune",
    ) -> subprocess.CompletedProcess[str]:
        child = self.start(args, cwd=cwd, env=env, script=script, module=module)
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            _dump_stacks()
            child.kill()
            child.wait(30)
            tail = child.stderr_path.read_text(encoding="utf-8", errors="replace")[-20000:]
            print(f"--- the call timed out; its stderr, with the stacks of every forked process:\n{tail}")
            raise
        return child.result()

    def close(self) -> None:
        if self._proc.poll() is None:
            self._stdin.close()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()


def _dump_stacks() -> None:
    """Ask every process a zygote forked (the timed-out call, its ranks and legs) to write its
    threads' stacks to its stderr (SIGUSR1, faulthandler), and give them a moment to."""
    zygotes = {str(w._proc.pid) for w in _launchers.values()}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] in zygotes:  # the parent's pid
            with contextlib.suppress(OSError):
                os.kill(int(stat.parent.name), signal.SIGUSR1)
    time.sleep(2)


#: Imported by a launcher zygote (one started with :data:`ZYGOTE_KEYS` of its own): torchrun's.
#: (Not ``torch.distributed.run`` itself, which the child runs as ``__main__``.)
_LAUNCH_MODULES = (
    "torch.distributed.launcher.api",
    "torch.distributed.elastic.multiprocessing.subprocess_handler",
)
_launchers: dict[tuple[tuple[str, str], ...], WarmLauncher] = {}
_launcher_lock = threading.Lock()


def launcher(env: dict[str, str] | None = None) -> WarmLauncher | None:
    """The session's launcher for a call with ``env``, started on first use: the session's own, or
    one started with the call's :data:`ZYGOTE_KEYS` where those are all it differs in at start;
    None where it differs in more (the call needs a real interpreter)."""
    env = dict(os.environ) if env is None else env
    differing = _start_differences(env, dict(os.environ))
    if not differing <= set(ZYGOTE_KEYS) or any(k not in env for k in differing):
        return None
    key = tuple(sorted((k, env[k]) for k in differing))
    with _launcher_lock:
        found = _launchers.get(key)
        if found is None or found._proc.poll() is not None:
            found = _launchers[key] = WarmLauncher(dict(key))
        return found


def fork_legs_here(monkeypatch: Any) -> bool:
    """In this process (a test that runs verify in-process): verify's legs forked from the session's
    zygote, as they are in a process the zygote forked (tests/inject/warm_legs.py), for the rest of
    the test (``monkeypatch``); False (legs stay real interpreters) where there is no zygote."""
    import warm_legs

    from reprotune._proof import processes

    warm = None if os.environ.get("REPROTUNE_TESTS_COLD") else launcher()
    if warm is None:
        return False
    monkeypatch.setenv(warm_legs.ENV, str(warm.socket))
    monkeypatch.setattr(processes, "subprocess", warm_legs._Subprocess())  # every leg starts there
    return True


def run_reprotune(
    args: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 600, cold: bool = False
) -> subprocess.CompletedProcess[str]:
    """``python -m reprotune ARGS`` in ``cwd`` with ``env``: forked from the warm zygote, or a real
    interpreter when the call needs one (:func:`needs_cold_start`, ``cold``)."""
    return _call(["-m", "reprotune"], args, cwd=cwd, env=env, timeout=timeout, cold=cold)


def start_reprotune(args: list[str], *, cwd: Path, env: dict[str, str]) -> WarmProcess:
    """``python -m reprotune ARGS`` started and not waited for (a test that signals or races it):
    forked from the warm zygote, or a real interpreter where the call needs one."""
    warm = _warm_for(args, env, cwd)
    if warm is not None:
        return warm.start(list(args), cwd=cwd, env=env)
    outputs = Path(tempfile.mkdtemp(prefix="reprotune-cold-"))
    out, err = outputs / "stdout", outputs / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        popen = subprocess.Popen(
            [sys.executable, "-m", "reprotune", *args], cwd=cwd, env=env, stdout=stdout, stderr=stderr
        )
    return ColdProcess(popen.pid, out, err, ["-m", "reprotune", *args], popen=popen)


def run_script(
    script: str, args: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT ARGS`` in ``cwd`` with ``env`` (a user's training script): forked from the warm
    zygote as ``run_reprotune`` forks the CLI, or a new interpreter where the call needs one."""
    return _call([script], args, cwd=cwd, env=env, timeout=timeout)


def run_module(
    module: str, args: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` (a ``torchrun`` launch: ``torch.distributed.run``) in ``cwd`` with
    ``env``: forked from a warm zygote (whose children fork the launch's ranks too, see
    tests/inject/warm_legs.py), or a new interpreter where the call needs one."""
    return _call(["-m", module], args, cwd=cwd, env=env, timeout=timeout)


def _warm_for(args: list[str], env: dict[str, str], cwd: Path, *, cold: bool = False) -> WarmLauncher | None:
    """The launcher to fork a call from, or None where it needs a real interpreter."""
    warm = None if cold or os.environ.get("REPROTUNE_TESTS_COLD") else launcher(env)
    return None if warm is None or needs_cold_start(args, env, warm.env, cwd) else warm


def _call(
    program: list[str],
    args: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    cold: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python PROGRAM ARGS`` (``PROGRAM``: ``-m MODULE`` or ``SCRIPT``), forked or started."""
    warm = _warm_for(args, env, cwd, cold=cold)
    if warm is None:
        command = [sys.executable, *program, *args]
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if program[0] == "-m":
        return warm.run(list(args), cwd=cwd, env=env, timeout=timeout, module=program[1])
    return warm.run(list(args), cwd=cwd, env=env, timeout=timeout, script=program[0])
