"""Running a user's command as one leg of ``reprotune verify --command``: in a fresh process of
its own group (started and stopped as every leg is: ``_proof.processes``), its output appended to
the verification log, bounded in time after the reference (a leg past its bound is stopped as a
whole, and the legs after it are not run). Never imports torch."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from reprotune._errors import InputError, RunFailedError
from reprotune._proof.legs import LegNotRun
from reprotune._proof.processes import start_leg, wait_or_stop
from reprotune._run.layout import RunLayout
from reprotune.integrations import controls as control_vars
from reprotune.integrations.controls import Controls

#: Where each leg's Trainer writes its own checkpoints, inside the leg's run directory.
TRAINER_OUTPUT = "trainer-output"
_CONTROL_VARIABLES = (*control_vars.UNRECORDED_VARIABLES, control_vars.PERTURB_DATA_SEED)


def parse_command(command: str) -> list[str]:
    """Split ``--command`` as a POSIX shell would (no shell runs it).

    Raises:
        InputError: the command is empty or its quotes do not close.
    """
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise InputError(
            f"cannot split the command {command!r}: {exc}",
            source="--command",
            fix='quote the whole command once, e.g. --command "python train.py --epochs 1"',
        ) from None
    if not argv:
        raise InputError("the command is empty", source="--command", fix='e.g. --command "python train.py"')
    return argv


class LegTimedOut(RunFailedError):
    """A leg ran past its time and was stopped."""


#: A leg after the reference may take this many times the reference's wall time (at least
#: :data:`MIN_LEG_TIMEOUT_S`) before it is stopped as one that cannot finish: a rank waiting
#: forever on another that stopped must not hold verify forever.
LEG_TIMEOUT_FACTOR = 4.0
MIN_LEG_TIMEOUT_S = 300.0


@dataclass
class Runner:
    """Runs the user's command in fresh processes, output appended to the verification log.
    ``timeout_s`` (set from the reference leg's wall time) bounds every later leg."""

    argv: Sequence[str]
    log: Path
    cwd: Path
    progress: Callable[[str], None]
    timeout_s: float | None = None
    timeout_why: str = ""
    timed_out: str | None = None
    """The leg that ran past its time: the legs after it are not run (each would wait as long)."""
    tool: str = "verify"
    """Who runs the command (``verify``, or ``trace`` for its one run): its progress lines' prefix."""

    def refuse_after_timeout(self) -> None:
        """Raise :class:`LegNotRun` once a leg ran past its time: each after it would wait as long."""
        if self.timed_out is not None:
            raise LegNotRun(
                f"not run: the {self.timed_out} leg ran past its time",
                source=str(self.log),
                fix="see verify.log",
            )

    def _timeout_text(self) -> str:
        """Why a leg past the timeout is stopped, and what usually holds it, for this command."""
        under_torchrun = any("torchrun" in part or "torch.distributed.run" in part for part in self.argv)
        hint = (
            "under torchrun this is most often a rank waiting for another that stopped (a stop or a "
            "negative control applied on one rank only)"
            if under_torchrun
            else "the script hung, or waits for something the reference did not"
        )
        return (f" ({self.timeout_why})" if self.timeout_why else "") + f": stopped; {hint}"

    def leg(self, name: str, controls: Controls, *, label: str | None = None) -> Path:
        """Run the command for one leg; return its run directory (absolute)."""
        assert controls.run_dir is not None
        self.refuse_after_timeout()
        run_dir = controls.run_dir.resolve()
        controls = replace(controls, run_dir=run_dir, output_dir=run_dir / TRAINER_OUTPUT)
        self.progress(f"{self.tool}: {label or name} ...")
        env = {k: v for k, v in os.environ.items() if k not in _CONTROL_VARIABLES}
        env.update(controls.to_env())
        shown = " ".join(f"{k}={v}" for k, v in sorted(controls.to_env().items()))
        with open(self.log, "ab") as out:
            out.write(f"$ {shown} {shlex.join(self.argv)}\n".encode())
            out.flush()
            started = time.perf_counter()
            try:
                process = start_leg(self.argv, out, env, cwd=self.cwd)
            except OSError as exc:
                raise InputError(
                    f"cannot run the command {self.argv[0]!r}: {exc.strerror or exc}",
                    source="--command",
                    fix='give a command that runs from this directory, e.g. --command "python train.py"',
                ) from None
            try:
                code = _wait(process, self.timeout_s, name, self._timeout_text())
            except LegTimedOut:
                self.timed_out = name
                raise
            finally:
                wall = time.perf_counter() - started
        if self.timeout_s is None and name == "reference":
            self.timeout_s = max(MIN_LEG_TIMEOUT_S, LEG_TIMEOUT_FACTOR * wall)
            times = f"{LEG_TIMEOUT_FACTOR:g}x the reference's {wall:.0f} s"
            self.timeout_why = (
                times if self.timeout_s > MIN_LEG_TIMEOUT_S else f"the least a leg gets; {times} is less"
            )
        if code != 0:
            tail = self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
            whose = f"the {name} leg's command" if self.tool == "verify" else "the command"
            raise RunFailedError(
                f"{whose} failed with exit code {code}:\n" + "\n".join(tail),
                source=str(self.log),
                fix="read the script's last lines above (a reprotune refusal there gives its own fix); a "
                "script that fails on its own must be fixed first",
            )
        if not RunLayout(run_dir).is_run_dir():
            if name == "reference":  # the command itself: bad input
                raise InputError(
                    f"the command wrote no run directory at {run_dir}: its Trainer has no ReprotuneCallback",
                    source="--command",
                    fix="give the script's Trainer a reprotune ReprotuneCallback (docs/integrations.md)",
                )
            raise RunFailedError(  # after a reference that wrote one: this leg's failure
                f"the {name} leg's command wrote no run directory at {run_dir}, though the reference's did",
                source=str(self.log),
                fix="see verify.log: the script must give every run's Trainer the ReprotuneCallback",
            )
        return run_dir


def _wait(process: subprocess.Popen[bytes], timeout_s: float | None, name: str, why: str) -> int:
    """The leg's exit code; past ``timeout_s`` it is stopped (``processes.stop_legs``: SIGTERM to its
    process group, which torchrun passes on to its workers; SIGKILL a grace later) and the leg fails,
    saying ``why``. Verify's own stop (Ctrl-C, SIGTERM) stops the leg the same way."""
    code = wait_or_stop(process, timeout_s)
    if code is None:
        raise LegTimedOut(
            f"the {name} leg did not finish within {timeout_s:.0f} s{why}",
            source="--command",
            fix="see verify.log; the callback applies verify's stop and controls on every rank, so check "
            "that every rank's Trainer has a ReprotuneCallback",
        )
    return code
