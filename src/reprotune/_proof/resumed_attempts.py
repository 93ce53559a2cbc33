"""What a run's resumed attempts say: each resume (from which step, what it restored), and the run
as a resume computed its steps, where that attempt noted values that differ from the run's start
(its ``drift``, ``environment_drift``, ``code_drift``, ``distributed_drift``: ``_train.attempt``).
Never imports torch."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from reprotune._proof.cause_texts import ResumeDrift
from reprotune._proof.differences import Difference, Resume
from reprotune._proof.record_diff import record_differences
from reprotune._run.drift import read_drift_line
from reprotune._run.rundir import RunDir


def resumes_of(run: RunDir, label: Literal["A", "B"]) -> Iterable[Resume]:
    """The resumed attempts of a run, from its record's ``attempts`` (the last one to resume wins
    over earlier ones from a later step: each resume restarts from its own checkpoint)."""
    attempts = run.record.get("attempts")
    reseeds = reseeds_dropout(run)
    for attempt in attempts if isinstance(attempts, list) else []:
        if (
            isinstance(attempt, Mapping)
            and attempt.get("resumed")
            and isinstance(attempt.get("from_step"), int)
        ):
            yield Resume(
                label,
                attempt["from_step"],
                attempt.get("rng_restored") is not False,
                _names(attempt.get("rng_missing")),
                _names(attempt.get("rng_changed")),
                _names(attempt.get("state_missing")),
                reseeds_dropout=reseeds,
            )


def reseeds_dropout(run: RunDir) -> bool:
    """Whether the run seeds every micro-batch's dropout anew (a torchrun run, its record's
    ``distributed.dropout_seeding``: docs/distributed.md), so a resume draws the same masks
    whether or not it restored the RNG states."""
    seeding = run.section("distributed").get("dropout_seeding")
    return isinstance(seeding, str) and seeding.startswith("per global micro-batch")


#: The lists a resumed attempt notes of what differs from its run's start (``_train.attempt``),
#: each line ``KEY: recorded X, now Y`` with Python's reprs of the values.
_DRIFT_KEYS = ("drift", "environment_drift", "code_drift", "distributed_drift")


@dataclasses.dataclass(frozen=True)
class DriftedResume:
    """The resume that computed the first divergent step, and the keys its attempt noted as
    differing from its run's start (narrowed to a :class:`ResumeDrift` by :func:`compared_drifts`)."""

    run: Literal["A", "B"]
    from_step: int
    keys: frozenset[str]


def as_computed(
    run: RunDir, label: Literal["A", "B"], step: int | None
) -> tuple[RunDir, DriftedResume | None]:
    """``run`` as it computed ``step``: where the last attempt to resume before that step noted
    values that differ from the run's start, the run with those in its record, and which keys it
    noted; else ``run`` and None."""
    attempts = run.record.get("attempts")
    resumed = [
        attempt
        for attempt in (attempts if isinstance(attempts, list) else [])
        if isinstance(attempt, Mapping)
        and attempt.get("resumed")
        and isinstance(attempt.get("from_step"), int)
        and step is not None
        and attempt["from_step"] < step
    ]
    if not resumed:
        return run, None
    record, keys = copy.deepcopy(dict(run.record)), set()
    for key in _DRIFT_KEYS:
        lines = resumed[-1].get(key)
        for line in lines if isinstance(lines, list) else []:
            if (found := read_drift_line(line)) is not None:
                _put(record, *found)
                keys.add(found[0])
    if record == run.record:
        return run, None
    return dataclasses.replace(run, record=record), DriftedResume(
        label, resumed[-1]["from_step"], frozenset(keys)
    )


def _put(record: dict[str, Any], key: str, value: Any) -> None:
    """Set the value at a drift line's dotted ``key`` (a name may hold a dot: ``config.json``)."""
    node, parts = record, key.split(".")
    while True:
        names = [".".join(parts[:n]) for n in range(1, len(parts))]
        name = next((n for n in names if isinstance(node.get(n), dict)), None)
        if name is None:  # the leaf (a key the start lacked is added whole)
            node[".".join(parts)] = value
            return
        node, parts = node[name], parts[name.count(".") + 1 :]


def _names(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def compared_drifts(
    drifts: Sequence[DriftedResume | None], run_a: RunDir, run_b: RunDir
) -> tuple[tuple[Difference, ...], list[ResumeDrift]]:
    """The differences of two runs as they computed the first divergent step (each as
    :func:`as_computed` made it), and each resume's drift narrowed to those, as run A against run
    B: a resume onto what the other run computed with is no cause (both ran the step alike)."""
    at = tuple(record_differences(run_a, run_b))
    narrowed = []
    for drift in filter(None, drifts):
        if kept := tuple(d for d in at if d.key in drift.keys):
            narrowed.append(ResumeDrift(drift.run, drift.from_step, kept))
    return at, narrowed
