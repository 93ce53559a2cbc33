"""``reprotune trace RUN_DIR --step K``: the op-level fingerprint of one replayed optimizer step.

The run's step K is replayed in this environment: its setup is built from the record (config,
split manifest checked against the data; the base model loaded here is compared with the run's,
file by file and buffer by buffer, and the header says where it differs), the nearest checkpoint
at or before step K - 1 is restored (or the run starts from its beginning), the steps up to K - 1
are trained as the run trained them, each checked against the run's ledger line, and then step K
runs under
:class:`OpTracer`, a ``TorchDispatchMode`` that sees every ATen op of the step below autograd: the
data's, each micro-batch's forward and backward, and the optimizer's. For each op it keeps the op's
name, the innermost module running (forward, and backward through the module's gradient hooks),
its occurrence, its non-tensor arguments, and for every input (before the op: in-place ops change
them) and output tensor its shape, dtype and a content hash of its bytes (xxh3-128: a real hash,
so a permutation or a single flipped bit changes it). Ops the dispatcher marks as views
(``aten::t``, ``aten::view``, ...) are left out: they move no bytes, and their consumers hash what
they read (``aten::_unsafe_view``, which is not marked so, stays in). Fused attention's dropout RNG
state is written as ``rng-state``, not hashed (``_run.op_tensors``); memory no op has written yet
(``aten::empty``'s) as ``uninitialized``; a random op's generator state is one more input. The
tracer is ``_run.op_tracer``.

Step 0 is the LoRA init: the setup is built as the run built it, and the ops that create the
adapter (its layers' allocation and their init's draws, under the run's LoRA-init seed) are traced,
each named by the layer PEFT was making when it ran; the line to reproduce is the ledger's ``init``.

The traced step's ledger line is compared with the run's: the trace says at its top whether this
machine reproduced the run (when it does not, the trace shows this machine's step, not the run's).
The format is in ``_run.tracefile``; two traces are compared by ``_proof.trace_compare``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from reprotune._config.loading import config_from_dict
from reprotune._config.schema import ExperimentConfig
from reprotune._formats import TRACE
from reprotune._proof.microscope import kernels_against_run, model_against_run, refuse_untraceable
from reprotune._run.checkpoint import restore_checkpoint
from reprotune._run.checkpoint_files import list_checkpoints, verify_checkpoint
from reprotune._run.fingerprint import attention_of
from reprotune._run.kernels import kernel_facts
from reprotune._run.ledger import init_line, train_line
from reprotune._run.op_tracer import HASH, LoraLayers, ModulePaths, OpTracer, param_labels, trace_environment
from reprotune._run.rundir import RunDir, open_run_dir
from reprotune._run.tracefile import TraceResult, new_trace_path, write_trace
from reprotune._train.setup import Setup, build_setup
from reprotune._train.step import train_step
from reprotune._train.strategy import seed_generators


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


def _recorded(run: RunDir, step: int) -> Mapping[str, Any]:
    """The run's ledger line of ``step`` (its ``init`` line for step 0)."""
    entry = run.ledger.init if step == 0 else run.ledger.train[step - 1]
    return entry.fields if entry is not None else {}


def _differing(run: RunDir, step: int, line: Mapping[str, Any]) -> list[str]:
    """The fields of the replayed ``line`` whose values differ from the run's line of ``step``:
    only those the replay computes are judged (not ``ledger.differing_fields``, both ways), so a
    field an older or newer reprotune wrote beside them in the run's line is no difference."""
    recorded = _recorded(run, step)
    return sorted(k for k in line if recorded.get(k) != line[k])


