"""What a distributed run writes into its record, and its resume's restore (rank 0's side): every
rank's identity gathered and checked, the ``distributed`` section (a resume notes what moved since
the start, each rank's environment too), a world-size change measured from the checkpoint restored,
the restore of every rank from a checkpoint. ``Distributed`` (``_train.dist_strategy``) calls them
for the run's writer, behind the seam a plain run's ``Local`` answers alone."""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from reprotune._errors import InputError
from reprotune._jsonio import canonical_sha256
from reprotune._model.lora import tensors_sha256
from reprotune._run.checkpoint_files import drop_newer_checkpoints
from reprotune._run.drift import section_drift
from reprotune._run.ledger_resume import ledger_misfit, truncate_ledger
from reprotune._run.live_record import LiveRecord
from reprotune._run.ranks import check_ranks_agree, rank_environment_drift, ranks_section
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


def gather_identities(setup: Setup, environment: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """Every rank's :func:`rank_identity` to rank 0, which refuses ranks that disagree.

    A collective: every rank calls it before training. Returns the identities in rank order on
    rank 0, None on the others.

    Raises:
        InputError: on every rank, when two ranks' packages or inputs differ.
    """
    ctx = setup.dist
    assert ctx is not None
    identities = gather_objects(ctx, rank_identity(setup, environment))
    decided_by_main(ctx, lambda: check_ranks_agree(identities or []))
    return identities


def distributed_section(setup: Setup, identities: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The record's ``distributed`` section of the ranks ``identities`` (rank 0's
    :func:`gather_identities`)."""
    ctx = setup.dist
    assert ctx is not None
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
    record: LiveRecord,
    section: Mapping[str, Any],
    identities: Sequence[Mapping[str, Any]],
    *,
    resume: bool,
    report: Callable[[str], None],
) -> None:
    """Put the ``distributed`` section in the record; a resume keeps the first attempt's and notes
    what differs now on its attempt (as every other section), each rank's environment included
    (``identities``: every rank's now): a rank other than 0 whose kernels or libraries moved
    computes its share of each step otherwise, as rank 0 would, whose own move is the attempt's
    ``environment_drift``. Said and noted, not refused, as rank 0's is."""
    if not resume or "distributed" not in record:
        record.set_section("distributed", section)
        return
    drift = section_drift(_comparable(record["distributed"]), _comparable(section), prefix="distributed")
    drift += rank_environment_drift(
        record["distributed"].get("ranks") or [], record.get("environment") or {}, identities
    )
    record.note_attempt(distributed_drift=drift)
    for line in drift:
        report(f"warning: differs from the run's start: {line}")


def _comparable(section: Mapping[str, Any]) -> dict[str, Any]:
    """A ``distributed`` section as a resume compares it: each rank's host and device; the ranks'
    environments are compared key by key (``rank_environment_drift``; rank 0's drift is noted on
    its own), and world-size changes are recorded as such."""
    out = {k: v for k, v in section.items() if k not in ("ranks", "world_size_changes")}
    out["hosts"] = [rank.get("host") for rank in section.get("ranks", [])]
    out["devices"] = [rank.get("device") for rank in section.get("ranks", [])]
    return out


def note_world_change(record: LiveRecord, change: Mapping[str, int], restored: Restored | None) -> None:
    """Record an allowed world-size change on the run's ``distributed`` section and its attempt."""
    entry = {**change, "at_step": restored.state.step if restored is not None else 0}
    entry["attempt"] = len(record.get("attempts", []))
    record.add_world_size_change(entry)


def refuse_unchecked_world(resume: Resume, world_size: int, name: str | None, saved: int | None) -> None:
    """Refuse (on every rank: it runs in rank 0's pick) a resume that restores checkpoint ``name``
    (None: none, it starts over from step 0 as the run started), saved at world size ``saved``,
    when that is not this resume's and no change was allowed (``resume.change`` None). The world
    size was checked before anything was written against the newest checkpoint that verifies
    (``_run.ranks.checkpoint_world``); this one is older, since that one could not be restored.

    Raises:
        InputError: naming both world sizes and the fix.
    """
    before = resume.record["distributed"].get("world_size") if name is None else saved
    if resume.change is not None or before is None or before == world_size:
        return
    where = (
        f"the checkpoint it restores, {name}, was saved at world size {before}"
        if name is not None
        else f"it starts over from step 0 (no checkpoint could be restored), and the run started at "
        f"world size {before}"
    )
    raise InputError(
        f"the run in {resume.paths.root} resumes at world size {world_size}, but {where} (the newer "
        "checkpoint the world size was checked against could not be restored)",
        source=str(resume.paths.checkpoints / name) if name is not None else str(resume.paths.record),
        fix=f"launch {before} processes in all (torchrun --nproc_per_node / --nnodes), or pass "
        "--allow-world-size-change to go on anyway (the change is recorded and compare names it)",
    )


def settle_world_changes(
    record: LiveRecord, change: Mapping[str, int] | None, restored: Restored | None, world_size: int
) -> None:
    """The record's world-size changes once a resume restored ``restored`` (None: it starts over).

    A change an earlier resume made at or after the step this one goes on from is gone with the
    steps it trained (the ledger is cut back to that step), so it leaves the record's
    ``distributed.world_size_changes`` (its attempt keeps it: that attempt did train so). A change
    is recorded when the checkpoint restored was saved at another world size than this resume's
    (the run's start's, for a resume that starts over), allowed (``change`` not None); the world
    size of a resume before it that left no checkpoint is no change."""
    distributed = dict(record["distributed"])
    step = restored.state.step if restored is not None else 0
    changes = list(distributed.get("world_size_changes") or [])
    kept = [c for c in changes if int(c.get("at_step", 0)) < step]
    if kept != changes:
        distributed["world_size_changes"] = kept
        if not kept:
            del distributed["world_size_changes"]
        record.set_section("distributed", distributed)
    saved = distributed.get("world_size") if restored is None else restored.world_size
    if change is not None and saved is not None and saved != world_size:
        note_world_change(record, {"from": saved, "to": world_size}, restored)


def restore_on_main(setup: Setup, resume: Resume) -> int:
    """Rank 0's side of a distributed resume: restore every rank, truncate the ledger, note on the
    attempt what was restored (and a world-size change from the checkpoint's); return the step to
    go on from."""
    paths, report = resume.paths, resume.report
    assert setup.dist is not None
    world_size = setup.dist.world_size
    restored = restore_distributed(
        setup,
        paths.checkpoints,
        restore_rng=resume.restore_rng,
        report=report,
        fits=lambda state, weights: ledger_misfit(
            paths.ledger, state.step, tensors_sha256(weights), val_at_step=setup.validates_at(state.step)
        ),
        accept=lambda name, saved: refuse_unchecked_world(resume, world_size, name, saved),
    )
    settle_world_changes(resume.record, resume.change, restored, world_size)
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
