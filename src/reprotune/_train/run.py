"""``reprotune run`` and ``reprotune resume``: where a run starts.

A plain run goes straight to its life (``_train.attempt``: claim the directory, build the setup,
train, record the end). Under torchrun ``_train.dist_run`` joins the process group first: rank 0
then goes the same way, every other rank follows it. The distributed modules are loaded only
then, so a plain run neither calls nor imports them.

The run directory layout is in docs/run-directory.md (file names: ``_run.layout``).
"""

from __future__ import annotations

from pathlib import Path

from reprotune._config.schema import ExperimentConfig
from reprotune._train.attempt import build_trackers, resume_attempt, start_run
from reprotune._train.options import DEFAULT_OPTIONS, RunOptions, RunResult
from reprotune._train.strategy import under_torchrun

__all__ = ["RunOptions", "RunResult", "build_trackers", "resume_run", "run_experiment"]


def run_experiment(cfg: ExperimentConfig, options: RunOptions = DEFAULT_OPTIONS) -> RunResult:
    """Run the experiment ``cfg`` in a new run directory. See the module docstring.

    Everything that can be checked before training (the data and its columns, the split, the
    base model, the LoRA target modules) is checked before the directory is made, so bad input
    leaves nothing behind.

    Under torchrun every rank trains; rank 0 alone writes the run directory (docs/distributed.md).

    Raises:
        InputError: bad data, model or config (found before the directory exists where it can
            be; later, the record says failed), or another process writes the directory.
    """
    if not under_torchrun():
        return start_run(cfg, options)
    # Only under torchrun: a plain run never loads the distributed modules (tests/train/test_run.py).
    from reprotune._train.dist_run import run_on_ranks

    return run_on_ranks(cfg, options)


def resume_run(run_dir: Path, options: RunOptions = DEFAULT_OPTIONS) -> RunResult:
    """Continue the unfinished run in ``run_dir`` from its latest valid checkpoint (under torchrun,
    at the world size it trained at unless ``options.allow_world_size_change``)."""
    if not under_torchrun():
        return resume_attempt(run_dir, options)
    from reprotune._train.dist_run import resume_on_ranks  # only under torchrun, as above

    return resume_on_ranks(run_dir, options)
