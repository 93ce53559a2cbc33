"""One optimizer step of a Trainer script under the microscope: what the callback does when
``reprotune trace RUN --step K --command CMD`` runs the script (``REPROTUNE_TRACE_STEP``).

``reprotune trace`` cannot rebuild a user's script, so the script itself is run and its callback
traces step K with the same instruments (``_run.op_tracer``): every ATen op from ``on_step_begin``
to ``on_step_end`` (each micro-batch's forward, its backward with what follows it up to the next
micro-batch or the optimizer, gradient clipping included in the last one's, then the optimizer,
the scheduler and ``zero_grad``), named by module, its tensors hashed. The batch of the step was
fetched before ``on_step_begin`` (the Trainer prefetches a step's micro-batches): its tensors show
as inputs no traced op made. The trace file is written at step K's end with the line the ledger got;
``reprotune trace`` then judges it against the run being traced.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from reprotune._formats import TRACE
from reprotune._run.fingerprint import attention_of
from reprotune._run.kernels import kernel_facts
from reprotune._run.op_tracer import HASH, ModulePaths, OpTracer, param_labels, trace_environment
from reprotune._run.tracefile import LOSS_LOG_HASH, write_trace
from reprotune._train.writer import RunWriter


class _TrainerOps(OpTracer):
    """:class:`OpTracer` whose phase follows the Trainer's step: ``forward.J`` until micro-batch
    J's backward begins (an autograd node is running), ``backward.J`` from then on, ``optimizer``
    once the callback is told."""

    def __init__(self, modules: ModulePaths, labels: dict[int, str]) -> None:
        super().__init__(modules, labels)
        self.micro_batch = 0
        self._backward = False
        self._optimizer = False

    def next_micro_batch(self) -> None:
        self.micro_batch += 1
        self._backward = False

    def optimizer(self) -> None:
        self._optimizer = True
        self.mark("optimizer")

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not self._optimizer:
            self._backward = self._backward or torch._C._current_autograd_node() is not None
            self.mark(f"{'backward' if self._backward else 'forward'}.{self.micro_batch}")
        return super().__torch_dispatch__(func, types, args, kwargs)


class StepTrace:
    """Traces optimizer step ``step`` of the Trainer the callback watches, into ``out`` (nothing
    when ``step`` or ``out`` is None: a run not under ``reprotune trace``).

    The callback calls :meth:`begin` at every step's begin (it starts at step ``step`` only),
    :meth:`next_micro_batch` at each sub-step's end, :meth:`optimizer` before the optimizer steps,
    :meth:`stop` first thing at the step's end and :meth:`write` once the step's ledger line is
    made; :meth:`stop` again if training fails.
    """

    def __init__(self, step: int | None, out: Path | None) -> None:
        self.step = step
        self.out = out
        self._stack: ExitStack | None = None
        self._tracer: _TrainerOps | None = None
        self._weights_in: str | None = None
        self._model: Any = None

    def begin(self, global_step: int, model: Any, weights: Callable[[], str] | None) -> None:
        """Start tracing when the step about to run is the one to trace (``weights``: the hash of
        the trainable weights going into it; None on a rank that does not record)."""
        if global_step + 1 != self.step or self._tracer is not None or weights is None:
            return
        self._weights_in, self._model = weights(), model
        self._stack = ExitStack()
        modules = self._stack.enter_context(ModulePaths(model))
        self._tracer = self._stack.enter_context(_TrainerOps(modules, param_labels(model)))
        total = _loss_log()
        if total is not None:
            self._tracer.unhashed(total, LOSS_LOG_HASH)

    def next_micro_batch(self) -> None:
        if self._stack is not None and self._tracer is not None:
            self._tracer.next_micro_batch()

    def optimizer(self) -> None:
        if self._stack is not None and self._tracer is not None:
            self._tracer.optimizer()

    def stop(self) -> None:
        """Stop tracing (the ops seen are kept for :meth:`write`)."""
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()

    def write(self, global_step: int, run: RunWriter, line: dict[str, Any]) -> None:
        """Write the trace of the step that just ended, if it is the one traced: its header holds
        the ledger line it gave (``reprotune trace`` compares it with the run's own)."""
        if global_step != self.step or self._tracer is None or self.out is None:
            return
        ops, self._tracer = self._tracer.ops, None
        device = next(iter(self._model.parameters())).device
        header = TRACE.stamp(
            {
                "run_id": run.record["run_id"],
                "run_dir": str(run.paths.root.resolve()),
                "config_sha256": run.record["config_sha256"],
                "step": self.step,
                "replayed_from": 0,
                "reproduced": {"step": True, "before": True, "replayed_line": dict(line)},
                "weights_in_sha256": self._weights_in,
                "kernels": kernel_facts(attention=attention_of(self._model)),
                "environment": trace_environment(device, self._model),
                "hash": HASH,
                "ops": len(ops),
            }
        )
        write_trace(self.out, header, ops)


def _loss_log() -> torch.Tensor | None:
    """The Trainer's running loss total since it last logged: ``Trainer._tr_loss`` (transformers
    5) or the ``tr_loss`` local of its training loop (4.x), read in the frame of that loop
    (``_inner_training_loop``: the callback runs below it, through ``_run_epoch`` in 5.x); None
    where neither is found. The step adds its loss to it, but nothing the step computes reads it,
    and a resume starts it again at 0 (:data:`LOSS_LOG_HASH`)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != "_inner_training_loop":
        frame = frame.f_back
    if frame is None:
        return None
    local = frame.f_locals
    total = getattr(local.get("self"), "_tr_loss", None)
    total = local.get("tr_loss") if total is None else total
    return total if isinstance(total, torch.Tensor) else None
