"""``reprotune trace RUN --step K --command CMD``: a Trainer script's step under the microscope. The
example Trainer script runs on the tiny model with this CPU's kernels and with a lesser CPU's
(``ATEN_CPU_CAPABILITY=default``); ``compare`` gives the trace commands with ``--command``; each
side traces its own run by running the script under its own kernels; the traces name the first op
that differs, and each says it reproduced its run's ledger line."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
from trainer_scripts import OFFLINE_ENV, ScriptProject

from reprotune._determinism.isa import BASELINES
from reprotune._proof.compare import compare_runs
from reprotune._proof.trace_compare import compare_traces
from reprotune._run.tracefile import LOSS_LOG_HASH, Trace, read_trace
from warm import run_reprotune

LESSER = {"ATEN_CPU_CAPABILITY": "default"}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> ScriptProject:
    project = ScriptProject.create(tmp_path_factory.mktemp("trace-command"))
    project.run("hf_trainer.py", "native")
    project.run("hf_trainer.py", "lesser", env=LESSER)
    return project


def _trace(project: ScriptProject, run: str, step: int, out: str, env: dict[str, str]) -> str:
    command = shlex.join(project.argv("hf_trainer.py", "--output-dir", f"out/trace-{out}"))
    args = ["trace", run, "--step", str(step), "--command", command, "--out", out, "--no-progress"]
    done = run_reprotune(args, cwd=project.root, env={**os.environ, **OFFLINE_ENV, **env}, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout


def test_a_trainer_scripts_step_traced_on_each_side_names_the_first_op(project: ScriptProject) -> None:
    result = compare_runs(project.root / "native", project.root / "lesser")
    step = result.where.first_divergence_step
    assert step is not None and step >= 1, result.format()
    assert (
        "CPU kernels differ: CPU capability" in result.causes[0]
        and "for a Trainer script" in result.causes[0]
    )
    assert "--command '<the command that made run A>'" in result.next_steps[1]
    shown = _trace(project, "native", step, "a.jsonl", {})
    assert "reproduced        yes: the replayed step gave the run's own ledger line" in shown
    _trace(project, "lesser", step, "b.jsonl", LESSER)
    ta, tb = read_trace(project.root / "a.jsonl"), read_trace(project.root / "b.jsonl")
    assert ta.header["reproduced"]["step"] and ta.header["reproduced"]["before"]
    assert tb.header["reproduced"]["step"] and tb.header["kernels_vs_run"]["differences"] == []
    assert ta.header["run_id"] == result.run_a.run_id and ta.header["command"].endswith("out/trace-a.jsonl")
    assert ta.header["weights_in_sha256"] == tb.header["weights_in_sha256"]  # equal going in
    phases = {op.phase.split(".")[0] for op in ta.ops}
    assert phases == {"forward", "backward", "optimizer"}
    assert any(op.module.endswith("self_attn.q_proj.lora_A.default") for op in ta.ops)
    found = compare_traces(ta, tb)
    assert found.finding == "kernel", found.format()
    assert found.explanation[0].startswith(f"step {step}, ")
    assert "same inputs, different outputs: the kernel differs (CPU capability" in found.explanation[0]
    assert not list(project.root.glob("*.jsonl.log"))  # the script's log is removed when it succeeds


def test_a_trainer_run_made_in_a_portable_mode_is_traced_in_it(project: ScriptProject) -> None:
    """A Trainer script run with ``avx2-compatible``'s variables (a script has no config key: its
    record's kernel facts say the mode was in force): ``trace --command``, given none of them, puts
    the mode in force itself before the script starts, so the step is traced under the run's
    kernels and reproduces the run's line."""
    project.run("hf_trainer.py", "portable", env=dict(BASELINES["avx2-compatible"].env))
    shown = _trace(project, "portable", 2, "portable.jsonl", {})
    header = read_trace(project.root / "portable.jsonl").header
    assert header["kernels_vs_run"]["differences"] == [], shown
    assert header["reproduced"]["step"] and header["reproduced"]["before"]
    assert "kernels NOT" not in shown


def test_a_command_that_fails_keeps_its_log_and_writes_no_trace(project: ScriptProject) -> None:
    out = "logs/x.jsonl"  # in a directory that is not there yet: made, as for any trace
    args = ["trace", "native", "--step", "1", "--command", "python no-such-script.py", "--out", out]
    done = run_reprotune(args, cwd=project.root, env={**os.environ, **OFFLINE_ENV}, timeout=300)
    assert done.returncode != 0 and "the command failed with exit code" in done.stderr
    assert not (project.root / out).exists()
    assert "can't open file" in (project.root / "logs" / "x.jsonl.log").read_text()  # the script's own output
    # again, with the script's command: the trace is written, and the log that was there before
    # (an earlier failure's, or a file of the user's) is appended to and kept, not removed
    _trace(project, "native", 1, out, {})
    assert read_trace(project.root / out).header["reproduced"]["step"]
    assert "can't open file" in (project.root / "logs" / "x.jsonl.log").read_text()
    args = ["trace", "native", "--step", "1", "--out", "y.jsonl"]
    done = run_reprotune(args, cwd=project.root, env={**os.environ, **OFFLINE_ENV}, timeout=300)
    assert done.returncode == 2 and "was written by a Trainer callback" in done.stderr
    assert "--command" in done.stderr


