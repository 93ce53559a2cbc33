"""Running a study's runs: each one new, resumed or kept, in this process or in several.

A run's directory tells what to do with it:

- it holds a completed run: verified (same config hash as planned, ledger and adapter bytes as
  its record says) and kept;
- it holds an unfinished run (killed, interrupted, failed): resumed from its latest valid
  checkpoint (``resume_run``), which gives the same bytes as an uninterrupted run;
- otherwise: run from the start (``run_experiment``).

With ``jobs`` 1 every run goes in this process, one after another (no per-run start-up cost);
with more, each run is ``python -m reprotune run|resume`` in its own process, ``jobs`` at a time,
its output in ``logs/<name>.log``, started as verify starts its legs (``_proof.processes``): it ends
with the study (SIGTERM from the kernel, even when the study is SIGKILLed: the run records itself
interrupted, and the same command resumes it), never training on as an orphan. The runs are the
same either way, and so are the refusals: a run's process that exits 2 (bad input, such as a
stratify column the data lacks) is refused here with its message, as a run in this process is.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from reprotune._config.locate import is_key_path
from reprotune._config.schema import config_sha256
from reprotune._errors import InputError, RunFailedError
from reprotune._eval.at_end import evaluate_at_end
from reprotune._eval.layout import run_evals
from reprotune._eval.settings import wants_eval_at_end
from reprotune._jsonio import sha256_file
from reprotune._proof.processes import logged_refusal, start_leg
from reprotune._run.layout import RunLayout
from reprotune._run.record import RunRecord, read_record
from reprotune._studies.layout import StudyLayout
from reprotune._studies.plan import PlannedRun
from reprotune._train.options import RunOptions
from reprotune._train.run import resume_run, run_experiment

Action = Literal["kept", "ran", "resumed"]


@dataclass(frozen=True)
class RunOutcome:
    """A run of the study that is complete, and how it got there in this invocation."""

    planned: PlannedRun
    run_dir: Path
    record: RunRecord
    action: Action
    seconds: float


def execute_runs(
    runs: Sequence[PlannedRun],
    paths: StudyLayout,
    *,
    jobs: int,
    tracking: bool,
    on_done: Callable[[RunOutcome], None],
) -> None:
    """Bring every run in ``runs`` to completion; call ``on_done`` (in this thread) after each.

    Raises:
        InputError: a run directory holds a run of another config, or a completed run whose
            files changed since (the message names it and how to redo it); a run in its own
            process refused its input (exit 2: its message, as a run in this process raises it).
        RunFailedError: a run in its own process failed (the tail of its log is in the message).
    """
    todo: list[PlannedRun] = []
    for planned in runs:
        run_dir = paths.run_dir(planned.name)
        state = _state(planned, run_dir)
        if state == "completed":
            started = time.perf_counter()
            record = _verify_completed(planned, run_dir)
            on_done(RunOutcome(planned, run_dir, record, "kept", time.perf_counter() - started))
        else:
            todo.append(planned)
    if jobs <= 1:
        for planned in todo:
            on_done(_run_here(planned, paths.run_dir(planned.name), tracking))
    else:
        _run_in_processes(todo, paths, jobs=jobs, tracking=tracking, on_done=on_done)


def _state(planned: PlannedRun, run_dir: Path) -> Literal["new", "completed", "unfinished"]:
    paths = RunLayout(run_dir)
    if not paths.is_run_dir():
        return "new"
    record = read_record(paths.record)
    _check_config(planned, run_dir, record)
    return "completed" if record.status == "completed" else "unfinished"


def _check_config(planned: PlannedRun, run_dir: Path, record: RunRecord) -> None:
    expected = config_sha256(planned.config)
    if record.config_sha256 != expected:
        raise InputError(
            f"run directory {run_dir} holds a run of another config (config sha256 "
            f"{record.config_sha256[:12]}, the study plans {expected[:12]} for {planned.name})",
            source=str(RunLayout(run_dir).record),
            fix=f"remove {run_dir} to let the study redo it, or give the study another --out directory",
        )


def _verify_completed(planned: PlannedRun, run_dir: Path) -> RunRecord:
    """The record of a completed run whose ledger and adapter are still the bytes it recorded."""
    paths = RunLayout(run_dir)
    record = read_record(paths.record)
    _check_config(planned, run_dir, record)
    outputs = record.outputs
    for what, file, recorded in (
        ("ledger", paths.ledger, outputs.ledger_sha256 if outputs else None),
        ("adapter", paths.adapter_weights, outputs.adapter_sha256 if outputs else None),
    ):
        actual = sha256_file(file) if file.is_file() else None
        if actual is None or actual != recorded:
            raise InputError(
                f"the completed run {planned.name} no longer matches its record: {file.name} "
                f"{'is missing' if actual is None else f'has sha256 {actual[:12]}'}, the record says "
                f"{str(recorded)[:12]}",
                source=str(file),
                fix=f"remove {run_dir} and run the same `reprotune seeds` command again to redo "
                f"this {what}'s run",
            )
    _evaluate_if_asked(run_dir, record)
    return record


def _evaluate_if_asked(run_dir: Path, record: RunRecord) -> None:
    """The eval ``eval.generate_at_end`` asks for, where the run has none yet: a run made in this
    process (``--jobs 1``) or one whose process was killed during its eval. ``reprotune run`` in its
    own process (``--jobs`` > 1) has made it already, so the study is the same either way."""
    if wants_eval_at_end(record) and not run_evals(run_dir):
        evaluate_at_end(run_dir, record, report=lambda line: print(line, file=sys.stderr, flush=True))


def _run_here(planned: PlannedRun, run_dir: Path, tracking: bool) -> RunOutcome:
    started = time.perf_counter()
    options = RunOptions(run_dir=run_dir, progress=False, tracking=tracking)
    action: Action
    if _state(planned, run_dir) == "unfinished":
        result, action = resume_run(run_dir, options), "resumed"
    else:
        result, action = run_experiment(planned.config, options), "ran"
    seconds = time.perf_counter() - started
    return RunOutcome(planned, run_dir, _verify_completed(planned, Path(result.run_dir)), action, seconds)


def _command(planned: PlannedRun, paths: StudyLayout, tracking: bool) -> tuple[list[str], Action]:
    run_dir = paths.run_dir(planned.name)
    quiet = ["--no-progress"] + ([] if tracking else ["--no-tracking"])
    if _state(planned, run_dir) == "unfinished":
        return ["resume", str(run_dir), *quiet], "resumed"
    sets = [arg for value in planned.overrides for arg in ("--set", value)]
    return ["run", str(paths.config), "--run-dir", str(run_dir), *quiet, *sets], "ran"


def _subprocess(planned: PlannedRun, paths: StudyLayout, tracking: bool) -> RunOutcome:
    args, action = _command(planned, paths, tracking)
    log = paths.log(planned.name)
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log, "ab") as out:
        out.write(f"$ reprotune {' '.join(args)}\n".encode())
        out.flush()
        code = start_leg(
            [sys.executable, "-m", "reprotune", *args], out, dict(os.environ), own_group=False
        ).wait()
    seconds = time.perf_counter() - started
    if code == 2:  # bad input: the refusal `--jobs 1` gives, not a run that failed
        raise _refusal(log, paths.config)
    if code != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-12:]
        raise RunFailedError(
            f"run {planned.name} failed with exit code {code}:\n" + "\n".join(tail),
            source=str(log),
            fix="fix what the log says, then run the same `reprotune seeds` command again to continue",
        )
    run_dir = paths.run_dir(planned.name)
    return RunOutcome(planned, run_dir, _verify_completed(planned, run_dir), action, seconds)


def _refusal(log: Path, config: Path) -> InputError:
    """The refusal a run's process printed (``_proof.processes.logged_refusal``) as this process's
    own. Where it names a key of the study's config.yaml (the config every run's process reads),
    the key is the source again, as a run in this process gives it, so that the CLI points at the
    user's ``--set`` or config line, not at a copy."""
    text, fix, found = logged_refusal(log)
    located = re.match(rf"{re.escape(str(config))}(?:, [^()]*)? \(key ([^,)]+)[^)]*\): ", text)
    if located is not None and is_key_path(located.group(1)):
        return InputError(text[located.end() :], source=located.group(1), fix=fix)
    return InputError(text, source=None if found else str(log), fix=fix)


