"""``reprotune trace RUN_DIR --step K``: the op-level fingerprint of one replayed optimizer step.

The run's step K is replayed in this environment: its setup is built from the record (config,
split manifest, base model checked by hash), the nearest checkpoint at or before step K - 1 is
restored (or the run starts from its beginning), the steps up to K - 1 are trained as the run
trained them, each checked against the run's ledger line, and then step K runs under
:class:`OpTracer`, a ``TorchDispatchMode`` that sees every ATen op of the step below autograd: the
data's, each micro-batch's forward and backward, and the optimizer's. For each op it keeps the op's
name, the innermost module running (forward, and backward through the module's gradient hooks),
its occurrence, its non-tensor arguments, and for every input (before the op: in-place ops change
them) and output tensor its shape, dtype and a content hash of its bytes (xxh3-128: a real hash,
so a permutation or a single flipped bit changes it). Ops the dispatcher marks as views
(``aten::t``, ``aten::view``, ...) are left out: they move no bytes, and their consumers hash what
they read (``aten::_unsafe_view``, which is not marked so, stays in). Fused attention's dropout RNG
state is written as ``rng-state``, not hashed (``_proof.op_tensors``).

The traced step's ledger line is compared with the run's: the trace says at its top whether this
machine reproduced the run (when it does not, the trace shows this machine's step, not the run's).
The format is in ``_proof.tracefile``; two traces are compared by ``_proof.trace_compare``.
"""

from __future__ import annotations

import platform
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import xxhash
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from reprotune._config.loading import config_from_dict
from reprotune._errors import InputError
from reprotune._formats import TRACE
from reprotune._proof.microscope import kernels_against_run
from reprotune._proof.op_tensors import RNG_STATE_HASH, rng_state_inputs, rng_state_outputs, tensor_hash
from reprotune._proof.tracefile import TraceOp, new_trace_path, write_trace
from reprotune._run.checkpoint import restore_checkpoint
from reprotune._run.checkpoint_files import list_checkpoints, verify_checkpoint
from reprotune._run.kernels import kernel_facts
from reprotune._run.ledger import train_line
from reprotune._run.rundir import RunDir, open_run_dir
from reprotune._train.setup import Setup, build_setup
from reprotune._train.step import train_step
from reprotune._train.strategy import seed_generators

HASH = "xxh3-128"
#: Ops that move no bytes beyond their inputs' (besides views, which the dispatcher marks).
_SKIPPED = frozenset({"aten::detach", "aten::alias", "aten::lift_fresh", "prim::device"})
_ARGS_SHOWN = 120  # longer argument lists are written as their hash


def _op_name(func: Any) -> str:
    overload = func._overloadname
    name = str(func._schema.name)
    return name if overload == "default" else f"{name}.{overload}"


def _module_name(raw: str) -> str:
    """A module's name as people write it: PEFT's ``base_model.model.`` wrappers left out
    (``model.layers.0.self_attn.q_proj``); the model itself is ``(model)``."""
    parts = raw.split(".") if raw else []
    while parts[:2] == ["base_model", "model"]:
        parts = parts[2:]
    return ".".join(parts) or "(model)"


_TAG = "reprotune_module"


