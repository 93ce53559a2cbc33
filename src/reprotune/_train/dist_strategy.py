"""A torchrun rank's side of the seam (``_train.strategy.Distribution``): :class:`Distributed`
computes its share of a step and of validation, and checkpoints, with the other ranks (``_train.dist_step``,
``_train.dist_checkpoint``, ``_train.sharding``), and :func:`distribute_setup` makes a setup a
rank's. A plain run never enters this module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reprotune._errors import InputError
from reprotune._model.lora import tensors_sha256, trainable_tensors
from reprotune._run.checkpoint import CheckpointState
from reprotune._run.live_record import LiveRecord
from reprotune._train import sharding
from reprotune._train.dist_checkpoint import save_distributed_checkpoint
from reprotune._train.dist_record import (
    distributed_section,
    gather_identities,
    restore_on_main,
    store_distributed,
)
from reprotune._train.dist_step import RankStep, gather_validation, rank_validation_batches
from reprotune._train.distributed import (
    DistContext,
    broadcast_object,
    check_placement,
    is_transport_error,
    lost_rank_error,
    rank_seed,
    shard_rows,
)
from reprotune._train.optim import optimizer_and_scheduler
from reprotune._train.setup import Setup
from reprotune._train.step import StepShare
from reprotune._train.strategy import Resume


@dataclass(frozen=True)
class Distributed:
    """One rank of a run spread over ``ctx.world_size`` processes (DDP or FSDP)."""

    ctx: DistContext

    def step_share(self, setup: Setup, module: torch.nn.Module, step: int) -> StepShare:
        return RankStep(self.ctx, setup, module, step)

    def validation_batches(self, n_batches: int) -> Iterable[tuple[int, bool]]:
        return rank_validation_batches(self.ctx, n_batches)

    def gather_validation(self, sums: list[float], counts: list[int]) -> tuple[list[float], list[int]]:
        return gather_validation(self.ctx, sums, counts)

    def rank_rows(self, setup: Setup, rows: list[int]) -> list[list[int]] | None:
        return shard_rows(rows, setup.cfg.train.batch_size, self.ctx.world_size)

    def agree_to_stop(self, stop: bool) -> bool:
        return broadcast_object(self.ctx, stop)

    def lost_rank(self, exc: RuntimeError) -> BaseException | None:
        return lost_rank_error(self.ctx, exc) if is_transport_error(exc) else None

    def weights_hasher(self, setup: Setup) -> Callable[[], str]:
        return sharding.weights_hasher(setup, self.ctx)

    def save_checkpoint(self, setup: Setup, directory: Path | None, state: CheckpointState) -> None:
        save_distributed_checkpoint(setup, directory, state, keep=setup.cfg.train.keep_checkpoints)

    def adapter_state(self, setup: Setup) -> Mapping[str, torch.Tensor] | None:
        return sharding.adapter_state(setup)

    def generator_seed(self, setup: Setup) -> int:
        return rank_seed(setup.seeds["dropout"], self.ctx.rank)

    def record_ranks(
        self,
        setup: Setup,
        record: LiveRecord,
        environment: Mapping[str, Any],
        *,
        resume: bool,
        report: Callable[[str], None],
    ) -> None:
        identities = gather_identities(setup, environment) or []  # every rank's, checked on rank 0
        section = distributed_section(setup, identities)
        store_distributed(record, section, identities, resume=resume, report=report)

    def restore(self, setup: Setup, resume: Resume) -> int:
        return restore_on_main(setup, resume)  # every rank restores together; rank 0 reads the checkpoint


def distribute_setup(setup: Setup, ctx: DistContext) -> Setup:
    """``setup`` made a rank of a distributed run: the model wrapped or sharded, the optimizer and
    schedule built over the parameters the ranks now hold, this rank's LoRA init hashed first.

    Raises:
        InputError: ``grad_accum_steps`` not a multiple of the world size; fp16 with FSDP; FSDP
            on a model whose decoder layers cannot be found.
    """
    cfg = setup.cfg
    check_placement(cfg.train.grad_accum_steps, ctx.world_size, cfg.train.batch_size)
    if ctx.strategy == "fsdp" and setup.scaler is not None:
        raise InputError(
            "train.precision fp16 is not supported with distributed.strategy fsdp: the loss "
            "scaler would decide to skip a step on each rank's gradient shard alone",
            source="train.precision",
            fix="use bf16 or fp32 (or distributed.strategy: ddp)",
        )
    init_sha256 = tensors_sha256(trainable_tensors(setup.model))
    module = sharding.wrap_model(setup.model, ctx)
    # FSDP replaces the parameters with sharded ones: the optimizer must hold those.
    trainable = [p for p in setup.model.parameters() if p.requires_grad]
    optimizer, scheduler = optimizer_and_scheduler(
        trainable, cfg.train, setup.total_steps, cpu_isa=cfg.determinism.cpu_isa
    )
    return dataclasses.replace(
        setup,
        device=ctx.device,
        dist=ctx,
        train_module=module,
        rank_init_sha256=init_sha256,
        trainable=trainable,
        optimizer=optimizer,
        scheduler=scheduler,
        distribution=Distributed(ctx),
    )
