"""``reprotune trace RUN_DIR --step K --command CMD``: a step of a Trainer-made run, traced by
running the user's script.

reprotune cannot rebuild a user's script, so the script itself runs, in a fresh process of its own
group (``command_legs.Runner``, as ``verify --command``'s legs run), into a run directory of its own
in a temporary folder, steered by the callback's variables: stop after step K, trace step K
(``integrations._tracing``). The trace it wrote is then judged against the run in ``RUN_DIR``:
did the script's lines up to step K reproduce the run's ledger, field by field, and do this
environment's kernel facts match the run's. Never imports torch.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from reprotune._config.secrets import mask_secrets
from reprotune._errors import RunFailedError
from reprotune._proof.command_legs import Runner, parse_command
from reprotune._proof.microscope import kernels_against_run, model_against_run, refuse_untraceable
from reprotune._run.rundir import RunDir, open_run_dir
from reprotune._run.tracefile import TraceResult, new_trace_path, read_trace, write_trace
from reprotune.integrations.controls import Controls


def trace_script_step(
    run_dir: str | Path,
    step: int,
    command: str,
    *,
    out: str | Path | None = None,
    report: Callable[[str], None] | None = None,
) -> TraceResult:
    """Run ``command`` (the script that made the Trainer-made run in ``run_dir``) up to step
    ``step``, have its callback trace that step, and write the trace judged against the run.

    Raises:
        InputError: not a Trainer-made run, a run on several processes, a step outside the run, an
            empty command or one that writes no run directory, an existing ``out``.
        RunFailedError: the command failed, or ran without tracing the step.
    """
    run = open_run_dir(run_dir)
    refuse_untraceable(run, step, command=True)
    target = new_trace_path(out, f"trace-{run.run_id}-step-{step}.jsonl")
    log = target.with_name(f"{target.name}.log")  # the script's output: kept when it fails
    with tempfile.TemporaryDirectory(prefix="reprotune-trace-") as folder:
        work = Path(folder)
        raw = work / "step.trace.jsonl"
        say = report or (lambda line: None)
        runner = Runner(parse_command(command), log, Path.cwd(), say, tool="trace")
        controls = Controls(run_dir=work / "run", stop_after=step, trace_step=step, trace_out=raw)
        started = time.perf_counter()
        made = open_run_dir(runner.leg("reference", controls, label=f"the command, up to step {step}"))
        seconds = time.perf_counter() - started
        if not raw.is_file():
            raise RunFailedError(
                f"the command ran but its callback traced no step {step} (it trained "
                f"{len(made.ledger.train)} steps)",
                source=str(log),
                fix="give the command that made the run: its Trainer must reach the step, with the "
                "ReprotuneCallback given when the Trainer is made",
            )
        trace = read_trace(raw)
        header = _judged(dict(trace.header), run, made, step, command)
        write_trace(target, header, trace.ops)
    log.unlink(missing_ok=True)
    return TraceResult(target, header, seconds, None)


def _differing(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _judged(header: dict[str, Any], run: RunDir, made: RunDir, step: int, command: str) -> dict[str, Any]:
    """The header of the script's trace, judged against the run it traces: the run's identity,
    whether the script's ledger lines up to ``step`` are the run's, the kernel facts here against
    the run's; the command and the config its run recorded kept beside."""
    ours, theirs = made.ledger.train, run.ledger.train
    before = {
        str(s): diff
        for s in range(1, step)
        if (diff := _differing(theirs[s - 1].fields, ours[s - 1].fields if s <= len(ours) else {}))
    }
    line = dict(ours[step - 1].fields) if step <= len(ours) else {}
    differs = _differing(theirs[step - 1].fields, line)
    header.update(
        run_id=run.run_id,
        run_dir=str(run.path.resolve()),
        config_sha256=made.record.get("config_sha256"),
        command=mask_secrets(command),  # a trace is fit to send: no token from the command line
        reproduced={
            "step": not differs,
            "before": not before,
            "differing_fields": differs,
            "differing_steps_before": before,
            "ledger_line": dict(theirs[step - 1].fields),
            "replayed_line": line,
        },
        kernels_vs_run=kernels_against_run(run, header["kernels"]),
        model_vs_run=model_against_run(run, made.section("model")),
    )
    return header