class ModulePaths(TorchFunctionMode):
    """Which module runs, in the forward (a stack kept by global forward hooks) and in the backward
    (each autograd node is tagged, right after the torch function that made it returns, with the
    module that was running; the backward reads the tag of the node it executes).

    Deterministic: a stack and tags, no sets, no timing of gradient hooks.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self._names = {id(m): _module_name(name) for name, m in model.named_modules()}
        self._stack: list[str] = []
        self._handles: list[Any] = []

    def current(self) -> str:
        node: Any = torch._C._current_autograd_node()
        if node is not None:  # in the backward: the module whose forward made this node
            return str(node.metadata.get(_TAG, "-"))
        return self._stack[-1] if self._stack else "-"

    def _push(self, module: torch.nn.Module, *args: Any) -> None:
        self._stack.append(self._names.get(id(module), type(module).__name__))

    def _pop(self, module: torch.nn.Module, *args: Any) -> None:
        if self._stack:
            self._stack.pop()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self._stack and torch.is_grad_enabled():
            produced, _ = tree_flatten(out)
            nodes: list[Any] = [t.grad_fn for t in produced if isinstance(t, torch.Tensor)]
            here = self._stack[-1]
            while nodes:  # tag what this call made; what is tagged already was made before it
                node = nodes.pop()
                if node is None or _TAG in node.metadata:
                    continue
                node.metadata[_TAG] = here
                nodes.extend(next_node for next_node, _ in node.next_functions)
        return out

    def __enter__(self) -> ModulePaths:
        self._handles = [
            register_module_forward_pre_hook(self._push),
            register_module_forward_hook(self._pop, always_call=True),
        ]
        super().__enter__()  # type: ignore[no-untyped-call]  # torch's mode is untyped
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]
        for handle in self._handles:
            handle.remove()
        self._stack.clear()


class OpTracer(TorchDispatchMode):
    """Sees every ATen op while active; keeps a :class:`TraceOp` for each (see the module docstring).

    Args:
        modules: the :class:`ModulePaths` entered around the same code (which module runs).
        labels: tensor storage address -> a name (``param:...``) for inputs the trace knows;
            parameters' hashes are cached while their version counter holds.
    """

    def __init__(self, modules: ModulePaths, labels: Mapping[int, str]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.modules = modules
        self.labels = dict(labels)
        self.phase = "setup"
        self.ops: list[TraceOp] = []
        self._counts: Counter[tuple[str, str, str]] = Counter()
        self._param_hashes: dict[tuple[Any, ...], str] = {}

    def mark(self, phase: str) -> None:
        """Name the part of the step that begins (``train_step`` calls it)."""
        self.phase = phase

    def _entry(self, t: torch.Tensor, rng_state: set[int]) -> tuple[str, ...]:
        if id(t) in rng_state:
            return ("x".join(str(d) for d in t.shape), str(t.dtype).removeprefix("torch."), RNG_STATE_HASH)
        try:
            address = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            address = 0
        label = self.labels.get(address)
        if label is not None:
            key = (address, t.storage_offset(), tuple(t.shape), t.stride(), t._version, t.dtype)
            digest = self._param_hashes.get(key)
            if digest is None:
                digest = self._param_hashes[key] = tensor_hash(t)
        else:
            digest = tensor_hash(t)
        entry = ("x".join(str(d) for d in t.shape), str(t.dtype).removeprefix("torch."), digest)
        return (*entry, label) if label is not None else entry

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = _op_name(func)
        if func.is_view or name in _SKIPPED or name.startswith("profiler::"):
            return func(*args, **kwargs)
        flat, _ = tree_flatten((args, kwargs))
        rng_state = rng_state_inputs(func, args, kwargs)
        inputs = tuple(self._entry(x, rng_state) for x in flat if isinstance(x, torch.Tensor))
        out = func(*args, **kwargs)
        produced, _ = tree_flatten(out)
        rng_state = rng_state_outputs(func, out)
        outputs = tuple(self._entry(x, rng_state) for x in produced if isinstance(x, torch.Tensor))
        module = self.modules.current()
        key = (self.phase, module, name)
        n = self._counts[key]
        self._counts[key] += 1
        shown = repr([x if not isinstance(x, torch.Tensor) else "T" for x in flat])
        if len(shown) > _ARGS_SHOWN:
            shown = "xxh3:" + xxhash.xxh3_64_hexdigest(shown.encode("utf-8"))
        op = TraceOp(
            kind="op",
            i=len(self.ops),
            phase=self.phase,
            module=module,
            op=name,
            n=n,
            args=shown,
            inputs=inputs,
            outputs=outputs,
        )
        self.ops.append(op)
        return out


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


def _refuse_unsupported(run: RunDir, step: int) -> None:
    config = run.section("config")
    if "trainer" in config:
        raise InputError(
            f"{run.path} was written by a Trainer callback: reprotune cannot replay the user's own "
            "script's step",
            source=str(run.layout.record),
            fix="trace runs made by `reprotune run`; compare a Trainer-made run with `reprotune compare`",
        )
    world = run.section("distributed").get("world_size")
    if isinstance(world, int) and world > 1:
        raise InputError(
            f"{run.path} trained on {world} processes; a trace replays a single-process run",
            source=str(run.layout.record),
            fix="rerun it at world size 1 (`reprotune rerun`) and trace that run's step",
        )
    steps = len(run.ledger.train)
    if not 1 <= step <= steps:
        raise InputError(
            f"step {step} is not a step of this run (its ledger holds steps 1 to {steps})",
            source="--step",
            fix=f"choose a step from 1 to {steps}; `reprotune compare` names the first one that differs",
        )


def _restore(setup: Setup, run: RunDir, step: int, report: Callable[[str], None]) -> int:
    """Put the setup where the run stood before ``step``: the newest whole checkpoint at or before
    step - 1, else the run's start (with its dropout seed). Return the step restored."""
    for path in reversed(list_checkpoints(run.layout.checkpoints)):
        at = int(path.name.split("-")[-1])
        if at > step - 1:
            continue
        problem = verify_checkpoint(path)
        if problem is not None:
            report(f"warning: checkpoint {path} is not used: {problem}")
            continue
        state = restore_checkpoint(
            path, model=setup.model, optimizer=setup.optimizer, scheduler=setup.scheduler, scaler=setup.scaler
        )
        return state.step
    seed_generators(setup)
    return 0


