"""Two traces whose op sequences part (another library version, another attention implementation):
where the code paths differ, and whether and where that changes the numbers. No torch.

Ops are counted per phase and module (``TraceOp.n``), so the streams realign by themselves after
a module whose ops differ: every module that runs the same ops on both sides (the same keys, in
the same order) is compared op by op, and the modules that do not are *parted*. The first op of a
matched module whose numbers differ is the verdict: its input made inside a parted module (the
other code path computed other values), or the same inputs giving other outputs (the kernel or
the library version computes the op otherwise). When every matched op agrees, the code paths
differ without changing a number the rest of the step sees.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reprotune._proof.cause_texts import hash_differences
from reprotune._run.stack import COMPUTING_LIBRARIES
from reprotune._run.tracefile import PLACEHOLDER_HASHES, Trace, TraceOp, all_entries_agree, entries_agree

_SHOWN_OPS = 8
_SHOWN_MODULES = 4

Place = tuple[str, str]  # (phase, module)


@dataclass(frozen=True)
class NumbersPart:
    """Where the numbers part after the code paths did: the first op both sides run (in a module
    that runs the same ops on both) whose inputs or outputs differ, and why, in sentences."""

    op_a: TraceOp | None
    op_b: TraceOp | None
    explanation: tuple[str, ...]


def _by_place(ops: Sequence[TraceOp]) -> dict[Place, list[TraceOp]]:
    places: dict[Place, list[TraceOp]] = {}
    for op in ops:
        places.setdefault((op.phase, op.module), []).append(op)
    return places


def parted_places(a: Sequence[TraceOp], b: Sequence[TraceOp]) -> list[Place]:
    """The (phase, module) places whose op sequences differ, in the order they first run in A
    (then B's own)."""
    in_a, in_b = _by_place(a), _by_place(b)
    order = list(dict.fromkeys([*in_a, *in_b]))
    return [p for p in order if [o.key for o in in_a.get(p, [])] != [o.key for o in in_b.get(p, [])]]


def module_ops(ops: Sequence[TraceOp], place: Place) -> str:
    """The ops one side runs at ``place``, the first few named: ``aten::mul.Tensor, aten::cat,
    ... (7 in all)``; ``none`` when it runs none there."""
    found = [op.op for op in ops if (op.phase, op.module) == place]
    if not found:
        return "none"
    more = f", ... ({len(found)} in all)" if len(found) > _SHOWN_OPS else ""
    return ", ".join(found[:_SHOWN_OPS]) + more


def _made_in(ops: Sequence[TraceOp], parted: set[Place], before: int) -> dict[str, Place]:
    """Content hash -> the parted place whose op last wrote it before position ``before`` (a
    placeholder such as ``uninitialized`` stands for no content and is left out)."""
    made: dict[str, Place] = {}
    for op in ops:
        if op.i >= before:
            break
        if (op.phase, op.module) in parted:
            for entry in op.outputs:
                if entry[2] not in PLACEHOLDER_HASHES:
                    made[entry[2]] = (op.phase, op.module)
    return made


def _parted_lines(parted: Sequence[Place]) -> list[str]:
    shown = ", ".join(f"{phase} {module}" for phase, module in parted[:_SHOWN_MODULES])
    more = f" and {len(parted) - _SHOWN_MODULES} more" if len(parted) > _SHOWN_MODULES else ""
    return [f"the code paths differ in {len(parted)} module(s): {shown}{more}"]


def numbers_after_part(a: Trace, b: Trace, kernels: Sequence[str]) -> NumbersPart:
    """Walk the modules both traces run alike and find the first op whose numbers differ."""
    parted = parted_places(a.ops, b.ops)
    lines = _parted_lines(parted)
    parted_set = set(parted)
    in_b = {op.key: op for op in b.ops if (op.phase, op.module) not in parted_set}
    step = a.header.get("step")
    for op_a in a.ops:
        op_b = in_b.get(op_a.key)
        same_in = op_b is not None and all_entries_agree(op_a.inputs, op_b.inputs) and op_a.args == op_b.args
        if op_b is None or (same_in and all_entries_agree(op_a.outputs, op_b.outputs)):
            continue
        where = f"step {step}, {op_a.phase}, {op_a.module}: {op_a.signature()}"
        if same_in:
            cause = "; ".join(kernels) or "nothing the two headers record"
            lines.append(
                f"where the numbers part: {where}: same inputs, different outputs, outside the parted "
                f"modules: the op is computed otherwise ({cause})"
            )
            return NumbersPart(op_a, op_b, tuple(lines))
        lines.append(f"where the numbers part: {where}: its inputs differ")
        made_a, made_b = _made_in(a.ops, parted_set, op_a.i), _made_in(b.ops, parted_set, op_b.i)
        lines += _input_origins((op_a, op_b), (made_a, made_b), (a, b), parted_set)
        return NumbersPart(op_a, op_b, tuple(lines))
    lines.append(
        "every op both code paths run alike agrees in its inputs and outputs: the parted modules "
        "compute nothing the rest of the step sees differently"
    )
    return NumbersPart(None, None, tuple(lines))


def _input_origins(
    ops: tuple[TraceOp, TraceOp],
    made: tuple[Mapping[str, Place], Mapping[str, Place]],
    traces: tuple[Trace, Trace],
    parted: set[Place],
) -> list[str]:
    """For each differing input: the parted module that made it (and both sides' ops there), or
    where else it came from."""
    (op_a, op_b), (made_a, made_b), (a, b) = ops, made, traces
    lines = []
    if op_a.args != op_b.args:
        lines.append(f"other arguments: {op_a.args} vs {op_b.args}")
    for index, (x, y) in enumerate(zip(op_a.inputs, op_b.inputs, strict=False)):
        if entries_agree(x, y):
            continue
        place = _maker(a, op_a, index, made_a, parted) or _maker(b, op_b, index, made_b, parted)
        writer = op_a.src[index] if index < len(op_a.src) else None
        if place is None and writer is not None and 0 <= writer < len(a.ops):
            by = a.ops[writer]  # an op both run alike, before the first that differs: it agreed
            lines.append(
                f"input {index} ({x[0] or 'scalar'} {x[1]}) was made by {by.op} in {by.module} "
                f"({by.phase}), which both code paths run alike and which agreed: it was changed "
                "after, by a write the trace cannot see"
            )
            continue
        if place is None:
            label = x[3] if len(x) > 3 else ""
            what = f"the {label.replace(':', ' ', 1)}" if label else "a tensor no traced op made (step data)"
            lines.append(f"input {index} ({x[0] or 'scalar'} {x[1]}) is {what}, and differs")
            continue
        lines.append(
            f"input {index} ({x[0] or 'scalar'} {x[1]}) was made in {place[1]} ({place[0]}), where the "
            f"code paths differ: A runs {module_ops(a.ops, place)}; B runs {module_ops(b.ops, place)}"
        )
    return lines


def _maker(
    trace: Trace, op: TraceOp, index: int, made: Mapping[str, Place], parted: set[Place]
) -> Place | None:
    """The parted place whose op wrote input ``index`` of ``op``: the op the trace names (``src``:
    also through a view, whose bytes hash otherwise), else by the input's hash (``made``: traces
    written before ``src``)."""
    if index >= len(op.src):
        return made.get(op.inputs[index][2])
    writer = op.src[index]
    if writer is None or not 0 <= writer < len(trace.ops):
        return None
    place = (trace.ops[writer].phase, trace.ops[writer].module)
    return place if place in parted else None


def unseen_difference(a: Trace, b: Trace) -> tuple[str, ...]:
    """When every op agrees but the two replays' ledger lines of the step do not: what differs,
    and what the trace could not see."""
    line_a, line_b = (_replayed_line(t) for t in (a, b))
    if line_a is None or line_b is None:
        return ()
    differing = sorted(k for k in set(line_a) | set(line_b) if line_a.get(k) != line_b.get(k))
    if not differing:
        return ()
    return (
        f"step {a.header.get('step')}: every op the traces saw agreed, yet the replayed steps' "
        f"ledger lines differ ({', '.join(differing)})",
        "a computation the trace cannot see made the difference: an op that bypasses the "
        "dispatcher (a custom kernel, NumPy, a write through .data in C++), or a trace written by "
        "a reprotune that did not hash it",
    )


def _replayed_line(trace: Trace) -> Mapping[str, Any] | None:
    """The ledger line the trace's replay of its step gave (its header's ``reproduced``)."""
    reproduced = trace.header.get("reproduced")
    line = reproduced.get("replayed_line") if isinstance(reproduced, Mapping) else None
    return line if isinstance(line, Mapping) else None


def library_differences(a: Trace, b: Trace) -> list[str]:
    """``transformers 5.24.0 vs 4.56.0`` for each library that computes a step whose version the
    two headers hold and differs (torch from traces that hold no library versions)."""
    env_a, env_b = (t.header.get("environment") or {} for t in (a, b))
    libs_a = dict(env_a.get("libraries") or {"torch": env_a.get("torch")})
    libs_b = dict(env_b.get("libraries") or {"torch": env_b.get("torch")})
    named = sorted(set(libs_a) & set(libs_b), key=lambda n: (_rank(n), n))
    differ = [n for n in named if libs_a[n] and libs_b[n] and libs_a[n] != libs_b[n]]
    return [f"{n} {libs_a[n]} vs {libs_b[n]}" for n in differ]


def _rank(name: str) -> int:
    return COMPUTING_LIBRARIES.index(name) if name in COMPUTING_LIBRARIES else len(COMPUTING_LIBRARIES)


def buffer_differences(a: Trace, b: Trace) -> list[str]:
    """The model buffers (computed from the config at load) whose hash differs in the two headers:
    ``model.rotary_emb.inv_freq 0e05ff5d02e2 vs 557938a13816``."""
    buf_a, buf_b = ((t.header.get("environment") or {}).get("buffers") or {} for t in (a, b))
    return hash_differences(buf_a, buf_b) if buf_a and buf_b else []
