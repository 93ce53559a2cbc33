"""Checkpoints of a distributed run, saved and restored by every rank together.

Saving: every rank hands its RNG state to rank 0, the trainable weights and the optimizer state are
gathered whole (collectives under FSDP), and rank 0 writes one ordinary checkpoint directory
(:class:`reprotune._run.checkpoint.RankStates`): one format for DDP and FSDP and every world size.
Restoring: rank 0 picks the newest checkpoint that verifies, reads, whose weights have this
model's names and shapes, and which the run's ledger reaches (else the previous one, as a
one-process resume does); the weights and the
optimizer state are broadcast into every rank's (sharded) parameters, each rank gets its own RNG
state back, and the scheduler state goes to all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reprotune._determinism.rng import capture_rng_state, restore_rng_state
from reprotune._run.checkpoint import (
    CheckpointState,
    RankCheckpoint,
    RankStates,
    read_rank_checkpoint,
    refused_warning,
    save_checkpoint,
    unrestorable_warning,
    valid_checkpoints,
)
from reprotune._run.checkpoint_shapes import check_state_shapes, trainable_shapes
from reprotune._train.distributed import DistContext, decided_by_main, gather_objects, scatter_objects
from reprotune._train.setup import Setup
from reprotune._train.sharding import full_optimizer_state, full_trainable_state, load_full_state
from reprotune._train.strategy import seed_generators


def _context(setup: Setup) -> DistContext:
    if setup.dist is None:
        raise ValueError("a distributed checkpoint needs a distributed setup")
    return setup.dist


def _train_module(setup: Setup) -> Any:
    return setup.train_module if setup.train_module is not None else setup.model


def save_distributed_checkpoint(
    setup: Setup, directory: Path | None, state: CheckpointState, *, keep: int
) -> Path | None:
    """Every rank calls this at the same step; rank 0 writes the checkpoint into ``directory``.

    Returns:
        The checkpoint's path on rank 0; None on the other ranks.
    """
    ctx = _context(setup)
    weights = full_trainable_state(setup.model, ctx)
    optimizer = full_optimizer_state(_train_module(setup), setup.optimizer)
    rng = gather_objects(ctx, capture_rng_state())
    if not ctx.is_main:
        return None
    assert directory is not None and rng is not None
    return save_checkpoint(
        directory,
        state,
        model=setup.model,
        optimizer=setup.optimizer,
        scheduler=setup.scheduler,
        scaler=setup.scaler,
        keep=keep,
        ranks=RankStates(distributed=ctx.describe(), weights=weights, optimizer=optimizer, rng=list(rng)),
    )


@dataclass(frozen=True)
class Restored:
    """What a distributed restore found, as every rank learns it: the checkpoint's name, where
    the run stood, whether every rank's RNG state came back, and the world size the checkpoint
    was saved at (None: it does not say), which a resume at another world size records."""

    name: str
    state: CheckpointState
    rng_restored: bool
    world_size: int | None = None


def restore_distributed(
    setup: Setup,
    directory: Path | None,
    *,
    restore_rng: bool,
    report: Callable[[str], None],
    fits: Callable[[CheckpointState, Mapping[str, torch.Tensor]], str | None] = lambda state, weights: None,
    accept: Callable[[str | None, int | None], None] = lambda name, world_size: None,
) -> Restored | None:
    """Restore the newest valid checkpoint in ``directory`` (read on rank 0) into every rank.

    ``restore_rng=False`` exists only for verify's negative control. At another world size than
    the checkpoint's (allowed by the caller), rank ``r`` gets rank ``r``'s RNG state when the
    checkpoint has one and keeps its own otherwise. ``fits`` (rank 0, given the checkpoint's state
    and whole trainable weights): None, or why the run cannot go on from it (the ledger does not
    reach it); such a checkpoint is refused and the previous one tried, as one that cannot be read.
    ``accept`` (rank 0, given the checkpoint picked, None when none is, and the world size it was
    saved at): raises InputError to refuse the resume, which every rank then raises.

    Returns:
        What was restored, the same on every rank; None when no checkpoint verifies (start over).

    Raises:
        InputError: what ``accept`` raised, on every rank.
    """
    ctx = _context(setup)
    read: RankCheckpoint | None = None

    def pick() -> tuple[str, CheckpointState, dict[str, Any], dict[str, Any] | None, int | None] | None:
        nonlocal read
        assert directory is not None
        shapes = trainable_shapes(setup.model)
        for found in valid_checkpoints(directory, report=report):
            try:
                read = read_rank_checkpoint(found)
                check_state_shapes(read.ranks.weights, read.ranks.optimizer.get("state") or {}, shapes)
            except Exception as exc:  # a checkpoint that verifies but cannot be restored: an older one may
                read = None
                report(unrestorable_warning(found, exc))
                continue
            if why := fits(read.state, read.ranks.weights):
                read = None
                report(refused_warning(found, why))
                continue
            saved = read.ranks.distributed.get("world_size")
            world = saved if isinstance(saved, int) else None
            accept(found.name, world)
            return found.name, read.state, read.scheduler, read.scaler, world
        accept(None, None)
        return None

    picked = decided_by_main(ctx, pick)
    if picked is None:
        return None
    name, state, scheduler, scaler, saved_world = picked
    load_full_state(
        _train_module(setup),
        setup.optimizer,
        read.ranks.weights if read is not None else None,
        read.ranks.optimizer if read is not None else None,
    )
    setup.scheduler.load_state_dict(scheduler)
    if setup.scaler is not None and scaler is not None:
        setup.scaler.load_state_dict(scaler)
    states = _rng_states(ctx, read, name, restore_rng=restore_rng, report=report)
    own = scatter_objects(ctx, states)
    if restore_rng and own is not None:
        restore_rng_state(own)
    elif restore_rng:  # a rank the checkpoint holds no state for (the world grew): seeded reproducibly
        seed_generators(setup)
    # on rank 0, what the record says: every rank's state restored (not only its own)
    every = states is None or all(s is not None for s in states)
    return Restored(name, state, restore_rng and own is not None and every, saved_world)


def _rng_states(
    ctx: DistContext,
    read: RankCheckpoint | None,
    name: str,
    *,
    restore_rng: bool,
    report: Callable[[str], None],
) -> list[dict[str, Any] | None] | None:
    """Rank 0's list of each rank's RNG state from the checkpoint ``read`` (None on the other
    ranks), a rank it holds none for (the world grew) given None, and said when ``restore_rng``."""
    if read is None:
        return None
    made = len(read.ranks.rng)
    if restore_rng and made < ctx.world_size:
        which = (
            f"rank {made} has" if made == ctx.world_size - 1 else f"ranks {made} to {ctx.world_size - 1} have"
        )
        report(
            f"{which} no RNG state in {name} (made at world size {made}): seeded as at a run's "
            "start, each rank with its own seed"
        )
    return (read.ranks.rng + [None] * ctx.world_size)[: ctx.world_size]
