"""The trace file (``reprotune trace``): its format, written and read in one place. No torch.

A trace is JSON lines: the header first, then one line per ATen op of the traced optimizer step
(or, for step 0, of the LoRA init), in the order the ops ran. Hashes only: no tensor values, no
data rows, no secrets.

Header (``"kind": "header"``): ``schema`` (``reprotune/trace``), ``schema_version``, the run
(``run_id``, ``config_sha256``, ``run_dir``), ``step``, ``replayed_from`` (the checkpoint step the
replay started from, 0 for the start), ``reproduced`` (did the replay give the run's own ledger
lines: each step before the traced one, and the traced step's line, field by field; for step 0 the
``init`` line), ``weights_in_sha256`` (the trainable weights going into the step, as the ledger
hashes them; null for step 0),
``kernels`` (the machine's kernel facts, ``_run.kernels``), ``kernels_vs_run`` (how they differ
from the facts the run recorded, and the steering variables to set so they agree; null for a record
without them; absent in traces written before it), ``model_vs_run`` (how the base model loaded
for the replay differs from the run's: each file and buffer, run's first; empty when it is the
run's; absent in traces written before it), ``environment`` (host, torch, Python,
threads, ``libraries``: the versions of the libraries that compute a step, ``buffers``: the
model's buffers by name, as the record's ``model.buffers``), ``hash`` (the content hash used),
``ops`` (how many op lines follow). Nothing that depends on the time or the process: the same
step traced twice on one machine gives the same bytes.

Op line (``"kind": "op"``): ``i`` (position), ``phase`` (``data``, ``forward.J``, ``backward.J``,
``optimizer``; ``lora-init`` for step 0), ``module`` (the innermost module running,
``model.layers.0.self_attn.q_proj``; in the LoRA init, the layer PEFT was giving its adapter;
``-`` when none), ``op`` (``aten::mm``), ``n`` (its occurrence: how many ops of that name ran
before it in that phase and module), ``args`` (the non-tensor arguments, written out, or their hash
when long), ``in`` and ``out``: one ``[shape, dtype, hash]`` per tensor (``shape`` like ``512x576``;
a fourth element names a tensor the trace knows: a parameter, ``param:model.layers.0...``); ``src``:
for each input, the position ``i`` of the op that last wrote the bytes it reads (null: none in the trace),
which says where a value read through a view came from, whose bytes hash otherwise; ``out``
holds what the op returns, then each tensor it writes in place and does not return (the fused
optimizer's and ``_foreach_*_`` ops' parameters and states, as they are after the op).
``hash`` is ``uninitialized`` for memory no op has written yet (``aten::empty``'s output),
``rng-state`` for fused attention's dropout state and ``trainer-loss-log`` for the Trainer's loss
log (:data:`LOSS_LOG_HASH`). A random op has one more input, ``["", "generator", hash,
"rng:cpu"]``: the state of the generator it draws from.
Version 3 (what an op writes in place and does not return, in ``out``); version 2 traces
lack it (their optimizer update compared as nothing) and are refused, as version 1 traces are.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from reprotune._documents import jsonl_lines, validated_line
from reprotune._errors import InputError
from reprotune._formats import TRACE
from reprotune._jsonio import canonical_dumps, write_bytes_atomic
from reprotune._run.outputs import refuse_inside_run, refuse_unwritable_parent

#: What a trace writes for the bytes of memory no op has written yet (``aten::empty`` and its
#: siblings allocate without writing: their bytes are whatever the allocator's memory held).
UNINITIALIZED = "uninitialized"
#: What a trace writes for the dropout RNG state fused attention kernels pass on.
RNG_STATE_HASH = "rng-state"
#: What a Trainer script's trace writes for the Trainer's running loss total since it last logged
#: (and what is computed from it): bookkeeping for its log, never read by a step, and started
#: again at 0 by a resume, so a step traced from a checkpoint would differ there alone.
LOSS_LOG_HASH = "trainer-loss-log"
#: Entries that stand for no content: never evidence of where a value came from.
PLACEHOLDER_HASHES = frozenset({UNINITIALIZED, RNG_STATE_HASH, LOSS_LOG_HASH})

#: One tensor of an op: [shape, dtype, content hash] and an optional label.
TensorEntry = Annotated[tuple[str, ...], Field(min_length=3, max_length=4)]


def entries_agree(x: tuple[str, ...], y: tuple[str, ...]) -> bool:
    """Two tensor entries (shape, dtype, hash; labels ignored) that agree: equal, or of one shape
    and dtype where either is the Trainer's loss log (a trace made before reprotune wrote it so
    hashed it)."""
    return x[:3] == y[:3] or (LOSS_LOG_HASH in (x[2], y[2]) and x[:2] == y[:2])


def all_entries_agree(xs: Sequence[tuple[str, ...]], ys: Sequence[tuple[str, ...]]) -> bool:
    """Whether two ops' tensors agree one by one (:func:`entries_agree`), as many on each side."""
    return len(xs) == len(ys) and all(entries_agree(x, y) for x, y in zip(xs, ys, strict=True))


