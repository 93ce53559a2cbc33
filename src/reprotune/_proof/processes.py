"""The processes of ``reprotune verify``'s legs: ``python -m reprotune ...`` in a fresh process (or
a fresh torchrun launch when verify itself runs under torchrun), logged into the verification's
log, one at a time or several side by side."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from reprotune._errors import RunFailedError

# Variables torchrun sets for its workers: a leg launched from a verify under torchrun is a new
# torchrun launch of its own, which must not inherit them.
_TORCHRUN_ENV = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
)  # fmt: skip


def launch_world_size() -> int:
    """The world size verify was launched at: torchrun's ``WORLD_SIZE``, else 1."""
    if not os.environ.get("TORCHELASTIC_RUN_ID"):
        return 1
    return max(1, int(os.environ.get("WORLD_SIZE", "1")))


def _command(args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``python -m reprotune ARGS``, or under torchrun a fresh ``torchrun --standalone`` launch of
    it at the same number of processes; and its environment."""
    env = {k: v for k, v in os.environ.items() if k != "REPROTUNE_KILL_AT"}
    size = launch_world_size()
    if size == 1:
        return [sys.executable, "-m", "reprotune", *args], env
    env = {k: v for k, v in env.items() if k not in _TORCHRUN_ENV and not k.startswith("TORCHELASTIC_")}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={size}"]
    return [*launch, "-m", "reprotune", *args], env


def run_logged(args: Sequence[str], log: Path) -> float:
    """Run ``python -m reprotune ARGS`` in a fresh process (a fresh torchrun launch under torchrun),
    its output into ``log``; return its wall time."""
    command, env = _command(args)
    with open(log, "ab") as out:
        _header(out, command)
        started = time.perf_counter()
        code = subprocess.call(command, stdout=out, stderr=out, env=env)
        wall = time.perf_counter() - started
    if code != 0:
        raise _failed(args, code, log.read_bytes(), log)
    return wall


def run_together(commands: Sequence[Sequence[str]], log: Path) -> list[float]:
    """:func:`run_logged` for several commands at once, each writing its own log next to ``log``;
    once all have ended their logs are appended to ``log`` in order, then the first failure raises.
    Each wall time runs from the common start to that process's end."""
    started, running = time.perf_counter(), []
    for number, args in enumerate(commands):
        command, env = _command(args)
        part = log.with_name(f"{log.name}.{number}")
        with open(part, "wb") as out:
            _header(out, command)
            running.append((subprocess.Popen(command, stdout=out, stderr=out, env=env), part))
    walls: dict[int, float] = {}
    while len(walls) < len(running):
        for number, (process, _) in enumerate(running):
            if number not in walls and process.poll() is not None:
                walls[number] = time.perf_counter() - started
        time.sleep(0.05)
    failure = None
    for (process, part), args in zip(running, commands, strict=True):
        text = part.read_bytes()
        with open(log, "ab") as out:
            out.write(text)
        part.unlink()
        if process.returncode != 0 and failure is None:
            failure = _failed(args, process.returncode, text, log)
    if failure is not None:
        raise failure
    return [walls[number] for number in range(len(running))]


def _header(out: BinaryIO, command: Sequence[str]) -> None:
    out.write(f"$ {' '.join(command[list(command).index('reprotune') - 1 :])}\n".encode())
    out.flush()


def _failed(args: Sequence[str], code: int, output: bytes, log: Path) -> RunFailedError:
    tail = output.decode("utf-8", errors="replace").splitlines()[-15:]
    return RunFailedError(
        f"`reprotune {' '.join(args)}` failed with exit code {code}:\n" + "\n".join(tail),
        source=str(log),
        fix="fix the run itself first (try `reprotune run` on the config)",
    )
