"""``reprotune trace RUN_DIR --step K --command CMD``: a step of a Trainer-made run, traced by
running the user's script.

reprotune cannot rebuild a user's script, so the script itself runs, in a fresh process of its own
group (``command_legs.Runner``, as ``verify --command``'s legs run), into a run directory of its own
in a temporary folder, steered by the callback's variables: stop after step K, trace step K
(``integrations._tracing``). Where the run saved a Trainer checkpoint at or before step K - 1 (one
its callback marked as the run's), the script resumes from the newest, with the Trainer's own
``resume_from_checkpoint``, as a branch of the run, and trains from there; else (or with
``from_start``) it trains from its start. The trace it wrote is then judged against the run in
``RUN_DIR``: did the script's lines from where it started to step K reproduce the run's ledger,
field by field, and do this environment's kernel facts match the run's. Never imports torch.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from reprotune._config.secrets import mask_command
from reprotune._errors import RunFailedError
from reprotune._jsonio import read_json_object
from reprotune._proof.command_legs import Runner, parse_command
from reprotune._proof.microscope import kernels_against_run, model_against_run, refuse_untraceable
from reprotune._run.checkpoint_files import TRAINER_CHECKPOINT_MARKER
from reprotune._run.layout import RECORD
from reprotune._run.ledger import differing_fields
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
    from_start: bool = False,
) -> TraceResult:
    """Run ``command`` (the script that made the Trainer-made run in ``run_dir``) up to step
    ``step``, from the run's newest Trainer checkpoint before it (``from_start``: from the
    script's start), have its callback trace that step, and write the trace judged against the run.

    Raises:
        InputError: not a Trainer-made run, a run on several processes, a step outside the run, an
            empty command or one that writes no run directory, an existing ``out``.
        RunFailedError: the command failed, or ran without tracing the step.
    """
    run = open_run_dir(run_dir)
    refuse_untraceable(run, step, command=True)
    target = new_trace_path(out, f"trace-{run.run_id}-step-{step}.jsonl")
    log = target.with_name(f"{target.name}.log")  # the script's output: kept when it fails
    kept = log.exists()  # an earlier failure's log (or a file of the user's): appended to, kept
    target.parent.mkdir(parents=True, exist_ok=True)  # as a trace's missing directory is made
    start, checkpoint, why = (0, None, "") if from_start else trainer_checkpoint(run, step)
    with tempfile.TemporaryDirectory(prefix="reprotune-trace-") as folder:
        work = Path(folder)
        raw = work / "step.trace.jsonl"
        say = report or (lambda line: None)
        runner = Runner(parse_command(command), log, Path.cwd(), say, tool="trace")
        controls = Controls(
            run_dir=work / "run",
            stop_after=step,
            resume_from=checkpoint,
            branch_from=run.path.resolve() if checkpoint else None,  # where the run lies now
            trace_step=step,
            trace_out=raw,
        )
        started = time.perf_counter()
        made = open_run_dir(_leg(runner, controls, start, step, _start_label(step, from_start, why)))
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
        header = _judged(dict(trace.header), run, made, (start, step), command)
        write_trace(target, header, trace.ops)
    if not kept:
        log.unlink(missing_ok=True)
    return TraceResult(target, header, seconds, None)


def trainer_checkpoint(run: RunDir, step: int) -> tuple[int, Path | None, str]:
    """The newest Trainer checkpoint of the completed ``run`` at or before step ``step`` - 1, in
    the Trainer's output directory it recorded (relative to where the command runs, as when the
    run was made), that its callback marked as this run's: its step, its path and ``""``; or
    ``(0, None, why)`` when there is none (the script then trains from its start).

    A marker names the run's id, the step and the run directory it was saved for. The latter is
    this run directory, one that no longer holds this run (the run directory was moved since), or
    none (the id and the step are the run's; the script branches from where the run lies now):
    a copy of the run that still stands elsewhere (resumed there, its checkpoints may be its own)
    is not this run."""
    status, output_dir = run.record.get("status"), _output_dir(run)
    if status != "completed":
        return 0, None, f"the run is {status}, not completed"
    if output_dir is None:
        return 0, None, "the run recorded no Trainer output directory"
    found: list[tuple[int, Path]] = []
    copies: set[str] = set()
    for path in Path(output_dir).glob("checkpoint-*"):
        at = path.name.removeprefix("checkpoint-")
        if not (at.isascii() and at.isdigit()) or not 1 <= int(at) < step:
            continue
        marker = read_json_object(path / TRAINER_CHECKPOINT_MARKER)
        if marker.get("run_id") != run.run_id or marker.get("step") != int(at):
            continue
        saved_for = marker.get("run_dir")
        if isinstance(saved_for, str) and _holds_another_copy(Path(saved_for), run):
            copies.add(saved_for)
        else:
            found.append((int(at), path.resolve()))
    if found:
        return *max(found), ""
    if copies:
        return (
            0,
            None,
            f"the checkpoints of this run in {output_dir!r} are those of its copy in {min(copies)!r}",
        )
    return 0, None, f"no checkpoint of this run before step {step} in {output_dir!r}, seen from here"


def _holds_another_copy(saved_for: Path, run: RunDir) -> bool:
    """Whether ``saved_for``, a run directory a checkpoint marker names, is not ``run``'s own but
    still holds a run of its id (a copy of the run)."""
    if saved_for.resolve() == run.path.resolve():
        return False
    return read_json_object(saved_for / RECORD).get("run_id") == run.run_id


def _output_dir(run: RunDir) -> str | None:
    """The Trainer's output directory the run recorded (where its checkpoints went), or None."""
    args = run.section("trainer").get("args")
    output_dir = args.get("output_dir") if isinstance(args, Mapping) else None
    return output_dir if isinstance(output_dir, str) else None


def _start_label(step: int, from_start: bool, why: str) -> str:
    """The progress label of a run of the script from its start, saying ``why`` not from a
    checkpoint."""
    if from_start:
        return f"the command, from its start (--from-start) up to step {step}"
    if step == 1:
        return "the command, up to step 1"
    return f"the command, from its start up to step {step} ({why})"


def _leg(runner: Runner, controls: Controls, start: int, step: int, start_label: str) -> Path:
    """The script's run up to ``step``: from its start (``start_label`` says why), or resumed from
    ``controls.resume_from`` (the run's checkpoint of step ``start``); a failure of the latter says
    how to do without it."""
    if controls.resume_from is None:
        return runner.leg("reference", controls, label=start_label)
    label = f"the command, from the run's Trainer checkpoint of step {start} up to step {step}"
    try:
        return runner.leg("reference", controls, label=label)
    except RunFailedError as exc:
        raise RunFailedError(
            exc.message,
            source=exc.source,
            fix="; ".join(
                filter(
                    None,
                    (
                        exc.fix,
                        f"the script resumed from the run's checkpoint {controls.resume_from}: if it "
                        "refused it (the script's code or settings are no longer the run's), trace "
                        "from the script's start with --from-start",
                    ),
                )
            ),
        ) from None


def _judged(
    header: dict[str, Any], run: RunDir, made: RunDir, steps: tuple[int, int], command: str
) -> dict[str, Any]:
    """The header of the script's trace, judged against the run it traces: the run's identity,
    whether the script's ledger lines after the step it started from up to the traced step
    (``steps``) are the run's, the kernel facts here against the run's; the command and the
    config its run recorded kept beside."""
    (start, step), ours, theirs = steps, made.ledger.train, run.ledger.train
    before = {
        str(s): list(diff)
        for s in range(start + 1, step)
        if (diff := differing_fields(theirs[s - 1].fields, ours[s - 1].fields if s <= len(ours) else {}))
    }
    line = dict(ours[step - 1].fields) if step <= len(ours) else {}
    differs = differing_fields(theirs[step - 1].fields, line)
    header.update(
        run_id=run.run_id,
        run_dir=str(run.path),  # as given: no local path beyond what the user typed
        replayed_from=start,
        config_sha256=made.record.get("config_sha256"),
        command=mask_command(command),  # a trace is fit to send: no secret from the command line
        reproduced={
            "step": not differs,
            "before": not before,
            "differing_fields": list(differs),
            "differing_steps_before": before,
            "ledger_line": dict(theirs[step - 1].fields),
            "replayed_line": line,
        },
        kernels_vs_run=kernels_against_run(run, header["kernels"]),
        model_vs_run=model_against_run(run, made.section("model")),
    )
    return header
