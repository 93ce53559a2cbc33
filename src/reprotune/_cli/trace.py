"""``reprotune trace RUN_DIR --step K``: the op-level fingerprint of one replayed optimizer step.

Each machine traces its own run at the first step where the two runs part; ``reprotune compare
TRACE_A TRACE_B`` then names the first op whose inputs agree and outputs do not (docs/microscope.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from reprotune._cli._options import path_value, pin_cpu_isa_of_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=path_value, metavar="RUN_DIR", help="a run directory (reprotune run)")
    parser.add_argument(
        "--step", type=int, required=True, metavar="K", help="the optimizer step to trace (0: the LoRA init)"
    )
    parser.add_argument(
        "--out",
        type=path_value,
        default=None,
        metavar="FILE",
        help="the trace file to write (must not exist; .gz compresses); "
        "default trace-<run-id>-step-<K>.jsonl here",
    )
    parser.add_argument(
        "--command",
        dest="script_command",  # `command` names the subcommand
        default=None,
        metavar="CMD",
        help="for a run made by a Trainer script: the command that made it (run here up to step K, "
        "its callback tracing that step)",
    )
    parser.add_argument(
        "--from-start",
        action="store_true",
        help="replay from the run's start, not from its newest checkpoint before step K (a Trainer "
        "script's checkpoint is resumed by the script itself, which refuses it once its code or "
        "settings are no longer the run's)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress lines (warnings still show)")


def run(args: argparse.Namespace) -> int:
    pin_cpu_isa_of_run(args.run_dir)  # before torch loads
    from reprotune._proof.microscope import trace_command
    from reprotune._proof.trace import trace_step
    from reprotune._train.hooks import hf_progress_bars

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report = None if args.no_progress else progress
    if args.script_command is not None:
        from reprotune._proof.trace_command import trace_script_step
        from reprotune._run.signals import interrupt_on_signals

        # SIGTERM or SIGHUP ends it as Ctrl-C does: the script's group stopped, its folder removed
        with interrupt_on_signals():
            result = trace_script_step(
                args.run_dir,
                args.step,
                args.script_command,
                out=args.out,
                report=report,
                from_start=args.from_start,
            )
    else:
        with hf_progress_bars(not args.no_progress):  # without a report, trace_step still warns
            result = trace_step(
                args.run_dir, args.step, out=args.out, report=report, from_start=args.from_start
            )
    header = result.header
    reproduced = header["reproduced"]
    init = header["step"] == 0
    print(f"trace of step {header['step']}{' (the LoRA init)' if init else ''} of run {header['run_id']}")
    print(f"  trace file        {result.path}")
    print(f"  ops               {header['ops']}")
    start = header["replayed_from"]
    print(f"  replayed from     {'the start' if start == 0 else f'the checkpoint of step {start}'}")
    print(f"  reproduced        {reproduced_words(reproduced, init)}")
    print(f"  device            {device_line(header)}")
    print(f"  CPU capability    {header['kernels']['cpu']['aten_capability']}")
    against = header.get("kernels_vs_run") or {}
    if against.get("differences"):
        print(f"  kernels           NOT the run's (run vs here): {'; '.join(against['differences'])}")
        if against.get("assignments"):
            again = trace_command(
                str(args.run_dir),
                header["step"],
                against["assignments"],
                str(result.path.with_name(f"as-made-{result.path.name}")),  # this one stays
                command=args.script_command,
            )
            again += " --from-start" if args.from_start else ""
            print(f"                    trace again as the run was made: {again}")
    model = header.get("model_vs_run") or []
    if model:
        print(f"  base model        NOT the run's (run vs here): {'; '.join(model)}")
    if args.script_command is not None:
        print(f"  the command       {result.seconds:.2f} s (the script up to step {header['step']})")
    else:
        print(
            f"  traced {'init' if init else 'step'}       {result.seconds:.2f} s"
            + (f" (a plain step: {result.step_s:.2f} s)" if result.step_s else "")
        )
    return 0


def reproduced_words(reproduced: Mapping[str, Any], init: bool) -> str:
    """Whether the replay gave the run's own ledger line(s), in words: which fields of the traced
    step differ, or which steps before it (the traced step may agree when an earlier one did not)."""
    if reproduced["step"] and reproduced["before"]:
        what = (
            "the LoRA init gave the run's own init line"
            if init
            else "the replayed step gave the run's own ledger line"
        )
        return f"yes: {what}, bit for bit"
    fields = ", ".join(reproduced["differing_fields"])
    before = ", ".join(reproduced.get("differing_steps_before") or {})
    what = (
        f"step differs from the run's ({fields})"
        if fields
        else f"steps before it ({before}) differ from the run's"
    )
    return (
        f"NO: this machine's {what}; the trace\n"
        "                    shows this machine's step (compare it with a trace made where the run was)"
    )


def device_line(header: Mapping[str, Any]) -> str:
    """Where the step was replayed: ``cpu``, or a CUDA device with the GPU and the libraries that
    choose its kernels (from the trace's kernel facts); a trace from before says not recorded."""
    device = str((header.get("environment") or {}).get("device") or "not recorded")
    cuda = (header.get("kernels") or {}).get("cuda") or {}
    gpus = cuda.get("devices") or []
    if not device.startswith("cuda") or not gpus:
        return device
    index = int(device.partition(":")[2] or 0)
    gpu = next((g for g in gpus if g.get("index") == index), gpus[0])
    return (
        f"{device} ({gpu.get('name')}, compute capability {gpu.get('capability')}, "
        f"{gpu.get('sm_count')} SMs; CUDA {cuda.get('cuda_runtime')}, cuBLAS {cuda.get('cublas')}, "
        f"cuDNN {cuda.get('cudnn')})"
    )
