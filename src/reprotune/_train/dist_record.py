"""What a distributed run writes into its record, and its resume's restore (rank 0's side): every
rank's identity gathered and checked, the ``distributed`` section, an allowed world-size change, the
restore of every rank from a checkpoint. ``Distributed`` (``_train.dist_strategy``) calls them for
the run's writer, behind the seam a plain run's ``Local`` answers alone."""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from typing import Any

import torch

from reprotune._jsonio import canonical_sha256
from reprotune._model.lora import tensors_sha256
from reprotune._run.checkpoint_files import drop_newer_checkpoints
from reprotune._run.drift import section_drift
from reprotune._run.ledger_resume import ledger_misfit, truncate_ledger
from reprotune._run.live_record import LiveRecord
from reprotune._run.ranks import check_ranks_agree, ranks_section
from reprotune._train.dist_checkpoint import Restored, restore_distributed
from reprotune._train.distributed import SEED_PREFIX, DistContext, decided_by_main, gather_objects, rank_seed
from reprotune._train.setup import Setup
from reprotune._train.strategy import Resume


def rank_identity(setup: Setup, environment: Mapping[str, Any]) -> dict[str, Any]:
    """What this rank reports: who and where it is, its environment, the hashes of its inputs."""
    assert setup.dist is not None
    indices = {name: [int(i) for i in rows] for name, rows in setup.data.manifest.indices.items()}
    device = setup.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else environment["cpu"]["model"]
    return {
        "rank": setup.dist.rank,
        "local_rank": setup.dist.local_rank,
        "host": socket.gethostname(),
        "device": str(device),
        "device_name": name,
        "environment": dict(environment),
        "inputs": {
            "model_weights_sha256": setup.model_info.get("weights_sha256"),
            "tokenizer_sha256": setup.model_info.get("tokenizer_sha256"),
            "data_sha256": setup.data.describe().get("file_sha256"),
            "split_sha256": canonical_sha256(indices),
            "lora_init_sha256": setup.rank_init_sha256,
        },
    }


def distributed_section(setup: Setup, environment: Mapping[str, Any]) -> dict[str, Any] | None:
    """Every rank's identity to rank 0, which refuses ranks that disagree; the record's section.

    A collective: every rank calls it before training. Returns the section on rank 0, None on
    the others.

    Raises:
        InputError: on every rank, when two ranks' packages or inputs differ.
    """
    ctx = setup.dist
    assert ctx is not None
    identities = gather_objects(ctx, rank_identity(setup, environment))
    decided_by_main(ctx, lambda: check_ranks_agree(identities or []))
    if identities is None:
        return None
    cfg = setup.cfg
    return {
        **ctx.describe(),
        "launcher": "torchrun",
        "nodes": len({identity["host"] for identity in identities}),
        "timeout_s": ctx.timeout_s,
        "micro_batches_per_rank": cfg.train.grad_accum_steps // ctx.world_size,
        "placement": "rank r trains the global micro-batches r*K/W ... (r+1)*K/W-1 of each step "
        "(K = train.grad_accum_steps, W = world_size)",
        "dropout_seeding": f"per global micro-batch: {SEED_PREFIX}/<seeds.dropout>/<step>/<micro-batch>",
        "rank_seeds": [rank_seed(setup.seeds["dropout"], r) for r in range(ctx.world_size)],
        "reductions": {
            "loss": "each micro-batch's loss gathered (float64), added in micro-batch order",
            "grad_norm": "float64 sum of squares of "
            + (
                "each rank's gradient shards, gathered and added in rank order"
                if ctx.trainable_sharded
                else "the summed gradients"
            ),
            "validation_loss": "each batch's float64 loss sum gathered, added in batch order",
            "gradients": _gradient_reduction(ctx),
        },
        "world_size_invariant": ctx.world_size_invariant,
        "ranks": ranks_section(identities),
    }


def _gradient_reduction(ctx: DistContext) -> str:
    if ctx.world_size_invariant:
        return (
            "world-size invariant: each micro-batch's LoRA gradient all-gathered, added in global "
            "micro-batch order (the trainable weights whole on every rank"
            + ("; FSDP2 shards the frozen weights only)" if ctx.strategy == "fsdp" else ")")
        )
    return "backend sum: " + (
        "FSDP2 reduce-scatter" if ctx.strategy == "fsdp" else "DDP all-reduce (comm hook, no division)"
    )


def store_distributed(
    record: LiveRecord, section: Mapping[str, Any], *, resume: bool, report: Callable[[str], None]
) -> None:
    """Put the ``distributed`` section in the record; a resume keeps the first attempt's and notes
    what differs now on its attempt (as every other section)."""
    if not resume or "distributed" not in record:
        record.set_section("distributed", section)
        return
    drift = section_drift(_comparable(record["distributed"]), _comparable(section), prefix="distributed")
    record.note_attempt(distributed_drift=drift)
    for line in drift:
        report(f"warning: differs from the run's start: {line}")


def _comparable(section: Mapping[str, Any]) -> dict[str, Any]:
    """A ``distributed`` section as a resume compares it: each rank's host and device, not its
    environment's hash (rank 0's environment drift is noted on its own)."""
    out = {k: v for k, v in section.items() if k not in ("ranks", "world_size_changes")}
    out["hosts"] = [rank.get("host") for rank in section.get("ranks", [])]
    out["devices"] = [rank.get("device") for rank in section.get("ranks", [])]
    return out


def note_world_change(record: LiveRecord, change: Mapping[str, int], restored: Restored | None) -> None:
    """Record an allowed world-size change on the run's ``distributed`` section and its attempt."""
    entry = {**change, "at_step": restored.state.step if restored is not None else 0}
    entry["attempt"] = len(record.get("attempts", []))
    record.add_world_size_change(entry)


def restore_on_main(setup: Setup, resume: Resume) -> int:
    """Rank 0's side of a distributed resume: restore every rank, truncate the ledger, note on the
    attempt what was restored (and an allowed world-size change); return the step to go on from."""
    paths, report = resume.paths, resume.report
    restored = restore_distributed(
        setup,
        paths.checkpoints,
        restore_rng=resume.restore_rng,
        report=report,
        fits=lambda state, weights: ledger_misfit(
            paths.ledger, state.step, tensors_sha256(weights), val_at_step=setup.validates_at(state.step)
        ),
    )
    if resume.change is not None:
        note_world_change(resume.record, resume.change, restored)
    drop_newer_checkpoints(paths.checkpoints, restored.state.step if restored else 0, report)
    if restored is None:  # nothing to restore: start over, from a clean ledger, and say so
        resume.record.note_attempt(started_over=True)
        report(f"no checkpoint to resume {paths.root} from: starting from step 0")
        return 0
    step = restored.state.step
    resume.record.note_attempt(from_step=step, rng_restored=restored.rng_restored)
    truncate_ledger(paths.ledger, keep_through_step=step, val_at_step=setup.validates_at(step), report=report)
    report(f"resuming {paths.root} from step {step} ({restored.name})")
    return step
