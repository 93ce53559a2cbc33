"""Runs at different world sizes: how many processes trained a run, and its ledger without the
per-rank batch hashes (which cannot match across world sizes; the global batch hash still must)."""

from __future__ import annotations

import dataclasses

from reprotune._run.ledger import LedgerEntry
from reprotune._run.rundir import RunDir


def world_size(run: RunDir) -> int:
    """How many processes trained the run: its ``distributed`` section's, else the ranks a Trainer
    callback saw (1 for a run with neither)."""
    size = run.section("distributed").get("world_size")
    ranks = run.section("trainer").get("ranks")
    if not isinstance(size, int) and isinstance(ranks, list):
        size = len(ranks)
    return size if isinstance(size, int) and size > 0 else 1


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