def test_a_run_made_by_reprotune_run_is_traced_without_command(tmp_path: Path) -> None:
    from tinyrun import TinyProject

    tiny = TinyProject.create(tmp_path)
    tiny.run_cli(
        "run", str(tiny.config("cfg.yaml", train={"max_steps": 2})), "--run-dir", "r", "--no-progress"
    )
    done = tiny.run_cli("trace", "r", "--step", "1", "--command", "python x.py", check=False)
    assert (
        done.returncode == 2
        and "was made by `reprotune run`: trace replays it without --command" in done.stderr
    )


def test_a_step_is_traced_from_the_runs_trainer_checkpoint_as_from_the_scripts_start(tmp_path: Path) -> None:
    """A run that saved a Trainer checkpoint every 2 steps: step 5 is traced with the script
    resumed from the run's step-4 checkpoint (a branch of the run, the checkpoint only read), and
    its ops are those of step 5 traced from the script's start (``--from-start``), bit for bit;
    each reproduced the run's ledger line."""
    project = ScriptProject.create(tmp_path)
    project.run("hf_trainer.py", "saved", "--save-steps", "2")
    checkpoints = project.root / "out" / "saved"
    saved = {p.name: sorted(f.name for f in p.iterdir()) for p in checkpoints.iterdir()}
    assert sorted(saved) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    command = shlex.join(project.argv("hf_trainer.py", "--save-steps", "2", "--output-dir", "out/saved"))

    def trace(out: str, *extra: str, run: str = "saved") -> tuple[str, Trace]:
        args = ["trace", run, "--step", "5", "--command", command, "--out", out, "--no-progress", *extra]
        done = run_reprotune(args, cwd=project.root, env={**os.environ, **OFFLINE_ENV}, timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        return done.stdout, read_trace(project.root / out)

    shown, resumed = trace("resumed.jsonl")
    assert "replayed from     the checkpoint of step 4" in shown
    shown, started = trace("started.jsonl", "--from-start")
    assert "replayed from     the start" in shown
    assert (resumed.header["replayed_from"], started.header["replayed_from"]) == (4, 0)
    for trace_file in (resumed, started):
        assert trace_file.header["reproduced"]["step"] and trace_file.header["reproduced"]["before"]
    assert resumed.header["weights_in_sha256"] == started.header["weights_in_sha256"]
    assert len(resumed.ops) > 100 and resumed.ops == started.ops
    # the one op that differed: the Trainer's loss log, which the resume starts again at 0
    logged = [op for op in resumed.ops if LOSS_LOG_HASH in {entry[2] for entry in op.inputs}]
    assert [op.op for op in logged] in (["aten::add_.Tensor"], ["aten::add.Tensor"])  # 5.x, 4.x
    assert {p.name: sorted(f.name for f in p.iterdir()) for p in checkpoints.iterdir()} == saved
    # the run directory moved since: its checkpoints (whose markers name where it was) are still its
    # own, and the script branches from the run where it lies now
    (project.root / "archive").mkdir()
    (project.root / "saved").rename(project.root / "archive" / "saved")
    shown, moved = trace("moved.jsonl", run="archive/saved")
    assert "replayed from     the checkpoint of step 4" in shown
    assert moved.header["reproduced"]["step"] and moved.header["reproduced"]["before"]
    assert moved.ops == started.ops


def test_a_sigterm_while_the_script_runs_stops_it_and_leaves_no_folder(
    project: ScriptProject, tmp_path: Path
) -> None:
    """SIGTERM (a scheduler, `kill`) while the script runs: the trace ends as Ctrl-C ends it, exit
    143, the script stopped, its temporary folder removed (it was left behind, empty) and no
    trace written."""
    import signal
    import subprocess
    import sys

    temp = tmp_path / "tmp"
    temp.mkdir()
    # a script that never ends on its own: the signal surely comes while it runs
    command = shlex.join([sys.executable, "-c", "import time; time.sleep(600)"])
    out = tmp_path / "term.jsonl"
    args = ["trace", "native", "--step", "3", "--command", command, "--out", str(out), "--no-progress"]
    env = {**os.environ, **OFFLINE_ENV, "TMPDIR": str(temp)}
    trace = subprocess.Popen([sys.executable, "-m", "reprotune", *args], cwd=project.root, env=env)
    log = out.with_name("term.jsonl.log")
    try:
        # the script has started once its command line is in the log, its folder made before it
        while not (log.is_file() and log.read_bytes().startswith(b"$ ")):
            with pytest.raises(subprocess.TimeoutExpired):  # still running: it has not ended early
                trace.wait(timeout=0.05)
        assert [p.name[:16] for p in temp.iterdir()] == ["reprotune-trace-"]
        trace.send_signal(signal.SIGTERM)
        assert trace.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        trace.kill()
        trace.wait()
    assert list(temp.iterdir()) == [] and not out.exists()
