"""The op-level microscope's instruments: :class:`ModulePaths` (which module runs) and
:class:`OpTracer` (every ATen op below autograd, with the content hash of each tensor it reads and
writes). ``_proof.trace`` runs them around a replayed step or the LoRA init; the module docstring
there says what a trace holds.
"""

from __future__ import annotations

import inspect
import platform
import re
import socket
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

import torch
import xxhash
from torch.multiprocessing.reductions import StorageWeakRef
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from reprotune._model.lora import buffer_hashes
from reprotune._run.op_memory import Memory, address, live
from reprotune._run.op_tensors import (
    allocates,
    generator_entry,
    rng_state_inputs,
    rng_state_outputs,
    tensor_hash,
    written_tensors,
)
from reprotune._run.stack import library_versions
from reprotune._run.tracefile import RNG_STATE_HASH, UNINITIALIZED, TraceOp

HASH = "xxh3-128"
"""The content hash of a trace's tensors (``_run.op_tensors.tensor_hash``)."""


def trace_environment(device: torch.device | str, model: torch.nn.Module) -> dict[str, Any]:
    """A trace header's ``environment``: where the step ran, the host, torch, Python, threads, the
    versions of the libraries that compute a step, and the model's buffers (``model.buffers`` of
    the record: what the library computed from the config at load), named without PEFT's
    wrappers."""
    return {
        "device": str(device),
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "libraries": library_versions(),
        "buffers": {module_name(name): digest for name, digest in buffer_hashes(model).items()},
    }


def param_labels(model: torch.nn.Module) -> dict[int, str]:
    """Storage address -> ``param:<module path>.<name>`` for every parameter of ``model``."""
    labels: dict[int, str] = {}
    for name, param in model.named_parameters():
        labels.setdefault(param.untyped_storage().data_ptr(), f"param:{module_name(name)}")
    return labels


#: Ops that move no bytes beyond their inputs' (besides views, which the dispatcher marks).
_SKIPPED = frozenset({"aten::detach", "aten::alias", "aten::lift_fresh", "prim::device"})
_ARGS_SHOWN = 120  # longer argument lists are written as their hash


def _op_name(func: Any) -> str:
    overload = func._overloadname
    name = str(func._schema.name)
    return name if overload == "default" else f"{name}.{overload}"


def module_name(raw: str) -> str:
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
        self._names = {id(m): module_name(name) for name, m in model.named_modules()}
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


