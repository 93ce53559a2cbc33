"""Issue 16, items 1 and 6: one writer per run directory, and SIGTERM/SIGHUP end a run as Ctrl-C does.

Real processes (forked from the tests' warm zygote, tests/warm.py, each with its own pid), real
``flock``: a second ``resume`` or ``run`` on a directory another process
writes is refused (exit 2) naming that process; two runs started together leave one whole run; a
lock left by a killed process is taken over with a note; a SIGTERM'd run is ``interrupted``, its
ledger whole, and ``resume`` finishes it bitwise identical to an uninterrupted run.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from reprotune._cli import main
from reprotune._config.loading import load_config
from reprotune._errors import InputError, Interrupted
from reprotune._jsonio import sha256_file
from reprotune._proof.compare import compare_runs
from reprotune._run import lock as lock_module
from reprotune._run.layout import RunLayout
from reprotune._run.ledger import read_ledger
from reprotune._run.lock import lock_run_dir, read_holder
from reprotune._run.record import load_record
from reprotune._train.loop import StepEnd
from reprotune._train.run import RunOptions, run_experiment
from tinyrun import TinyProject
from warm import WarmProcess

QUIET = ("--no-progress", "--no-tracking")
HOLD = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from reprotune._run.lock import lock_run_dir\n"
    "lock = lock_run_dir(Path(sys.argv[1]), report=print)\n"
    "print('held', flush=True)\n"
    "if sys.argv[2] == 'exit':\n"
    "    import os; os._exit(0)  # dies holding it: no release, as a SIGKILL would\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Any]:
    """``holder(run_dir)``: another process that holds the lock of ``run_dir`` until the test ends."""
    procs: list[subprocess.Popen[str]] = []

    def hold(run_dir: Path, how: str = "sleep") -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(run_dir), how], stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        if how == "exit":
            proc.wait(timeout=60)
        return proc

    yield hold
    for proc in procs:
        proc.kill()
        proc.wait()


def _stopped_run(project: TinyProject, run_dir: Path) -> None:
    """A run of the base config stopped after step 2, in this process (resumable)."""
    cfg = load_config(project.config(), [])
    with torch.random.fork_rng():
        run_experiment(cfg, RunOptions(run_dir=run_dir, progress=False, tracking=False, stop_after_step=2))


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_a_second_writer_is_refused_naming_the_holder(
    project: TinyProject, tmp_path: Path, holder: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """While another process holds a run directory, resume and run exit 2 naming its pid and host,
    and change nothing in it."""
    run_dir = tmp_path / "run"
    _stopped_run(project, run_dir)
    before = _snapshot(run_dir)
    proc = holder(run_dir)
    assert main(["resume", str(run_dir), *QUIET]) == 2
    err = capsys.readouterr().err
    assert f"being written by another process (pid {proc.pid} on host {socket.gethostname()}" in err
    assert "one writer" in err
    # A new run into it while it is being written: the holder is named, not "continue it with
    # resume" (a fix the holder's lock then refuses).
    assert main(["run", str(project.config()), "--run-dir", str(run_dir), *QUIET]) == 2
    err = capsys.readouterr().err
    assert f"being written by another process (pid {proc.pid}" in err and "continue it with" not in err
    after = _snapshot(run_dir)
    assert after.pop(".writer.lock")  # the holder's
    assert after == before

    fresh = tmp_path / "fresh"
    holder(fresh)
    assert main(["run", str(project.config()), "--run-dir", str(fresh), *QUIET]) == 2
    assert "being written by another process" in capsys.readouterr().err
    assert [p.name for p in fresh.iterdir()] == [".writer.lock"]  # nothing was written


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_note(tmp_path: Path, holder: Any) -> None:
    """A lock file whose holder died (no release) is taken over, and the note names the dead holder."""
    run_dir = tmp_path / "run"
    dead = holder(run_dir, "exit")
    assert read_holder(RunLayout(run_dir).lock)["pid"] == dead.pid
    notes: list[str] = []
    lock = lock_run_dir(run_dir, report=notes.append)
    try:
        assert notes == [
            f"note: took over the stale lock {RunLayout(run_dir).lock} of pid {dead.pid} on host "
            f"{socket.gethostname()}, which no longer runs"
        ]
        assert read_holder(RunLayout(run_dir).lock)["pid"] == os.getpid()
        assert lock.locked
    finally:
        lock.release()
    assert not RunLayout(run_dir).lock.exists()


def test_where_flock_does_not_work_it_says_so_and_checks_the_holder(
    tmp_path: Path, holder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a filesystem without flock (simulated: flock raises ENOLCK, as NFS without a lock daemon
    does) a warning says so; a holder recorded as a live process on this host is still refused."""

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        monkeypatch.setattr(lock_module.fcntl, "flock", no_locks)
        run_dir = tmp_path / "run"
        notes: list[str] = []
        lock = lock_run_dir(run_dir, report=notes.append)
        assert not lock.locked
        assert len(notes) == 1 and "does not support file locks (flock)" in notes[0]
        lock.release()
        RunLayout(run_dir).lock.write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname()}))
        with pytest.raises(InputError, match=f"pid {sleeper.pid} on host"):
            lock_run_dir(run_dir, report=notes.append)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_two_runs_started_together_leave_one_whole_run(project: TinyProject, tmp_path: Path) -> None:
    """Two `run --run-dir D` at once: one completes, the other exits 2; the ledger has each step once."""
    run_dir = tmp_path / "run"
    # The config written once: written again while the first run read it, that run read it empty.
    config = str(project.config())
    procs = [project.start_cli("run", config, "--run-dir", str(run_dir), *QUIET) for _ in "ab"]
    results = [(p.wait(timeout=600), p.result().stderr) for p in procs]
    assert sorted(code for code, _ in results) == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "another process" in loser or "holds" in loser
    steps = [
        e.fields["step"]
        for e in read_ledger(run_dir / "ledger.jsonl").entries()
        if e.fields["kind"] == "train"
    ]
    assert steps == list(range(1, 9))
    assert load_record(run_dir / "record.json")["status"] == "completed"


