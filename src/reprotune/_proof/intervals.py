"""The intervals of a spot check (``verify --spot``): which to replay, the ledger lines each
covers, how its lines differ, and what replaying them proves. No torch: ``verify --command
--spot`` uses it too.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprotune._jsonio import sha256_file
from reprotune._proof.verification import Leg, LegVerdict
from reprotune._run.layout import RunLayout
from reprotune._run.ledger import read_ledger, val_by_place

DEFAULT_BUDGET = 0.2


@dataclass(frozen=True)
class Interval:
    """Steps ``start + 1`` ... ``end`` of the run, replayed from the state after ``start``."""

    start: int
    end: int
    why: str  # "first", "last", "first and last" or "drawn"

    @property
    def steps(self) -> int:
        return self.end - self.start

    @property
    def name(self) -> str:
        """The interval's leg name (``steps 4-6``)."""
        return f"steps {self.start + 1}-{self.end}"

    def leg_dir(self, root: Path) -> Path:
        """The interval's run directory in the verification directory ``root`` (absolute)."""
        return (root / f"steps-{self.start + 1}-{self.end}").resolve()


def plan_intervals(states: Sequence[int], total: int, *, budget: float, seed: int) -> list[Interval]:
    """The intervals to replay, in step order.

    Args:
        states: the steps with a checkpoint (others than 0 and ``total`` are the cut points).
        total: the run's last step.
        budget: the share of ``total`` steps the drawn intervals may bring the replay up to (the
            first and the last are always replayed, whatever they cost).
        seed: the seed of the draw.
    """
    points = sorted({0, total, *(s for s in states if 0 < s < total)})
    spans = list(itertools.pairwise(points))
    chosen = {spans[0]: "first", spans[-1]: "last"} if len(spans) > 1 else {spans[0]: "first and last"}
    covered = sum(b - a for a, b in chosen)
    rest = spans[1:-1]
    random.Random(seed).shuffle(rest)
    for a, b in rest:
        if covered + (b - a) <= budget * total:
            chosen[(a, b)] = "drawn"
            covered += b - a
    return [Interval(a, b, why) for (a, b), why in sorted(chosen.items())]


def interval_lines(run_dir: Path, start: int, end: int) -> dict[tuple[str, int], dict[str, Any]]:
    """The ledger lines of steps ``start + 1 ... end`` of a run (and the init line when ``start``
    is 0), by (kind, step)."""
    ledger = read_ledger(RunLayout(run_dir).ledger)
    out = {("train", e.step): dict(e.fields) for e in ledger.train if start < e.step <= end}
    for (step, place), e in val_by_place(ledger.val).items():  # a Trainer's named eval sets: "val 2"
        if start < step <= end:
            out[("val" if place == 0 else f"val {place + 1}", step)] = dict(e.fields)
    if start == 0 and ledger.init is not None:
        out[("init", 0)] = dict(ledger.init.fields)
    return out


def first_difference(
    mine: dict[tuple[str, int], dict[str, Any]], theirs: dict[tuple[str, int], dict[str, Any]]
) -> tuple[int, list[str]] | None:
    """The first step whose ledger line differs (init, train, then val within a step) and that
    line's differing fields as ``"<kind> <field>"``; None when every line is the same."""
    order = {"init": 0, "train": 1, "val": 2}
    keys = sorted(
        (k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k)),
        key=lambda k: (k[1], order[k[0]]),
    )
    if not keys:
        return None
    kind, step = keys[0]
    a, b = mine.get(keys[0], {}), theirs.get(keys[0], {})
    return step, [f"{kind} {field}" for field in sorted(set(a) | set(b)) if a.get(field) != b.get(field)]


def judge_interval(
    reference: Path, leg_dir: Path, interval: Interval, *, origin: str, end_state: tuple[str, bool]
) -> tuple[Leg, tuple[int, list[str]] | None]:
    """The leg of a replayed interval: its ledger lines against the reference's, and its end state
    (what it was checked against, whether it matched); and where the lines first differ."""
    first = first_difference(
        interval_lines(leg_dir, interval.start, interval.end),
        interval_lines(reference, interval.start, interval.end),
    )
    evidence: dict[str, Any] = {
        "from": interval.start,
        "to": interval.end,
        "steps": interval.steps,
        "end_state": end_state[0],
    }
    if first is not None:
        evidence["first_divergence"], evidence["differing"] = first
    verdict: LegVerdict = "IDENTICAL" if first is None and end_state[1] else "DIVERGED"
    note = f"{interval.why}; from {origin}"
    leg = Leg(
        interval.name, str(leg_dir), "IDENTICAL", verdict, verdict == "IDENTICAL", evidence, note, prefix=True
    )
    return leg, first  # prefix: a replay holds the steps up to its interval's end, not the run's


def adapter_state(reference: Path, leg_dir: Path) -> tuple[str, bool]:
    """The end state of an interval that ends the run: the replay's adapter weights file against
    the reference's, both hashed here. The files, not their records' claims: an adapter changed
    since its run (what a user would load) matches its record's sha256 no more than the replay's."""
    ours, theirs = (_adapter_sha256(run) for run in (leg_dir, reference))
    if ours is not None and ours == theirs:
        return "adapter sha256 identical", True
    return f"adapter sha256 {ours or 'missing'} vs {theirs or 'missing'}", False


def _adapter_sha256(run_dir: Path) -> str | None:
    weights = RunLayout(run_dir).adapter_weights
    return sha256_file(weights) if weights.is_file() else None


def coverage(
    intervals: list[Interval], states: list[int], total: int, budget: float, seed: int
) -> dict[str, Any]:
    """``verification.json``'s ``spot`` section: what was chosen and what replaying it proves."""
    available = len(states) + 1
    replayed = sum(i.steps for i in intervals)
    return {
        "budget": budget,
        "seed": seed,
        "total_steps": total,
        "states": [0, *states],
        "intervals_available": available,
        "intervals_replayed": len(intervals),
        "steps_replayed": replayed,
        "intervals": [{"start": i.start, "end": i.end, "why": i.why} for i in intervals],
        "proves": (
            "every fault that touches every step is caught; a fault confined to one interval is "
            f"caught with probability {len(intervals)}/{available} = {len(intervals) / available:.0%} "
            "(for an interval picked at random)"
        ),
    }
