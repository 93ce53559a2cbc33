"""Runs ``reprotune trace`` cannot replay as it replays a ``reprotune run`` run, that part at a
kernel: a Trainer-made run's trace commands run its script (``--command``), and its advice names
the variables that put the advised mode in force (a script has no ``determinism.cpu_isa`` key); a
Trainer script's LoRA init and a run on several processes are not traced, and ``compare`` says so
instead of printing commands that would be refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reprotune._errors import InputError
from reprotune._jsonio import canonical_dumps
from reprotune._proof.compare import compare_runs
from reprotune._proof.trace import trace_step
from rundirs import RunSpec, edit_ledger, write_run_dir


def _environment(vendor: str, capability: str) -> dict[str, Any]:
    cpu = {"aten_capability": capability, "model": f"{vendor} CPU", "vendor": vendor}
    return {"kernels": {"version": 1, "cpu": cpu, "portable": {"cpu_isa": "native"}}}


def _pair(tmp_path: Path, config: dict[str, Any]) -> tuple[Path, Path]:
    """Two runs on an Intel and an AMD CPU that part at step 1."""
    intel = RunSpec(environment=_environment("GenuineIntel", "AVX512"), config=config)
    amd = RunSpec(noise_from_step=1, environment=_environment("AuthenticAMD", "AVX2"), config=config)
    return write_run_dir(tmp_path / "a", intel), write_run_dir(tmp_path / "b", amd)


def test_trainer_made_runs_get_the_modes_variables_and_command_trace_commands(tmp_path: Path) -> None:
    """Two Trainer-made runs that part at step 1: the advice names the mode's variables (a script has
    no config key), and each trace command runs that run's script (``--command``), for the user to
    fill in; ``trace`` without ``--command`` refuses such a run, naming it."""
    a, b = _pair(tmp_path, {"trainer": {"class": "transformers.trainer.Trainer", "args": {}}})
    result = compare_runs(a, b)
    cause = result.causes[0]
    assert "CPU kernels differ: CPU capability AVX512 vs AVX2" in cause
    assert (
        "determinism.cpu_isa: avx2-compatible on both pins CPU kernels to the one baseline Intel and AMD "
        "CPUs share, on MKL's slower vendor-neutral branch: for a Trainer script, start both with "
        "ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 MKL_CBWR=COMPATIBLE,STRICT "
        "ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 python ..., with the fused AdamW "
        '(optim="adamw_torch_fused")'
    ) in cause
    assert cause.endswith("the trace commands below find the first op)")
    assert result.next_steps[1] == (
        f"  reprotune trace {a} --step 1 --command '<the command that made run A>' --out A-step-1.trace.jsonl"
    )
    with pytest.raises(InputError, match="written by a Trainer callback") as refused:
        trace_step(a, 1, out=tmp_path / "t.jsonl")
    assert "--command" in str(refused.value.fix)
    assert not (tmp_path / "t.jsonl").exists()


def test_trainer_made_runs_that_part_at_the_lora_init_are_told_trace_cannot_see_it(tmp_path: Path) -> None:
    """The LoRA init of a Trainer script is the script's own code: no step-0 command is offered."""
    config = {"trainer": {"class": "transformers.trainer.Trainer", "args": {}}}
    a = write_run_dir(
        tmp_path / "a", RunSpec(environment=_environment("GenuineIntel", "AVX512"), config=config)
    )
    spec = RunSpec(noise_from_step=1, environment=_environment("GenuineIntel", "AVX2"), config=config)
    b = write_run_dir(tmp_path / "b", spec)
    edit_ledger(b, 0, "weights_sha256", "e" * 64, kind="init", as_written=True)
    result = compare_runs(a, b)
    assert result.where.first_divergence_step == 0
    assert result.causes[0].endswith("`reprotune trace` cannot replay these runs: below)")
    assert result.next_steps == (
        "the runs part at their initial LoRA weights (step 0), which a Trainer script makes in its own "
        "code before the Trainer: reprotune trace follows the Trainer's optimizer steps, not that code; "
        "the kernel facts above are what differs",
    )


def test_runs_made_by_reprotune_run_keep_the_config_key_and_the_commands(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, {})
    result = compare_runs(a, b)
    assert "Trainer script" not in result.causes[0]
    assert result.causes[0].endswith("the trace commands below find the first op)")
    assert "reprotune trace " in result.next_steps[1] and "--step 1 " in result.next_steps[1]


@pytest.mark.parametrize(("world", "how"), [(2, "on 2 processes"), (1, "under torchrun (one process)")])
def test_a_run_made_under_torchrun_is_said_untraceable_with_the_way_round(
    tmp_path: Path, world: int, how: str
) -> None:
    """Both runs under torchrun, on two machines that part at a kernel: untraceable, also at world
    size 1, where dropout is seeded per micro-batch as on several processes (before, the trace
    replayed it as a plain run and said this machine did not reproduce it)."""
    a, b = _pair(tmp_path, {})
    for run in (a, b):
        record = json.loads((run / "record.json").read_text())
        record["distributed"] = {**record.get("distributed", {}), "world_size": world, "launcher": "torchrun"}
        (run / "record.json").write_text(canonical_dumps(record))
    result = compare_runs(a, b)
    assert "CPU kernels differ" in result.causes[0]
    assert result.causes[0].endswith("`reprotune trace` cannot replay these runs: below)")
    assert result.next_steps == tuple(
        f"reprotune trace cannot replay run {label}: it trained {how}, its dropout seeded per micro-batch; "
        "a trace replays a run made without torchrun; run its config in one process without torchrun "
        "(`reprotune run CONFIG`) and trace that run's step"
        for label in "AB"
    )


