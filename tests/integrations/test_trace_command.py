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

from reprotune._proof.compare import compare_runs
from reprotune._proof.trace_compare import compare_traces
from reprotune._run.tracefile import read_trace
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


def test_a_command_that_fails_keeps_its_log_and_writes_no_trace(project: ScriptProject) -> None:
    args = ["trace", "native", "--step", "1", "--command", "python no-such-script.py", "--out", "x.jsonl"]
    done = run_reprotune(args, cwd=project.root, env={**os.environ, **OFFLINE_ENV}, timeout=300)
    assert done.returncode != 0 and "the command failed with exit code" in done.stderr
    assert not (project.root / "x.jsonl").exists()
    assert "can't open file" in (project.root / "x.jsonl.log").read_text()  # the script's own output
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