class LoraLayers:
    """Which layer PEFT is giving its LoRA adapter while :meth:`watching`: the module name PEFT
    works on (``LoraModel._create_and_replace``'s ``current_key``), named as the forward names it
    (``model.layers.0.self_attn.q_proj``), taken when the ops run, so that neither a copy to
    another dtype or device nor the allocator's reuse of memory moves an op to another module."""

    def __init__(self) -> None:
        self._stack: list[str] = []

    def current(self) -> str:
        return self._stack[-1] if self._stack else "-"

    @contextmanager
    def watching(self) -> Iterator[LoraLayers]:
        from peft.tuners.lora import LoraModel

        original = LoraModel._create_and_replace
        signature = inspect.signature(original)

        def create_and_replace(model: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                key = signature.bind(model, *args, **kwargs).arguments.get("current_key")
            except TypeError:  # a PEFT whose signature differs: the ops are named "-"
                key = None
            self._stack.append(module_name(str(key)) if key else "-")
            try:
                return original(model, *args, **kwargs)
            finally:
                self._stack.pop()

        LoraModel._create_and_replace = create_and_replace  # type: ignore[method-assign,assignment]
        try:
            yield self
        finally:
            LoraModel._create_and_replace = original  # type: ignore[method-assign]


class CurrentModule(Protocol):
    """What tells a tracer which module is running."""

    def current(self) -> str: ...


#: An object's address in its repr (``<... object at 0x7f...>``): another in every process.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _written(arg: Any) -> Any:
    """A non-tensor argument as a trace writes it: a tensor as ``T``, a generator as ``G`` (its
    state is an input of its own), anything else as it is (its address, if its repr shows one,
    is dropped), so the same step traced twice writes the same bytes."""
    if isinstance(arg, torch.Tensor):
        return "T"
    return "G" if isinstance(arg, torch.Generator) else arg


class OpTracer(TorchDispatchMode):
    """Sees every ATen op while active; keeps a :class:`TraceOp` for each (see the module docstring).

    An allocating op's output (``aten::empty``'s) is written ``uninitialized``: its bytes are
    whatever the allocator held. So is an argument an op writes in place (its schema says
    ``Tensor(a!)``: ``uniform_``'s ``self``, ``out=``) while the bytes it spans are still of that
    allocation, alive and written by no op since; every other input is hashed as it lies (a write the
    dispatcher does not see, from NumPy or a custom kernel, then shows at its reader). A random op's
    generator state goes in as one more input (``rng:cpu``), so that "same inputs" covers the
    random numbers it draws.

    Args:
        modules: what says which module runs (``current()``): the :class:`ModulePaths` entered
            around the same code, or another such source (the LoRA init's).
        labels: tensor storage address -> a name (``param:...``) for inputs the trace knows;
            parameters' hashes are cached while their version counter holds.
    """

    def __init__(self, modules: CurrentModule, labels: Mapping[int, str]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.modules = modules
        self.labels = dict(labels)
        self.phase = "setup"
        self.ops: list[TraceOp] = []
        self._counts: Counter[tuple[str, str, str]] = Counter()
        # a parameter's hashes by its storage's address, then by view and version: read by many
        # ops, hashed once while its version does not move and no op writes its storage
        self._param_hashes: dict[int, dict[tuple[Any, ...], str]] = {}
        self._memory = Memory()  # which op wrote which bytes; allocations not yet written
        self._unhashed: dict[int, tuple[StorageWeakRef, str]] = {}

    def unhashed(self, t: torch.Tensor, word: str) -> None:
        """Write ``word`` for ``t``'s bytes instead of their hash, and for every tensor an op
        computes from it while it lives: a value outside what a step computes (the Trainer's loss
        log, :data:`~reprotune._run.tracefile.LOSS_LOG_HASH`)."""
        self._unhashed[address(t)] = (StorageWeakRef(t.untyped_storage()), word)

    def _word(self, where: int) -> str | None:
        """The word written for the storage at ``where`` instead of its hash, while it lives."""
        held = live(self._unhashed, where)
        return held[1] if held is not None else None

    def mark(self, phase: str) -> None:
        """Name the part of the step that begins (``train_step`` calls it)."""
        self.phase = phase

    def _entry(self, t: torch.Tensor, rng_state: set[int], overwritten: bool = False) -> tuple[str, ...]:
        if id(t) in rng_state:
            return (*_shape_dtype(t), RNG_STATE_HASH)
        where = address(t)
        word = self._word(where) if self._unhashed and where else None
        if word is not None:
            return (*_shape_dtype(t), word)
        label = self.labels.get(where)
        if overwritten and where and self._memory.unwritten(t):
            digest = UNINITIALIZED
        elif label is not None:
            known = self._param_hashes.setdefault(where, {})
            key = (t.storage_offset(), tuple(t.shape), t.stride(), t._version, t.dtype)
            digest = known[key] if key in known else known.setdefault(key, tensor_hash(t))
        else:
            digest = tensor_hash(t)
        entry = (*_shape_dtype(t), digest)
        return (*entry, label) if label is not None else entry

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = _op_name(func)
        if func.is_view or name in _SKIPPED or name.startswith("profiler::"):
            return func(*args, **kwargs)
        flat, _ = tree_flatten((args, kwargs))
        rng_state = rng_state_inputs(func, args, kwargs)
        written = written_tensors(func, args, kwargs)
        overwritten = {id(t) for t in written}
        inputs = tuple(
            self._entry(x, rng_state, id(x) in overwritten) for x in flat if isinstance(x, torch.Tensor)
        )
        src = tuple(self._memory.writer(x) for x in flat if isinstance(x, torch.Tensor))
        generator = generator_entry(func, args, kwargs)
        if generator is not None:
            inputs += (generator,)
            src += (None,)
        out = func(*args, **kwargs)
        for t in written:  # also through an alias with a version of its own (``.data``)
            self._param_hashes.pop(address(t), None)
        produced, _ = tree_flatten(out)
        tensors = [x for x in produced if isinstance(x, torch.Tensor)]
        outputs: tuple[tuple[str, ...], ...]
        for t in (*tensors, *written):
            self._memory.wrote(t, len(self.ops))
        if allocates(func):
            for t in tensors:
                self._memory.allocated(t)
            outputs = tuple((*_shape_dtype(x), UNINITIALIZED) for x in tensors)
        else:
            self._carry_unhashed(inputs, (*tensors, *written))
            rng_state = rng_state_outputs(func, out)
            # what it returns, then what it writes in place and does not return (the fused
            # optimizer's and ``_foreach_*_``'s parameters and states: they return nothing)
            returned = {id(x) for x in tensors}
            kept = [*tensors, *(x for x in written if id(x) not in returned)]
            outputs = tuple(self._entry(x, rng_state) for x in kept)
        module = self.modules.current()
        key = (self.phase, module, name)
        n = self._counts[key]
        self._counts[key] += 1
        shown = _ADDRESS.sub("", repr([_written(x) for x in flat]))
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
            src=src,
        )
        self.ops.append(op)
        return out

    def _carry_unhashed(self, inputs: tuple[tuple[str, ...], ...], made: tuple[torch.Tensor, ...]) -> None:
        """What an op computes from an unhashed tensor is unhashed too, with its word."""
        if not self._unhashed:
            return
        words = {entry[2] for entry in inputs} & {word for _, word in self._unhashed.values()}
        if words:
            for t in made:
                self.unhashed(t, min(words))


def _shape_dtype(t: torch.Tensor) -> tuple[str, str]:
    """``("512x576", "float32")``: a tensor's shape and dtype as a trace writes them."""
    return "x".join(str(d) for d in t.shape), str(t.dtype).removeprefix("torch.")
