"""Runs at different world sizes: how many processes trained a run, and its ledger without the
per-rank batch hashes (which cannot match across world sizes; the global batch hash still must)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from reprotune._errors import InputError
from reprotune._proof.processes import launch_world_size, launched_by_torchrun
from reprotune._run.ledger import LedgerEntry
from reprotune._run.ranks import current_world
from reprotune._run.record_sections import DistributedRecord
from reprotune._run.rundir import RunDir

#: How a Trainer-made run's world size, the number of ranks its callback saw (``trainer.ranks``),
#: is keyed among the differences of two runs: its record holds no ``distributed`` section.
TRAINER_WORLD_SIZE = "trainer.world_size"


def world_size(run: RunDir) -> int:
    """How many processes trained the run: its ``distributed`` section's, else the ranks a Trainer
    callback saw (1 for a run with neither)."""
    size = run.section("distributed").get("world_size")
    ranks = run.section("trainer").get("ranks")
    if not isinstance(size, int) and isinstance(ranks, list):
        size = len(ranks)
    return size if isinstance(size, int) and size > 0 else 1


def trainer_world_sizes(run_a: RunDir, run_b: RunDir) -> tuple[int, int] | None:
    """Both runs' world sizes (:func:`world_size`) where each record's Trainer callback listed its
    ranks and neither record holds a ``distributed`` world size (compared in that section); None
    otherwise (a record made before the callback listed them: unknown, not one rank)."""
    runs = (run_a, run_b)
    if any("world_size" in run.section("distributed") for run in runs):
        return None
    if not all(isinstance(run.section("trainer").get("ranks"), list) for run in runs):
        return None
    return world_size(run_a), world_size(run_b)


def world_sizes(run: RunDir) -> set[int]:
    """Every world size the run trained at: its first, and each a resume changed to."""
    sizes = {world_size(run)}
    changes = run.section("distributed").get("world_size_changes") or []
    sizes.update(c["to"] for c in changes if isinstance(c, dict) and isinstance(c.get("to"), int))
    return sizes


def same_world_throughout(run_a: RunDir, run_b: RunDir) -> bool:
    """Whether both runs trained every step at one and the same world size (then their per-rank
    batch hashes are comparable line by line)."""
    return world_sizes(run_a) == world_sizes(run_b) and len(world_sizes(run_a)) == 1


def without_rank_batches(run: RunDir) -> RunDir:
    """``run`` with the per-rank batch hashes left out of its ledger lines."""

    def strip(entry: LedgerEntry) -> LedgerEntry:
        fields = {k: v for k, v in entry.fields.items() if k != "rank_batch_sha256"}
        return dataclasses.replace(entry, fields=fields)

    ledger = run.ledger
    stripped = dataclasses.replace(
        ledger,
        init=strip(ledger.init) if ledger.init is not None else None,
        train=tuple(strip(e) for e in ledger.train),
        val=tuple(strip(e) for e in ledger.val),
    )
    return dataclasses.replace(run, ledger=stripped)


def same_launch(recorded: int | None, launched: int | None, *, invariant: bool) -> bool:
    """Whether a run made at world size ``recorded`` (None: without torchrun) can be reproduced by a
    launch at ``launched``: the same, or two torchrun sizes of a world-size invariant run. Anything
    else places the data, seeds dropout or adds the gradients otherwise (docs/distributed.md)."""
    return recorded == launched or (recorded is not None and launched is not None and invariant)


def refuse_a_reference_of_another_launch(run_dir: Path, distributed: DistributedRecord | None) -> None:
    """Refuse a ``verify --reference`` run made at another world size, or with(out) torchrun where
    this verify runs without (with) it: every leg would part from it for that alone (the data
    placement, dropout seeding and gradient sum differ), and the verdict would blame the rerun.
    Two torchrun sizes pass when the run is ``train.world_size_invariant``."""
    recorded = current_world(distributed)
    here = launch_world_size() if launched_by_torchrun() else None
    if same_launch(
        recorded, here, invariant=distributed is not None and distributed.world_size_invariant is True
    ):
        return
    made, runs = (_launch_words(n) for n in (recorded, here))
    how = (
        f"`torchrun --nproc_per_node {recorded} -m reprotune verify ...`"
        if recorded
        else "`reprotune verify ...`"
    )
    fix = f"run verify the way the reference ran: {how}, or leave --reference out"
    raise InputError(
        f"reference run {run_dir} was made {made}; this verify runs {runs}: its legs would part "
        "from the reference for that alone (data placement, dropout seeding, the gradients' sum)",
        source="--reference",
        fix=fix,
    )


def _launch_words(world: int | None) -> str:
    return "in one process without torchrun" if world is None else f"under torchrun at world size {world}"
