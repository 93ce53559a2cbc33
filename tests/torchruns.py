"""``torchrun`` launches of ``python -m reprotune`` for the distributed tests: one launch, run to
its end, with its run directory and output."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tinyrun import TinyProject
from warm import run_module

#: The distributed tests' training: 8 optimizer steps of 4 global micro-batches of 2 rows (8 rows
#: a step, the same rows at every world size), a checkpoint every 4 steps, validation at 4 and 8.
TRAIN = {
    "batch_size": 2,
    "grad_accum_steps": 4,
    "max_steps": 8,
    "save_every": 4,
    "eval_every": 4,
    "learning_rate": 1.0e-2,
}
QUIET = ("--no-progress", "--no-tracking")


@dataclass(frozen=True)
class Launch:
    """One finished ``torchrun`` launch: its run directory and what it printed."""

    run_dir: Path
    returncode: int
    output: str


def launch(project: TinyProject, nproc: int, *args: str, env: dict[str, str] | None = None) -> Launch:
    """``torchrun --standalone --nproc_per_node NPROC -m reprotune ARGS`` in the project directory:
    the launcher and its ranks forked from a warm zygote started at ``OMP_NUM_THREADS=1`` (tests/warm.py),
    or real interpreters where the call needs them.

    ``OMP_NUM_THREADS=1`` is set for every launch (torchrun sets it only for more than one process),
    so launches at world sizes 1 and 2 run in the same environment.
    """
    command = ["--standalone", "--nproc_per_node", str(nproc), "-m", "reprotune", *args]
    full_env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "OMP_NUM_THREADS": "1", **(env or {})}
    done = run_module("torch.distributed.run", command, cwd=project.root, env=full_env, timeout=600)
    run_dir = next((Path(args[i + 1]) for i, a in enumerate(args) if a == "--run-dir"), Path(args[-1]))
    return Launch(project.root / run_dir, done.returncode, done.stdout + done.stderr)


def completed(result: Launch) -> Launch:
    assert result.returncode == 0, result.output[-6000:]
    return result