class TraceOp(BaseModel):
    """One op of a traced step (see the module docstring); ``inputs`` and ``outputs`` are written
    as ``in`` and ``out``."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    kind: Literal["op"]
    i: int
    phase: str
    module: str
    op: str
    n: int
    args: str
    inputs: tuple[TensorEntry, ...] = Field(validation_alias="in", serialization_alias="in")
    outputs: tuple[TensorEntry, ...] = Field(validation_alias="out", serialization_alias="out")
    src: tuple[int | None, ...] = ()
    """For each input, the position ``i`` of the op that last wrote the bytes it reads in this trace (null:
    none did: a parameter, the step's data, a generator); empty in traces written before it."""

    @property
    def key(self) -> tuple[str, str, str, int]:
        """What aligns two traces: the same op at the same place of the step."""
        return (self.phase, self.module, self.op, self.n)

    def to_json(self) -> dict[str, Any]:
        """The op line, as written."""
        return self.model_dump(mode="json", by_alias=True)

    def signature(self) -> str:
        """``aten::mm 512x576 @ 576x576 float32``: the op and its inputs' shapes, for people."""
        tensors = [t for t in self.inputs if t[1] != "generator"]
        shapes = " @ ".join(t[0] or "scalar" for t in tensors) or "no tensor inputs"
        dtypes = sorted({t[1] for t in tensors})
        return f"{self.op} {shapes} {'/'.join(dtypes)}".strip()


class _Reproduced(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    step: bool
    before: bool
    differing_fields: list[str] = Field(default_factory=list)
    differing_steps_before: dict[str, list[str]] = Field(default_factory=dict)


class _Kernels(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    version: int
    cpu: dict[str, Any] | None = None
    blas: dict[str, Any] | None = None
    steering_env: dict[str, str | None] | None = None
    attention: dict[str, Any] | None = None
    cuda: dict[str, Any] | None = None
    portable: dict[str, Any] | None = None
    algorithms: dict[str, Any] | None = None


class _KernelsVsRun(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    differences: list[str]
    assignments: list[str] = Field(default_factory=list)


class _Environment(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    libraries: dict[str, str] | None = None
    buffers: dict[str, str] | None = None


class TraceHeader(BaseModel):
    """The header's fields that ``compare`` reads, typed (see the module docstring); a header is
    checked against it when read, so a hand-edited one is refused at its key, not crashed on."""

    model_config = ConfigDict(frozen=True, extra="allow")

    run_id: str
    config_sha256: str | None = None
    step: int = Field(ge=0)
    replayed_from: int = Field(ge=0)
    reproduced: _Reproduced
    weights_in_sha256: str | None
    kernels: _Kernels
    kernels_vs_run: _KernelsVsRun | None = None
    model_vs_run: list[str] | None = None
    environment: _Environment | None = None
    ops: int = Field(ge=0)


@dataclass(frozen=True)
class Trace:
    """A trace file read back: its header and its ops."""

    path: Path
    header: Mapping[str, Any]
    ops: tuple[TraceOp, ...]


def new_trace_path(out: str | Path | None, name: str) -> Path:
    """Where a new trace goes: ``out``, or ``name`` in the current directory; refused when that
    exists (a trace never overwrites), is a directory (named with the file it could hold), or lies
    inside a run or study directory (whose files are its run's: a checkpoint's among them)."""
    target = Path(out) if out is not None else Path.cwd() / name
    if out is not None and not str(out).strip():
        raise InputError("--out is empty", source="--out", fix=f"give a file path, e.g. --out {name}")
    if target.is_dir():
        raise InputError(
            f"{target} is a directory; --out names the trace file",
            source="--out",
            fix=f"give a file path, e.g. --out {target / name}",
        )
    if target.exists() or target.is_symlink():
        raise InputError(
            f"{target} already exists", source="--out", fix="choose a new file: a trace never overwrites"
        )
    refuse_inside_run(target, option="--out" if out is not None else "the trace (in the current directory)")
    refuse_unwritable_parent(target, source="--out")
    return target


def write_trace(path: Path, header: Mapping[str, Any], ops: Sequence[TraceOp]) -> bytes:
    """Write the trace atomically (gzip-compressed when ``path`` ends in ``.gz``); return its bytes."""
    lines = [canonical_dumps({**header, "kind": "header", "ops": len(ops)}, indent=None)]
    lines += [canonical_dumps(op.to_json(), indent=None) for op in ops]
    data = "".join(lines).encode("utf-8")
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    write_bytes_atomic(path, data)
    return data


def is_trace_file(path: Path) -> bool:
    """Whether ``path`` is a file whose first line is a trace header (cheap: reads one line)."""
    if not path.is_file():
        return False
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as handle:
            first = json.loads(handle.readline() or "null")
    except (OSError, ValueError, EOFError, UnicodeDecodeError, RecursionError):
        return False
    return TRACE.holds(first)


_FIX = "use a file written by `reprotune trace`, whole (trace the step again if it was cut)"


def _bad(path: Path, line: int, what: str) -> InputError:
    return InputError(what, source=f"{path}:{line}", fix=_FIX)


def read_trace(path: str | Path) -> Trace:
    """Read and check a trace file.

    Raises:
        InputError: not a trace, a schema version this reprotune does not know, a malformed line,
            or fewer op lines than the header says (naming the file and line).
    """
    file = Path(path)
    try:
        raw = gzip.decompress(file.read_bytes()) if file.name.endswith(".gz") else file.read_bytes()
        text = raw.decode("utf-8")
    except (EOFError, UnicodeDecodeError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(f"cannot read {file}: {exc}", source=str(file), fix=_FIX) from None
    except OSError as exc:
        raise InputError(f"cannot read {file}: {exc}", source=str(file), fix="check the path") from None
    lines = jsonl_lines(text)
    try:
        header = json.loads(lines[0]) if lines else None
    except (ValueError, RecursionError) as exc:
        raise _bad(file, 1, f"the first line is not JSON ({exc}): not a whole trace header") from None
    if not TRACE.holds(header):
        raise _bad(file, 1, "not a reprotune trace (no trace header)")
    TRACE.check(
        header,
        source=f"{file}:1",
        fix="pass a trace written by `reprotune trace`",
        version_fix="trace the step again with this reprotune",
    )
    validated_line(TraceHeader, lines[0], what="trace header", source=f"{file}:1", fix=_FIX)
    ops = [
        validated_line(TraceOp, line, what="trace op line", source=f"{file}:{number}", fix=_FIX)
        for number, line in enumerate(lines[1:], start=2)
    ]
    if len(ops) != header.get("ops"):
        raise _bad(
            file, len(lines), f"the header announces {header.get('ops')} ops, the file holds {len(ops)}"
        )
    return Trace(file, header, tuple(ops))


@dataclass(frozen=True)
class TraceResult:
    """What ``reprotune trace`` wrote.

    Attributes:
        path: the trace file.
        header: its header.
        seconds: wall time of the traced step; ``step_s``: of one plain replayed step (None when
            none was replayed before it).
    """

    path: Path
    header: Mapping[str, Any]
    seconds: float
    step_s: float | None
