"""Reading back a distributed run's checkpoint: the same files as any checkpoint, holding the whole
trainable and optimizer state (gathered on rank 0) and every rank's RNG state
(:class:`reprotune._run.checkpoint.RankStates`). Rank 0 reads it and hands each rank its part.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from reprotune._determinism.rng import ranks_rng_from_tensors
from reprotune._errors import InputError
from reprotune._run.checkpoint import CheckpointState, RankStates, load_states
from reprotune._run.checkpoint_files import STATE_FILE


@dataclass(frozen=True)
class RankCheckpoint:
    """A distributed checkpoint, read: where the run stood, what it held, the scheduler's state."""

    path: Path
    state: CheckpointState
    ranks: RankStates
    scheduler: dict[str, Any]
    scaler: dict[str, Any] | None


def read_rank_checkpoint(path: Path) -> RankCheckpoint:
    """Read the checkpoint at ``path`` (verified by ``verify_checkpoint``) written by a distributed run.

    Raises:
        InputError: it was written by a single process, or ``optimizer.pt`` holds other objects
            than tensors and plain data.
    """
    state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    distributed = state.get("distributed")
    if not isinstance(distributed, dict):
        raise InputError(
            f"{path} was written by a single process; it restores only without torchrun",
            source=str(path / STATE_FILE),
            fix="resume the run without torchrun: `reprotune resume RUN_DIR`",
        )
    weights: dict[str, torch.Tensor] = load_file(str(path / "trainable.safetensors"))
    states = load_states(path)
    meta = json.loads((path / "rng.json").read_text(encoding="utf-8"))
    rng = ranks_rng_from_tensors(load_file(str(path / "rng.safetensors")), meta)
    return RankCheckpoint(
        path=path,
        state=CheckpointState(
            step=int(state["step"]),
            epoch=int(state["epoch"]),
            position=(int(state["position"][0]), int(state["position"][1])),
        ),
        ranks=RankStates(distributed=distributed, weights=weights, optimizer=states["optimizer"], rng=rng),
        scheduler=states["scheduler"],
        scaler=states["scaler"],
    )