def trace_step(
    run_dir: str | Path,
    step: int,
    *,
    out: str | Path | None = None,
    report: Callable[[str], None] | None = None,
    from_start: bool = False,
) -> TraceResult:
    """Replay step ``step`` of the run in ``run_dir`` here and write its trace.

    Args:
        run_dir: a single-process run made by ``reprotune run``.
        step: the optimizer step to trace (1-based), or 0: the LoRA init (:func:`_trace_init`).
        out: the trace file (must not exist; ``.gz`` compresses); default
            ``trace-<run_id>-step-<step>.jsonl`` in the current directory.
        report: called with progress lines and warnings (without it, warnings go to stderr).
        from_start: replay from the run's start even where a checkpoint before ``step`` exists.

    Returns:
        Where the trace is, its header, and what the traced step cost.

    Raises:
        InputError: not a run directory, a step outside the run, a Trainer-made or distributed
            run, data that do not match the run's split manifest, an existing ``out``.
    """
    say = report or (lambda line: None)
    run = open_run_dir(run_dir)
    refuse_untraceable(run, step, command=False)
    target = new_trace_path(out, f"trace-{run.run_id}-step-{step}.jsonl")
    cfg = config_from_dict(dict(run.section("config")), source=str(run.layout.record))
    if step == 0:
        return _trace_init(run, cfg, target, say)
    setup = build_setup(cfg, manifest=run.layout.manifest)
    start = _restore(
        setup, run, 1 if from_start else step, report or partial(print, file=sys.stderr, flush=True)
    )
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
    labels = param_labels(setup.model)
    with ModulePaths(setup.model) as modules, OpTracer(modules, labels) as tracer:
        t0 = time.perf_counter()
        done = train_step(setup, setup.order.step_rows(step), step, mark=tracer.mark)
        seconds = time.perf_counter() - t0
    line = _line(setup, step, done, hasher())
    header = _header(run, setup, step, start, line, before, weights_in)
    header["ops"] = len(tracer.ops)
    write_trace(target, header, tracer.ops)
    return TraceResult(target, header, seconds, step_s)


def _trace_init(run: RunDir, cfg: ExperimentConfig, target: Path, say: Callable[[str], None]) -> TraceResult:
    """Trace step 0: the ops that create the LoRA adapter (its layers' allocation and their init's
    draws), with the run's LoRA-init seed, as ``build_setup`` makes them, each named by the layer
    PEFT was making (:class:`~reprotune._run.op_tracer.LoraLayers`). Its line to reproduce is the
    ledger's ``init`` line (the weights as created)."""
    say("trace: tracing the LoRA init (step 0)")
    layers = LoraLayers()
    tracer = OpTracer(layers, {})
    tracer.mark("lora-init")
    timed: list[float] = []
    setup = build_setup(cfg, manifest=run.layout.manifest, observe_lora=_timed(layers, tracer, timed))
    line = init_line(setup.distribution.weights_hasher(setup)())
    header = _header(run, setup, 0, 0, line, {}, None)
    header["ops"] = len(tracer.ops)
    write_trace(target, header, tracer.ops)
    return TraceResult(target, header, timed[0], None)


@contextmanager
def _timed(layers: LoraLayers, tracer: OpTracer, seconds: list[float]) -> Iterator[None]:
    """``layers`` watching and ``tracer`` entered; the seconds they were active appended to
    ``seconds``."""
    t0 = time.perf_counter()
    with layers.watching(), tracer:
        yield
    seconds.append(time.perf_counter() - t0)


def _header(
    run: RunDir,
    setup: Setup,
    step: int,
    start: int,
    line: Mapping[str, Any],
    before: Mapping[str, list[str]],
    weights_in: str | None,
) -> dict[str, Any]:
    """The trace's first line: the run, the step, whether the replay reproduced it, the machine."""
    differs = _differing(run, step, line)
    return TRACE.stamp(
        {
            "run_id": run.run_id,
            "run_dir": str(run.path),  # as given: no local path beyond what the user typed
            "config_sha256": run.record.get("config_sha256"),
            "step": step,
            "replayed_from": start,
            "reproduced": {
                "step": not differs,
                "before": not before,
                "differing_fields": differs,
                "differing_steps_before": dict(before),
                "ledger_line": dict(_recorded(run, step)),
                "replayed_line": dict(line),
            },
            "weights_in_sha256": weights_in,
            "kernels": (here := kernel_facts(attention=attention_of(setup.model))),
            "kernels_vs_run": kernels_against_run(run, here),
            "model_vs_run": model_against_run(run, setup.model_info),
            "environment": trace_environment(setup.device, setup.model),
            "hash": HASH,
        }
    )