def _run_in_processes(
    todo: Sequence[PlannedRun],
    paths: StudyLayout,
    *,
    jobs: int,
    tracking: bool,
    on_done: Callable[[RunOutcome], None],
) -> None:
    failures: list[BaseException] = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        pending: set[Future[RunOutcome]] = {pool.submit(_subprocess, p, paths, tracking) for p in todo}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    error = future.exception()
                    if error is not None:
                        failures.append(error)
                    else:
                        on_done(future.result())
        except BaseException:  # Ctrl-C: the runs not started yet are not started (leaving the
            for future in pending:  # pool waits for those that run, which the Ctrl-C stops too)
                future.cancel()
            raise
    if failures:
        raise _one_error(failures)


def _one_error(failures: Sequence[BaseException]) -> BaseException:
    """The error of runs that failed or were refused: one refusal that every run gave alike (a
    config the runs refuse refuses them all) is raised as it is, exit 2 as with ``--jobs 1``;
    several are listed, a refusal making the whole bad input."""
    refusals = list({str(f): f for f in failures if isinstance(f, InputError)}.values())
    others = [f for f in failures if not isinstance(f, InputError)]
    if len(refusals) + len(others) == 1:
        return (refusals or others)[0]
    listed = f"{len(failures)} runs failed:\n" + "\n\n".join(map(str, [*refusals, *others]))
    fix = "fix what the logs say, then run the same `reprotune seeds` command again to continue"
    return InputError(listed, fix=fix) if refusals else RunFailedError(listed, fix=fix)
