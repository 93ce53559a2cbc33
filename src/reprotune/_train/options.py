"""What ``reprotune run`` and ``resume`` are asked (:class:`RunOptions`) and give back
(:class:`RunResult`); ``_train.attempt`` runs them, ``_train.dist_run`` for a distributed run's
other ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprotune._run.record import RunRecord, Status
from reprotune._train.loop import StepHook


@dataclass(frozen=True)
class RunOptions:
    """How to run, beyond what the config says.

    Args:
        run_dir: where to write; default ``runs/<run-id>`` under the current directory.
        progress: show a progress bar on stderr.
        tracking: mirror to the trackers the config enables (False: none, e.g. in verify's legs).
        stop_after_step: stop after this optimizer step as if interrupted (verify's resume leg),
            leaving the run resumable.
        restore_rng_on_resume: False only for verify's negative control of the resume leg.
        manifest: train on this split manifest instead of the config's split (rerun uses the
            recorded run's ``split.json``; the config, and so its hash, stay as recorded).
        hooks: extra step hooks, called after reprotune's own at the end of every step (the
            benchmarks time steps with one). Under torchrun every rank must be given hooks (or
            none) alike: rank 0's hooks decide when the run stops, and the other ranks follow.
        code_dir: the directory whose git state is recorded.
        allow_world_size_change: let a distributed run resume at another world size than it
            trained at (``--allow-world-size-change``); the change is recorded.
        train_lock: train only while holding an exclusive lock on this file (verify's controls,
            started side by side, train in turns: ``_train.turn``); None: no lock.
        allow_code_drift: a resume goes on when the code differs from the run's (noted on the
            attempt as ``code_drift``) instead of being refused (``verify --spot
            --allow-code-drift`` replays a run's intervals with the code here).
    """

    run_dir: Path | None = None
    progress: bool = True
    tracking: bool = True
    stop_after_step: int | None = None
    restore_rng_on_resume: bool = True
    manifest: Path | None = None
    hooks: Sequence[StepHook] = ()
    code_dir: Path = field(default_factory=Path.cwd)
    allow_world_size_change: bool = False
    train_lock: Path | None = None
    allow_code_drift: bool = False


@dataclass(frozen=True)
class RunResult:
    """What a finished (or deliberately stopped) run produced."""

    run_dir: Path
    record: dict[str, Any]
    status: Status
    steps_done: int
    adapter_sha256: str | None
    final_val_loss: float | None
    step_times_s: tuple[float, ...] = ()
    """This attempt's wall time per optimizer step, in step order (the benchmarks read it)."""
    checkpoint_times_s: tuple[float, ...] = ()
    """This attempt's wall time per checkpoint saved (included in the step times)."""
    main: bool = True
    """False on a distributed run's ranks other than 0, which write nothing (``record`` is empty)."""
    typed: RunRecord | None = None
    """``record`` as typed, frozen data (None on a distributed run's ranks other than 0)."""


#: The options of a plain ``reprotune run``.
DEFAULT_OPTIONS = RunOptions()