def _line(setup: Setup, step: int, done: tuple[float, int, float, float], digest: str) -> dict[str, Any]:
    loss, n_tokens, lr, grad_norm = done
    epoch, _ = setup.order.position(step)
    return train_line(step, epoch, setup.order.step_rows(step), n_tokens, loss, lr, grad_norm, digest)


def _differing(run: RunDir, step: int, line: Mapping[str, Any]) -> list[str]:
    recorded = run.ledger.train[step - 1].fields
    return sorted(k for k in line if recorded.get(k) != line[k])


def _labels(setup: Setup) -> dict[int, str]:
    labels: dict[int, str] = {}
    for name, param in setup.model.named_parameters():
        fqn = _module_name(name)
        labels.setdefault(param.untyped_storage().data_ptr(), f"param:{fqn}")
    return labels


def trace_step(
    run_dir: str | Path,
    step: int,
    *,
    out: str | Path | None = None,
    report: Callable[[str], None] | None = None,
) -> TraceResult:
    """Replay step ``step`` of the run in ``run_dir`` here and write its trace.

    Args:
        run_dir: a single-process run made by ``reprotune run``.
        step: the optimizer step to trace (1-based).
        out: the trace file (must not exist; ``.gz`` compresses); default
            ``trace-<run_id>-step-<step>.jsonl`` in the current directory.
        report: called with progress lines and warnings (without it, warnings go to stderr).

    Returns:
        Where the trace is, its header, and what the traced step cost.

    Raises:
        InputError: not a run directory, a step outside the run, a Trainer-made or distributed
            run, data or model that do not match the record, an existing ``out``.
    """
    say = report or (lambda line: None)
    run = open_run_dir(run_dir)
    _refuse_unsupported(run, step)
    target = new_trace_path(out, f"trace-{run.run_id}-step-{step}.jsonl")
    cfg = config_from_dict(dict(run.section("config")), source=str(run.layout.record))
    setup = build_setup(cfg, manifest=run.layout.manifest)
    start = _restore(setup, run, step, report or partial(print, file=sys.stderr, flush=True))
    setup.model.train()
    hasher = setup.distribution.weights_hasher(setup)
    before: dict[str, list[str]] = {}
    step_s: float | None = None
    for s in range(start + 1, step):
        say(f"trace: replaying step {s} of {step - 1}")
        t0 = time.perf_counter()
        done = train_step(setup, setup.order.step_rows(s), s)
        step_s = time.perf_counter() - t0
        differs = _differing(run, s, _line(setup, s, done, hasher()))
        if differs:
            before[str(s)] = differs
    say(f"trace: tracing step {step}")
    weights_in = hasher()  # the trainable weights going into the step (the ledger's previous line)
    labels = _labels(setup)
    with ModulePaths(setup.model) as modules, OpTracer(modules, labels) as tracer:
        t0 = time.perf_counter()
        done = train_step(setup, setup.order.step_rows(step), step, mark=tracer.mark)
        seconds = time.perf_counter() - t0
    line = _line(setup, step, done, hasher())
    header = _header(run, setup, step, start, line, before, weights_in)
    header["ops"] = len(tracer.ops)
    write_trace(target, header, tracer.ops)
    return TraceResult(target, header, seconds, step_s)


def _attention(setup: Setup) -> str | None:
    return getattr(setup.model.config, "_attn_implementation", None)


def _header(
    run: RunDir,
    setup: Setup,
    step: int,
    start: int,
    line: Mapping[str, Any],
    before: Mapping[str, list[str]],
    weights_in: str,
) -> dict[str, Any]:
    """The trace's first line: the run, the step, whether the replay reproduced it, the machine."""
    differs = _differing(run, step, line)
    return TRACE.stamp(
        {
            "run_id": run.run_id,
            "run_dir": str(run.path.resolve()),
            "config_sha256": run.record.get("config_sha256"),
            "step": step,
            "replayed_from": start,
            "reproduced": {
                "step": not differs,
                "before": not before,
                "differing_fields": differs,
                "differing_steps_before": dict(before),
                "ledger_line": dict(run.ledger.train[step - 1].fields),
                "replayed_line": dict(line),
            },
            "weights_in_sha256": weights_in,
            "kernels": (here := kernel_facts(attention=_attention(setup))),
            "kernels_vs_run": kernels_against_run(run, here),
            "environment": {
                "device": str(setup.device),
                "host": socket.gethostname(),
                "torch": torch.__version__,
                "python": platform.python_version(),
                "threads": torch.get_num_threads(),
            },
            "hash": HASH,
        }
    )