def test_a_trainer_trace_is_judged_against_its_run_and_keeps_no_token(tmp_path: Path) -> None:
    """What ``trace --command`` writes over the script's own header: the run's identity, each step's
    ledger fields that differ from the run's (here the script's run parts at step 3), the kernel
    facts against the run's, and the command with a token masked (a trace is fit to send)."""
    from reprotune._proof.trace_command import _judged
    from reprotune._run.rundir import open_run_dir

    config = {"trainer": {"class": "transformers.trainer.Trainer", "args": {}}}
    run = write_run_dir(tmp_path / "run", RunSpec(config=config))
    made = write_run_dir(tmp_path / "made", RunSpec(config=config, noise_from_step=3))
    token = "hf_" + "Q" * 34
    kernels = json.loads((run / "record.json").read_text())["environment"].get("kernels") or {"version": 1}
    header = _judged(
        {"kernels": kernels}, open_run_dir(run), open_run_dir(made), (0, 4), f"python t.py --token {token}"
    )
    assert token not in header["command"] and header["command"].startswith("python t.py --token ")
    assert header["run_id"] == open_run_dir(run).run_id
    reproduced = header["reproduced"]
    assert (reproduced["step"], reproduced["before"]) == (False, False)
    assert set(reproduced["differing_steps_before"]) == {"3"} and "loss" in reproduced["differing_fields"]
    assert header["replayed_from"] == 0
    same = _judged({"kernels": kernels}, open_run_dir(run), open_run_dir(run), (0, 4), "python t.py")
    assert (same["reproduced"]["step"], same["reproduced"]["before"]) == (True, True)
    # Resumed from the run's checkpoint of step 3, the script made step 4 alone: the lines up to
    # the checkpoint are the run's own (copied into the branch), and are not judged.
    resumed = _judged({"kernels": kernels}, open_run_dir(run), open_run_dir(made), (3, 4), "python t.py")
    assert resumed["replayed_from"] == 3 and resumed["reproduced"]["differing_steps_before"] == {}
    assert resumed["reproduced"]["step"] is False


def test_a_trainer_trace_resumes_from_the_runs_newest_marked_checkpoint_before_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Trainer checkpoint ``trace --command`` has the script resume from: the newest at or
    before step K - 1 in the output directory the run recorded (relative to where the command
    runs), that the callback marked as this run's, for this run directory or one that no longer
    holds the run (moved), not for a copy of the run that still stands elsewhere; none (the
    script's start) for a run that did not complete, and the progress line says why."""
    import shutil

    from reprotune._proof.trace_command import _start_label, trainer_checkpoint
    from reprotune._run.checkpoint_files import TRAINER_CHECKPOINT_MARKER
    from reprotune._run.rundir import open_run_dir

    run_path = write_run_dir(tmp_path / "run", RunSpec())
    record = json.loads((run_path / "record.json").read_text())
    record["trainer"] = {"args": {"output_dir": "out"}}
    (run_path / "record.json").write_text(canonical_dumps(record))
    monkeypatch.chdir(tmp_path)

    def checkpoint(step: int, **marker: Any) -> Path:
        folder = tmp_path / "out" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        mine = {"run_dir": str(run_path), "run_id": record["run_id"], "step": step}
        (folder / TRAINER_CHECKPOINT_MARKER).write_text(json.dumps({**mine, **marker}))
        return folder

    two, four = (checkpoint(step).resolve() for step in (2, 4))
    checkpoint(5, run_id="20260101-000000-other000")  # another run's
    copy = shutil.copytree(run_path, tmp_path / "copy")  # a copy of the run, still standing
    checkpoint(3, run_dir=str(copy))
    (tmp_path / "out" / "checkpoint-1").mkdir()  # saved before the callback saw it: no marker
    (tmp_path / "out" / "checkpoint-last").mkdir()
    run = open_run_dir(run_path)
    assert trainer_checkpoint(run, 7) == (4, four, "") and trainer_checkpoint(run, 4) == (2, two, "")
    assert trainer_checkpoint(run, 2) == (
        0,
        None,
        "no checkpoint of this run before step 2 in 'out', seen from here",
    )
    shutil.rmtree(two)
    assert trainer_checkpoint(run, 4) == (
        0,
        None,
        f"the checkpoints of this run in 'out' are those of its copy in {str(copy)!r}",
    )
    # the run directory moved since it saved its checkpoints: they are still its own
    six = checkpoint(6).resolve()
    moved = open_run_dir(run_path.rename(tmp_path / "moved"))
    assert trainer_checkpoint(moved, 7) == (6, six, "")
    # where the script starts from its start, the progress line says why
    assert _start_label(1, False, "") == "the command, up to step 1"
    assert _start_label(2, True, "") == "the command, from its start (--from-start) up to step 2"
    assert _start_label(2, False, "why") == "the command, from its start up to step 2 (why)"
    record["status"] = "stopped"
    (tmp_path / "moved" / "record.json").write_text(canonical_dumps(record))
    assert trainer_checkpoint(open_run_dir(tmp_path / "moved"), 7) == (
        0,
        None,
        "the run is stopped, not completed",
    )
    record["status"], record["trainer"] = "completed", {}
    (tmp_path / "moved" / "record.json").write_text(canonical_dumps(record))
    assert trainer_checkpoint(open_run_dir(tmp_path / "moved"), 7) == (
        0,
        None,
        "the run recorded no Trainer output directory",
    )
