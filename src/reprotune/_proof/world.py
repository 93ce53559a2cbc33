"""Runs at different world sizes: how many processes trained a run, and its ledger without the
per-rank batch hashes (which cannot match across world sizes; the global batch hash still must)."""

from __future__ import annotations

import dataclasses

from reprotune._run.ledger import LedgerEntry
from reprotune._run.rundir import RunDir


def world_size(run: RunDir) -> int:
    """How many processes trained the run (1 for a run without a ``distributed`` section)."""
    size = run.section("distributed").get("world_size", 1)
    return size if isinstance(size, int) else 1


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
