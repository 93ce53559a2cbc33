"""Compare two traces of one optimizer step: the first op whose inputs agree and outputs do not.

The op streams are aligned by (phase, module, op, occurrence) and walked together. The first op
that differs in anything is the one to explain:

- **same inputs, different outputs**: the kernel that computed it differs (the two headers' kernel
  facts say how: CPU capability, MKL code path, GPU, library versions);
- **different inputs** at an op whose every earlier op agreed: the input came from outside the
  traced ops: a parameter (named), the batch, or an op that bypasses the dispatcher (the
  difference then shows first at its consumer); the weights going into the step or the run's
  inputs differ, and the record's causes (``reprotune compare RUN_A RUN_B``) say why;
- **the op sequences part**: another code path (another attention implementation, another
  library version): the first module whose ops differ, and both sequences there; or, when every
  module runs the same ops in the same order and only their interleaving differs (independent
  branches of the backward scheduled otherwise), each op is compared with its namesake.

No torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from reprotune._config.secrets import MASK
from reprotune._errors import InputError
from reprotune._formats import TRACE_COMPARISON
from reprotune._proof.microscope import trace_command
from reprotune._proof.trace_paths import (
    buffer_differences,
    library_differences,
    module_ops,
    numbers_after_part,
    parted_places,
    unseen_difference,
)
from reprotune._run.kernel_compare import comparable, kernel_differences
from reprotune._run.tracefile import PLACEHOLDER_HASHES, Trace, TraceOp, all_entries_agree, entries_agree

Finding = Literal["identical", "kernel", "inputs", "sequence", "length", "unseen"]

#: Ops that ATen computes on a CPU, for float32 tensors, with MKL's vector math, in a kernel built on
#: ``rsqrtps``: its bits follow each CPU's own approximation, whatever MKL's settings.
_RSQRTPS_OPS = frozenset({"aten::sqrt", "aten::sqrt_", "aten::_foreach_sqrt", "aten::_foreach_sqrt_"})


@dataclass(frozen=True)
class TraceComparison:
    """What two traces of one step show.

    Attributes:
        finding: ``identical``, ``kernel`` (same inputs, other outputs), ``inputs`` (an input
            came from outside the traced ops and differs), ``sequence`` (the op streams part), or
            ``length`` (one stream ends first), or ``unseen`` (every op agrees, yet the replayed
            steps' ledger lines differ: a computation the trace cannot see).
        op_a, op_b: the first op that differs, in each trace (None when identical).
        explanation: sentences for people, most important first.
        ops_compared: ops walked in step.
        notes: what the headers say that a reader should know (not reproduced, other steps).
    """

    finding: Finding
    op_a: TraceOp | None
    op_b: TraceOp | None
    explanation: tuple[str, ...]
    ops_compared: int
    notes: tuple[str, ...] = field(default=())
    paths: tuple[str, str] = ("", "")
    numbers: tuple[TraceOp | None, TraceOp | None] = (None, None)
    """For op sequences that part: the first op both sides run alike whose numbers differ."""

    @property
    def exit_code(self) -> int:
        return 0 if self.finding == "identical" else 1

    def format(self) -> str:
        head = "IDENTICAL" if self.finding == "identical" else "DIVERGED"
        lines = [f"{head} (traces of one step, {self.ops_compared} ops compared)"]
        lines += [f"  A: {self.paths[0]}", f"  B: {self.paths[1]}"]
        if self.explanation:
            lines.append("first difference" if self.finding != "identical" else "what agrees")
            lines += [f"  {text}" for text in self.explanation]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        return TRACE_COMPARISON.stamp(
            {
                "verdict": "IDENTICAL" if self.finding == "identical" else "DIVERGED",
                "finding": self.finding,
                "paths": list(self.paths),
                "ops_compared": self.ops_compared,
                "op_a": self.op_a.to_json() if self.op_a else None,
                "op_b": self.op_b.to_json() if self.op_b else None,
                "numbers_part": {
                    "op_a": self.numbers[0].to_json() if self.numbers[0] else None,
                    "op_b": self.numbers[1].to_json() if self.numbers[1] else None,
                },
                "explanation": list(self.explanation),
                "notes": list(self.notes),
            }
        )


def _where(op: TraceOp, step: object) -> str:
    return f"step {step}, {op.phase}, {op.module}: {op.signature()}"


def _differing_inputs(a: TraceOp, b: TraceOp) -> list[int]:
    return [k for k, (x, y) in enumerate(zip(a.inputs, b.inputs, strict=False)) if not entries_agree(x, y)]


def _origin(index: int, op: TraceOp, produced: set[str]) -> tuple[str, bool]:
    """Where input ``index`` of ``op`` came from, as far as the trace can see, and whether an op
    both traces agree on made it (so the input changed after it, out of the trace's sight)."""
    entry = op.inputs[index]
    label = entry[3] if len(entry) > 3 else ""
    if label.startswith("param:"):
        return f"input {index} is the parameter {label.removeprefix('param:')}", False
    if label.startswith("rng:"):
        return (
            f"input {index} is the state of the {label.removeprefix('rng:')} random generator the op "
            "draws from: the runs drew other random numbers before it (another seed, or another "
            "number of draws), or the state was set out of the trace's sight",
            False,
        )
    if label:
        return f"input {index} is {label}", False
    shape = f"{entry[0] or 'scalar'} {entry[1]}"
    # the op that wrote its memory, where the trace says (a value read through a view hashes
    # otherwise than what its op made); by its hash in traces written before it said
    made = (op.src[index] is not None) if index < len(op.src) else entry[2] in produced
    if made:
        return (
            f"input {index} ({shape}) in A is what an earlier op made, and that op agreed in both "
            "traces: in B it was changed after it, by a write the trace cannot see (an in-place "
            "update that bypasses the dispatcher), or a trace file was edited",
            True,
        )
    return (
        f"input {index} ({shape}) was not made by any op the trace saw: it comes from the step's "
        "data, or from an op that bypasses the dispatcher, whose difference shows first here, at "
        "its consumer",
        False,
    )


def _notes(a: Trace, b: Trace) -> Iterable[str]:
    ca, cb = a.header.get("config_sha256"), b.header.get("config_sha256")
    configs_differ = bool(ca and cb and ca != cb)
    if configs_differ:
        yield (
            f"the two runs' configs differ (config_sha256 {str(ca)[:12]} vs {str(cb)[:12]}): the traces "
            "are of two experiments, not one run twice; `reprotune compare RUN_A RUN_B` names the keys"
        )
    for label, trace in (("A", a), ("B", b)):
        against = trace.header.get("kernels_vs_run") or {}
        if against.get("differences"):
            assignments = against.get("assignments") or []
            script = trace.header.get("command")  # a Trainer script's trace: the command it ran
            if isinstance(script, str) and MASK in script:  # as written, it would run without them
                script = "<the command that made the run, its secrets masked in the trace>"
            command = trace_command(
                str(trace.header.get("run_dir")),
                trace.header.get("step"),
                assignments,
                f"{label}-step-{trace.header.get('step')}.as-made.trace.jsonl",
                command=script if isinstance(script, str) else None,
            )
            again = (
                f"trace again as the run was made: {command}"
                if assignments
                else "trace it on the machine that made the run"
            )
            yield (
                f"trace {label} was made under other kernels than its run's (run vs here: "
                f"{'; '.join(against['differences'])}): it shows those kernels' step; {again}"
            )
        model = trace.header.get("model_vs_run") or []
        if model:
            yield (
                f"trace {label} was made with another base model than its run's (run vs here: "
                f"{'; '.join(model)}): it shows that model's step"
            )
        reproduced = trace.header.get("reproduced") or {}
        if reproduced.get("step") is False:
            fields = ", ".join(reproduced.get("differing_fields") or [])
            yield (
                f"trace {label} did not reproduce its run's ledger line of step {trace.header.get('step')} "
                f"({fields}): it shows its machine's step, not the run's"
            )
        if reproduced.get("before") is False:
            steps = ", ".join(sorted(reproduced.get("differing_steps_before") or {}, key=int))
            yield f"trace {label}'s replay already differed from its run at step(s) {steps}"
    buffers = buffer_differences(a, b)
    if buffers:
        yield (
            "the model's buffers differ, which the library computes from the config at load (another "
            f"library version can read the same config otherwise): {'; '.join(buffers)}"
        )
    wa, wb = a.header.get("weights_in_sha256"), b.header.get("weights_in_sha256")
    if wa and wb and wa != wb:
        advice = (
            "as their configs do"
            if configs_differ
            else "trace the first step where the runs part, where they were still equal"
        )
        yield f"the weights going into the step differ ({str(wa)[:12]} vs {str(wb)[:12]}): {advice}"


def compare_traces(a: Trace, b: Trace) -> TraceComparison:
    """Walk two traces of one step together and explain the first op that differs.

    Raises:
        InputError: the traces are of different steps (their ops would differ from the first).
    """
    step = a.header.get("step")
    if step != b.header.get("step"):
        raise InputError(
            f"the traces are of different steps: {step} ({a.path}) and {b.header.get('step')} ({b.path})",
            source=str(b.path),
            fix="trace the same step on both machines: the first step where the runs part, which "
            "`reprotune compare` of the two runs names",
        )
    facts = kernel_differences(_kernels(a), _kernels(b))
    libraries = library_differences(a, b)
    kernels = facts + [d for d in libraries if d.startswith("torch ")]  # torch computes the ATen ops
    notes = tuple(_notes(a, b))
    paths = (str(a.path), str(b.path))
    walk = _Walk(a, step, tuple(kernels), bool(facts), notes, paths)
    produced: set[str] = set()
    compared = 0
    for op_a, op_b in zip(a.ops, b.ops, strict=False):
        if op_a.key != op_b.key:
            if not parted_places(a.ops, b.ops):  # each module runs the same ops: only the order differs
                return _reordered(walk, b, compared)
            return _sequence(a, b, (op_a, op_b), compared, (kernels, libraries), notes, paths)
        compared += 1
        found = _judged(walk, op_a, op_b, produced, compared)
        if found is not None:
            return found
    if len(a.ops) != len(b.ops):
        longer, extra = ("A", a.ops[compared]) if len(a.ops) > len(b.ops) else ("B", b.ops[compared])
        text = (
            f"the op streams agree over {compared} ops, then trace {longer} goes on: "
            f"{extra.phase}, {extra.module}: {extra.op}",
        )
        return TraceComparison("length", None, None, text, compared, notes, paths)
    unseen = unseen_difference(a, b)
    if unseen:
        return TraceComparison("unseen", None, None, unseen, compared, notes, paths)
    text = (f"every op of step {step} had the same inputs and outputs in both traces",)
    return TraceComparison("identical", None, None, text, compared, notes, paths)


@dataclass(frozen=True)
class _Walk:
    """What judging each pair of ops needs: trace A, the step, the kernel facts and torch versions
    that differ (and whether any kernel fact does), the notes and the two paths."""

    a: Trace
    step: Any
    kernels: tuple[str, ...]
    facts: bool
    notes: tuple[str, ...]
    paths: tuple[str, str]


def _judged(
    walk: _Walk, op_a: TraceOp, op_b: TraceOp, produced: set[str], compared: int
) -> TraceComparison | None:
    """The first difference, when the two ops of one place in the step differ; None when they agree
    (their outputs then go into ``produced``)."""
    same_in = all_entries_agree(op_a.inputs, op_b.inputs) and op_a.args == op_b.args
    if same_in and all_entries_agree(op_a.outputs, op_b.outputs):
        produced.update(t[2] for t in op_a.outputs if t[2] not in PLACEHOLDER_HASHES)
        return None
    where, notes, paths = _where(op_a, walk.step), walk.notes, walk.paths
    if same_in:
        why = (
            f"the kernel differs ({'; '.join(walk.kernels)})"
            if walk.kernels
            else "the kernel computed other bits from the same inputs, though the two machines' "
            "kernel facts agree: nondeterminism in the op itself (run it twice on one machine: "
            "`reprotune doctor`)"
        )
        text: tuple[str, ...] = (
            f"{where}: same inputs, different outputs: {why}",
            *(_approximation_note(walk.a, op_a) if walk.facts else ()),
        )
        return TraceComparison("kernel", op_a, op_b, text, compared, notes, paths)
    if op_a.args != op_b.args:
        text = (f"{where}: other arguments ({op_a.args} vs {op_b.args}): the step was asked something else",)
        return TraceComparison("inputs", op_a, op_b, text, compared, notes, paths)
    origins = [_origin(k, op_a, produced) for k in _differing_inputs(op_a, op_b)]
    outside = any(not made for _, made in origins)
    advice = (
        "the weights going into the step, the data or the config differ: `reprotune compare` of the "
        "two runs names the recorded causes"
    )
    text = (
        f"{where}: inputs differ at the first op that reads them, while every op before it agreed",
        *(words for words, _ in origins),
        *([advice] if outside else []),
    )
    return TraceComparison("inputs", op_a, op_b, text, compared, notes, paths)


def _reordered(walk: _Walk, b: Trace, start: int) -> TraceComparison:
    """The streams part at position ``start``, yet every module runs the same ops in the same
    order on both sides: the ops ran in another order (two independent branches of the backward
    pass, scheduled otherwise). Each op is compared with its namesake in B, in A's order."""
    a, first = walk.a, walk.a.ops[start]
    lead = (
        f"from op {start} on the two traces run the same ops in another order (first: {first.phase}, "
        f"{first.module}: {first.op}); each module runs its own ops in the same order, so each op is "
        "compared with the same op of the other trace"
    )
    in_b = {op.key: op for op in b.ops}
    produced: set[str] = set()
    for compared, op_a in enumerate(a.ops, start=1):
        found = _judged(walk, op_a, in_b[op_a.key], produced, compared)
        if found is not None:
            return replace(found, explanation=(lead, *found.explanation))
    unseen = unseen_difference(a, b)
    if unseen:
        return TraceComparison("unseen", None, None, (lead, *unseen), len(a.ops), walk.notes, walk.paths)
    text = (f"every op of step {walk.step} had the same inputs and outputs in both traces", lead)
    return TraceComparison("identical", None, None, text, len(a.ops), walk.notes, walk.paths)


def _kernels(trace: Trace) -> dict[str, Any]:
    """The trace's kernel facts as compared (``kernel_compare.comparable``: the device it traced on
    decides whether its machine's GPUs count)."""
    device = (trace.header.get("environment") or {}).get("device")
    on_gpu = None if not isinstance(device, str) else device.startswith("cuda")
    return comparable(trace.header.get("kernels") or {}, on_gpu=on_gpu)


def _approximation_note(a: Trace, op: TraceOp) -> tuple[str, ...]:
    """Why a CPU's float32 square root differs between machines whatever their kernel settings."""
    on_cpu = (a.header.get("environment") or {}).get("device") == "cpu"
    if not (on_cpu and op.op in _RSQRTPS_OPS and any(t[1] == "float32" for t in op.outputs)):
        return ()
    return (
        "on a CPU ATen takes this square root from MKL's vector math (vsSqrt), whose kernel is built "
        "on rsqrtps, an approximation each CPU makes its own way (Intel's and AMD's may differ): no "
        "kernel setting pins it; reprotune's AdamW runs fused in determinism.cpu_isa avx2-compatible "
        "for this reason (docs/microscope.md, section 5)",
    )


def _sequence(
    a: Trace,
    b: Trace,
    ops: tuple[TraceOp, TraceOp],
    compared: int,
    differences: tuple[list[str], list[str]],
    notes: tuple[str, ...],
    paths: tuple[str, str],
) -> TraceComparison:
    """The op streams part at position ``compared``: another code path (``differences``: the
    kernel facts and torch version, and the library versions, that differ in the headers)."""
    (op_a, op_b), (kernels, libraries) = ops, differences
    step = a.header.get("step")
    module = op_a.module if op_a.module == op_b.module else f"{op_a.module} / {op_b.module}"
    attention = kernel_differences(
        {"attention": (a.header.get("kernels") or {}).get("attention")},
        {"attention": (b.header.get("kernels") or {}).get("attention")},
    )
    numbers = numbers_after_part(a, b, kernels)
    text = (
        f"step {step}, {op_a.phase}, {module}: the op sequences part after {compared} equal ops "
        "(another code path: another attention implementation or library version computes this part)",
        f"A runs: {module_ops(a.ops[compared:], (op_a.phase, op_a.module))}",
        f"B runs: {module_ops(b.ops[compared:], (op_b.phase, op_b.module))}",
        *(f"recorded: {d}" for d in attention),
        *[f"recorded: the libraries that compute the step differ: {'; '.join(libraries)}"][: len(libraries)],
        *numbers.explanation,
    )
    return TraceComparison("sequence", op_a, op_b, text, compared, notes, paths, (numbers.op_a, numbers.op_b))
