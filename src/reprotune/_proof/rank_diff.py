"""What the ranks of two torchrun runs differ in, rank by rank: who and where each ran (host,
device: they cannot change the numbers), and the environment each ran with where it was not rank
0's (``distributed.ranks[].environment_differs``): one rank's other kernels, threads or libraries
change its gradients, and through their sum every rank's update. No torch."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple

from reprotune._jsonio import flattened
from reprotune._proof.cause_texts import MAX_SHOWN, value_text
from reprotune._proof.differences import Difference
from reprotune._proof.stack_causes import key_label
from reprotune._run.drift import read_drift_line
from reprotune._run.kernel_compare import is_gpu_difference, kernel_differences
from reprotune._run.rundir import RunDir

RANKS = "distributed.ranks"
#: Where a rank's entry keeps the lines in which its environment differs from rank 0's.
_DIFFERS = "environment_differs"
_KERNELS = "environment.kernels."
_RANK_KEY = re.compile(r"distributed\.ranks\[(?P<rank>\d+)\]\.(?P<key>.+)", re.S)
Inert = Callable[[str, Any, Any], bool]
Change = Literal["changed", "added", "removed"]


def rank_key(rank: int, key: str) -> str:
    """How a difference of rank ``rank`` is keyed: ``distributed.ranks[1].host``,
    ``distributed.ranks[1].environment.kernels.cpu.aten_capability``."""
    return f"{RANKS}[{rank}].{key}"


def rank_of(key: str) -> tuple[int, str] | None:
    """The rank and its own key of a :func:`rank_key` (``(1, "host")``), else None."""
    found = _RANK_KEY.fullmatch(key)
    return (int(found["rank"]), found["key"]) if found else None


def rank_environment_key(key: str) -> str | None:
    """The environment key a rank's difference records (``environment.threads.torch_intra_op``
    for ``distributed.ranks[1].environment.threads.torch_intra_op``), else None."""
    found = rank_of(key)
    return found[1] if found and found[1].startswith("environment.") else None


def rank_differences(run_a: RunDir, run_b: RunDir, inert: Inert) -> Iterator[Difference]:
    """Every rank's facts that differ between the runs, rank by rank: a rank only one run had,
    whole; its other fields one by one; and each environment value it ran with (rank 0's, the
    record's ``environment``, but for its ``environment_differs``) where the two runs' ranks differ
    otherwise than their rank 0s do (that is the environment's own difference). ``inert(key, a,
    b)``: whether an environment key cannot change the numbers."""
    ranks_a, ranks_b = _ranks(run_a), _ranks(run_b)
    env_a, env_b = (flattened(run.section("environment"), "environment") for run in (run_a, run_b))
    for rank in sorted(set(ranks_a) | set(ranks_b)):
        got_a, got_b = ranks_a.get(rank), ranks_b.get(rank)
        if got_a is None or got_b is None:
            whole: Change = "added" if got_a is None else "removed"
            a, b = (None if got is None else got.fields for got in (got_a, got_b))
            yield Difference("distributed", f"{RANKS}[{rank}]", a, b, whole, True)
            continue
        yield from sorted(_rank_pair(rank, got_a, got_b, (env_a, env_b), inert), key=lambda d: d.key)


class _Rank(NamedTuple):
    """One rank as its run's record holds it: its entry's fields, and the environment values it
    ran with where they were not rank 0's, by key."""

    fields: dict[str, Any]
    ran_with: dict[str, Any]


def _rank_pair(
    rank: int,
    got_a: _Rank,
    got_b: _Rank,
    environments: tuple[Mapping[str, Any], Mapping[str, Any]],
    inert: Inert,
) -> Iterator[Difference]:
    """What one rank both runs had differs in: its fields (inert), and the environment values it
    ran with, each rank 0's (``environments``: each record's, flattened) but for its own."""
    for name in (set(got_a.fields) | set(got_b.fields)) - {_DIFFERS}:
        a, b = got_a.fields.get(name), got_b.fields.get(name)
        if a != b:
            yield Difference("distributed", rank_key(rank, name), a, b, _change(name, got_a, got_b), True)
    env_a, env_b = environments
    for key in set(got_a.ran_with) | set(got_b.ran_with):
        a, b = got_a.ran_with.get(key, env_a.get(key)), got_b.ran_with.get(key, env_b.get(key))
        if a != b and (a, b) != (env_a.get(key), env_b.get(key)):  # else as the environments differ
            yield Difference("distributed", rank_key(rank, key), a, b, "changed", inert(key, a, b))


def _ranks(run: RunDir) -> dict[int, _Rank]:
    """The run's ``distributed.ranks`` entries by rank (by place where an entry lacks it). A run
    as a resume computed it (``resumed_attempts.as_computed``) holds at ``ranks[R].KEY`` of its
    section what that resume noted a rank ran with then (``_run.ranks.rank_environment_drift``:
    ``distributed.ranks[R].environment.KEY: recorded X, now Y``): that rank's value of KEY."""
    section = run.section("distributed")
    entries = section.get("ranks")
    out: dict[int, _Rank] = {}
    for place, entry in enumerate(entries if isinstance(entries, list) else []):
        if isinstance(entry, Mapping):
            rank = entry.get("rank")
            out[rank if isinstance(rank, int) else place] = _Rank(dict(entry), _ran_with(entry))
    for key, value in section.items():
        found = rank_of(f"distributed.{key}")
        if found is not None and found[0] in out:
            got = out[found[0]]
            (got.ran_with if found[1].startswith("environment.") else got.fields)[found[1]] = value
    return out


def _ran_with(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The environment values a rank ran with where they were not rank 0's, by key."""
    lines = entry.get(_DIFFERS)
    out: dict[str, Any] = {}
    for line in lines if isinstance(lines, list) else []:
        if (found := read_drift_line(line)) is not None:
            out[found[0]] = found[1]
    return out


def _change(name: str, a: _Rank, b: _Rank) -> Change:
    if name not in a.fields:
        return "added"
    return "removed" if name not in b.fields else "changed"


def rank_environment_text(diffs: Sequence[Difference]) -> str:
    """'rank 1 ran with other CPU kernels: CPU capability DEFAULT vs AVX512; ...: ...' for the
    environment values of torchrun ranks that differ (:func:`rank_differences`; run A's rank
    first), rank by rank: the kernel facts in the kernel cause's words, then the rest."""
    by_rank: dict[int, list[Difference]] = {}
    for diff in diffs:
        if (found := rank_of(diff.key)) is not None:
            by_rank.setdefault(found[0], []).append(diff)
    said = []
    for rank, ranked in sorted(by_rank.items()):
        kernels = [d for d in ranked if _own(d).startswith(_KERNELS)]
        others = [d for d in ranked if d not in kernels]
        parts = []
        if kernels:
            a, b = (
                _nested({_own(d).removeprefix(_KERNELS): getattr(d, side) for d in kernels}) for side in "ab"
            )
            named = kernel_differences(a, b) or [_pair(d) for d in kernels]
            where = "GPU" if is_gpu_difference(a, b) else "CPU"
            parts.append(f"other {where} kernels: {_shown(named)}")
        if others:
            parts.append(f"another environment: {_shown([_pair(d) for d in others])}")
        said.append(f"rank {rank} ran with {'; and with '.join(parts)}")
    return (
        f"{'; '.join(said)}: what one rank computes with changes its gradients, and through their sum "
        "every rank's update; start every rank in the same environment"
    )


def _own(diff: Difference) -> str:
    """The rank's own key of a rank difference (``environment.threads.torch_intra_op``)."""
    found = rank_of(diff.key)
    return found[1] if found is not None else diff.key


def _pair(diff: Difference) -> str:
    label = key_label(Difference("environment", _own(diff), diff.a, diff.b, diff.change))
    return f"{label} {value_text(diff.a, False)} vs {value_text(diff.b, False)}"


def _shown(items: list[str]) -> str:
    more = f" (and {len(items) - MAX_SHOWN} more)" if len(items) > MAX_SHOWN else ""
    return "; ".join(items[:MAX_SHOWN]) + more


def _nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"cpu.aten_capability": x}`` as ``{"cpu": {"aten_capability": x}}`` (kernel facts' keys)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out