def _wait_for_train_lines(ledger: Path, n: int, proc: WarmProcess) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before the test could stop it"
        if ledger.is_file() and ledger.read_bytes().count(b'"kind":"train"') >= n:
            return
        time.sleep(0.02)
    raise AssertionError("the run never reached its steps")


@pytest.mark.slow
def test_resume_while_training_is_refused_and_sigterm_leaves_a_resumable_run(
    project: TinyProject, tmp_path: Path
) -> None:
    """A run is frozen (SIGSTOP) mid-training: resume and run on it exit 2 naming it. Then SIGTERM:
    status interrupted, ledger whole, exit 143; resume finishes it IDENTICAL to an uninterrupted run."""
    config = project.config("long.yaml", train={"max_steps": 40, "save_every": 5, "eval_every": 20})
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    project.run_cli("run", str(config), "--run-dir", str(reference), *QUIET)
    proc = project.start_cli("run", str(config), "--run-dir", str(run_dir), *QUIET)
    try:
        _wait_for_train_lines(run_dir / "ledger.jsonl", 1, proc)
        os.kill(proc.pid, signal.SIGSTOP)
        refused = project.run_cli("resume", str(run_dir), *QUIET, check=False)
        assert refused.returncode == 2 and f"pid {proc.pid} on host" in refused.stderr, refused.stderr
        again = project.run_cli("run", str(config), "--run-dir", str(run_dir), *QUIET, check=False)
        assert again.returncode == 2 and f"pid {proc.pid} on host" in again.stderr, again.stderr
        os.kill(proc.pid, signal.SIGCONT)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    assert "interrupted by SIGTERM" in proc.result().stderr
    record = load_record(run_dir / "record.json")
    assert record["status"] == "interrupted"
    assert record["error"] == {"type": "Interrupted", "message": "stopped by SIGTERM"}
    ledger = read_ledger(run_dir / "ledger.jsonl")  # strict: no partial line
    train = [e.fields["step"] for e in ledger.entries() if e.fields["kind"] == "train"]
    assert train == list(range(1, record["timings"]["steps_done"] + 1))
    assert not (run_dir / ".writer.lock").exists()

    project.run_cli("resume", str(run_dir), *QUIET)
    assert (run_dir / "ledger.jsonl").read_bytes() == (reference / "ledger.jsonl").read_bytes()
    adapter = Path("adapter") / "adapter_model.safetensors"
    assert sha256_file(run_dir / adapter) == sha256_file(reference / adapter)
    assert str(compare_runs(reference, run_dir).verdict) == "IDENTICAL"


class _SendSignal:
    """A step hook that sends this process a signal after a given step."""

    def __init__(self, signum: int, after_step: int) -> None:
        self.signum, self.after_step = signum, after_step

    def on_step_end(self, end: StepEnd) -> None:
        if end.step == self.after_step:
            os.kill(os.getpid(), self.signum)


def test_sighup_interrupts_the_run_and_the_old_handler_comes_back(
    project: TinyProject, tmp_path: Path
) -> None:
    """SIGHUP during a run: status interrupted with the ledger through that step; handlers restored.
    SIGHUP's default action is put in force first: a suite started under `nohup` inherits it
    ignored, and an ignored SIGHUP is left ignored (tests/run/test_signals.py)."""
    inherited = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        before = signal.getsignal(signal.SIGHUP), signal.getsignal(signal.SIGTERM)
        cfg = load_config(project.config(), [])
        options = RunOptions(
            run_dir=tmp_path / "run", progress=False, tracking=False, hooks=[_SendSignal(signal.SIGHUP, 3)]
        )
        with torch.random.fork_rng(), pytest.raises(Interrupted) as caught:
            run_experiment(cfg, options)
        assert caught.value.signum == signal.SIGHUP
        assert (signal.getsignal(signal.SIGHUP), signal.getsignal(signal.SIGTERM)) == before
    finally:
        signal.signal(signal.SIGHUP, inherited)
    record = load_record(tmp_path / "run" / "record.json")
    assert record["status"] == "interrupted" and record["error"]["message"] == "stopped by SIGHUP"
    steps = [e.fields["step"] for e in read_ledger(tmp_path / "run" / "ledger.jsonl").entries()]
    assert max(steps) == 3


class _SignalInsideDel:
    """A step hook that, after a given step, has the garbage collector run a ``__del__`` that
    sends this process SIGTERM: Python runs the handler inside that ``__del__`` and drops the
    exception it raises ("Exception ignored in ..."), as happened once in the wild (a regex
    object's ``__del__`` during model loading) and let the run train on to ``completed``."""

    def __init__(self, after_step: int) -> None:
        self.after_step = after_step

    def on_step_end(self, end: StepEnd) -> None:
        if end.step == self.after_step:
            _Kills()  # made and dropped at once: its __del__ runs here


class _Kills:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs at the next bytecodes, still inside __del__
            pass


def test_a_signal_whose_exception_a_del_drops_still_stops_the_run(
    project: TinyProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SIGTERM taken inside a __del__ (its exception dropped there) stops the run before the
    next step: status interrupted, the ledger through that step."""
    dropped: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)
    cfg = load_config(project.config(), [])
    options = RunOptions(
        run_dir=tmp_path / "run", progress=False, tracking=False, hooks=[_SignalInsideDel(2)]
    )
    with torch.random.fork_rng(), pytest.raises(Interrupted) as caught:
        run_experiment(cfg, options)
    assert caught.value.signum == signal.SIGTERM
    assert [type(d.exc_value) for d in dropped] == [Interrupted]  # dropped where it was raised
    record = load_record(tmp_path / "run" / "record.json")
    assert record["status"] == "interrupted" and record["error"]["message"] == "stopped by SIGTERM"
    steps = [e.fields["step"] for e in read_ledger(tmp_path / "run" / "ledger.jsonl").entries()]
    assert max(steps) == 2
