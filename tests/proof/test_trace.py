"""The op-level microscope (reprotune trace, compare of traces): inside one machine, the kernels another
CPU would take are steered from the outside (ATen's capability, MKL's instruction cap, oneDNN's ISA
cap), and the two runs, their comparison and their traces say what a colleague's machine would."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from reprotune._jsonio import sha256_file, write_json_atomic
from reprotune._proof.compare import compare_runs
from reprotune._proof.trace import trace_step
from reprotune._proof.trace_compare import compare_traces
from reprotune._run.checkpoint import STATE_FILE, _state_sha256
from reprotune._run.tracefile import read_trace
from tinyrun import TinyProject

#: Kernels below any x86-64 CPU's own: ATen without vectors beyond its baseline, MKL on SSE4.2.
LESSER = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> TinyProject:
    """Two runs of one config: this machine's kernels (``native``), and a lesser CPU's (``lesser``)."""
    project = TinyProject.create(tmp_path_factory.mktemp("microscope"))
    config = project.config("cfg.yaml")
    project.run_cli("run", str(config), "--run-dir", "native", "--no-progress")
    project.run_cli("run", str(config), "--run-dir", "lesser", "--no-progress", env=LESSER)
    return project


def test_other_kernels_diverge_and_compare_names_them(project: TinyProject) -> None:
    """The same config under other kernels DIVERGES; the record's kernel facts say how, the first
    cause names them (never "nothing recorded differs"), and the trace commands of the first
    divergent step follow."""
    result = compare_runs(project.root / "native", project.root / "lesser")
    assert result.verdict.value == "DIVERGED"
    step = result.where.first_divergence_step
    assert step is not None and step >= 1 and result.where.first_batch_step is None
    assert "CPU kernels differ: CPU capability" in result.causes[0] and " vs DEFAULT" in result.causes[0]
    assert not any("nothing recorded differs" in cause for cause in result.causes)
    assert f"--step {step} " in result.next_steps[1] and "reprotune compare A-step" in result.next_steps[-1]
    # B's command carries the kernel settings its run was made with: pasted, it traces B's own step
    settings, _, command = result.next_steps[3].partition(" reprotune trace ")
    assert "ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41" in settings
    assert command.startswith(f"{project.root / 'lesser'} --step {step} ")
    assert "ATEN_CPU_CAPABILITY" not in result.next_steps[1]
    kinds = {d.key for d in result.differences if d.category == "kernels"}
    assert "environment.kernels.cpu.aten_capability" in kinds
    record = json.loads((project.root / "lesser" / "record.json").read_text())
    kernels = record["environment"]["kernels"]
    assert kernels["cpu"]["aten_capability"] == "DEFAULT"  # read back from ATen, not the variable
    assert kernels["steering_env"]["ATEN_CPU_CAPABILITY"] == "default"
    assert kernels["attention"]["implementation"] == "sdpa"


def test_traces_of_the_first_divergent_step_name_the_first_op(project: TinyProject) -> None:
    """Each side traces its own run at the first step where they part, under its own kernels: the
    comparison names the first op with the same inputs and other outputs, its module and the kernel
    facts; each trace says it reproduced its own run's ledger line."""
    step = compare_runs(project.root / "native", project.root / "lesser").where.first_divergence_step
    a, b = project.root / "a.trace.jsonl", project.root / "b.trace.jsonl"
    project.run_cli("trace", "native", "--step", str(step), "--out", str(a), "--no-progress")
    done = project.run_cli(
        "trace", "lesser", "--step", str(step), "--out", str(b), "--no-progress", env=LESSER
    )
    assert "reproduced        yes" in done.stdout
    ta, tb = read_trace(a), read_trace(b)
    assert ta.header["reproduced"]["step"] and tb.header["reproduced"]["step"]
    assert ta.header["weights_in_sha256"] == tb.header["weights_in_sha256"]  # equal going in
    found = compare_traces(ta, tb)
    assert found.finding == "kernel", found.format()
    assert found.op_a is not None and found.op_a.inputs == found.op_b.inputs  # type: ignore[union-attr]
    assert found.op_a.outputs != found.op_b.outputs  # type: ignore[union-attr]
    first = found.explanation[0]
    assert first.startswith(f"step {step}, {found.op_a.phase}, {found.op_a.module}: {found.op_a.op}")
    assert "same inputs, different outputs: the kernel differs (CPU capability" in first
    shown = project.run_cli("compare", str(a), str(b), check=False)
    assert shown.returncode == 1 and "same inputs, different outputs" in shown.stdout


def test_a_trace_made_under_other_kernels_than_its_run_says_so(project: TinyProject, tmp_path: Path) -> None:
    """The lesser run traced without its kernel settings: the trace says its kernels are not the
    run's and which variables to set, and compare of the traces notes it beside its verdict."""
    step = compare_runs(project.root / "native", project.root / "lesser").where.first_divergence_step
    mine, a = tmp_path / "here.jsonl", tmp_path / "a.jsonl"
    done = project.run_cli("trace", "lesser", "--step", str(step), "--out", str(mine), "--no-progress")
    assert "  kernels           NOT the run's (run vs here): CPU capability DEFAULT vs " in done.stdout
    assert (
        "  device            cpu\n" in done.stdout
        and read_trace(mine).header["environment"]["device"] == "cpu"
    )
    assert (
        "trace again as the run was made: ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 "
        f"ONEDNN_MAX_CPU_ISA=SSE41 reprotune trace lesser --step {step} "
        f"--out {tmp_path / 'as-made-here.jsonl'}\n"
    ) in done.stdout
    start = tmp_path / "start.jsonl"
    done = project.run_cli(
        "trace", "lesser", "--step", str(step), "--from-start", "--out", str(start), "--no-progress"
    )
    again = (
        f"SSE41 reprotune trace lesser --step {step} --out {tmp_path / 'as-made-start.jsonl'} --from-start\n"
    )
    assert again in done.stdout  # as it was asked, into a new file
    against = read_trace(mine).header["kernels_vs_run"]
    assert against["assignments"] == [f"{k}={v}" for k, v in LESSER.items()]
    project.run_cli("trace", "native", "--step", str(step), "--out", str(a), "--no-progress")
    assert read_trace(a).header["kernels_vs_run"] == {"differences": [], "assignments": []}
    assert read_trace(a).header["model_vs_run"] == []
    notes = compare_traces(read_trace(a), read_trace(mine)).notes
    assert any(n.startswith("trace B was made under other kernels than its run's") for n in notes)


def test_a_trace_with_another_base_model_than_its_run_says_which_files_and_buffers(tmp_path: Path) -> None:
    """The model's config.json changed after the run (another rotary base): the trace names the
    file and the buffer it changes, run's first, its replay does not reproduce the run, and a
    comparison of traces notes it."""
    other = TinyProject.create(tmp_path / "p")
    other.run_cli("run", str(other.config("cfg.yaml")), "--run-dir", "run", "--no-progress")
    before = other.run_cli("trace", "run", "--step", "1", "--out", str(tmp_path / "a.jsonl"), "--no-progress")
    assert "base model" not in before.stdout
    path = other.root / "tiny-model" / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["rope_parameters"] = {"rope_theta": 100000.0, "rope_type": "default"}
    path.write_text(json.dumps(config), encoding="utf-8")
    done = other.run_cli("trace", "run", "--step", "1", "--out", str(tmp_path / "b.jsonl"), "--no-progress")
    assert "  base model        NOT the run's (run vs here): config.json " in done.stdout, done.stdout
    assert "reproduced        NO" in done.stdout
    changed = read_trace(tmp_path / "b.jsonl").header["model_vs_run"]
    names = [entry.split()[0] for entry in changed]
    assert names[0] == "config.json" and "model.rotary_emb.inv_freq" in names, changed
    notes = compare_traces(read_trace(tmp_path / "a.jsonl"), read_trace(tmp_path / "b.jsonl")).notes
    assert any(
        n.startswith("trace B was made with another base model than its run's (run vs here: ") for n in notes
    )


def test_a_step_traced_twice_is_byte_identical(project: TinyProject) -> None:
    """Two traces of one step on one machine are the same bytes (nothing of the time or process)."""
    one, two = project.root / "twice-1.jsonl", project.root / "twice-2.jsonl"
    for path in (one, two):
        project.run_cli("trace", "native", "--step", "2", "--out", str(path), "--no-progress")
    assert one.read_bytes() == two.read_bytes()
    assert compare_traces(read_trace(one), read_trace(two)).finding == "identical"


def test_a_replay_from_a_checkpoint_equals_one_from_the_start(project: TinyProject, tmp_path: Path) -> None:
    """Step 6 replayed from the step-4 checkpoint and from the run's start (a copy without its
    checkpoints, and the run itself with ``from_start``): the same ops, bit for bit, and each
    reproduces the run's ledger line."""
    copy = tmp_path / "no-checkpoints"
    shutil.copytree(project.root / "native", copy)
    shutil.rmtree(copy / "checkpoints")
    from_checkpoint = trace_step(project.root / "native", 6, out=tmp_path / "ckpt.jsonl")
    from_start = trace_step(copy, 6, out=tmp_path / "start.jsonl")
    asked = trace_step(project.root / "native", 6, out=tmp_path / "asked.jsonl", from_start=True)
    assert [t.header["replayed_from"] for t in (from_checkpoint, from_start, asked)] == [4, 0, 0]
    assert all(t.header["reproduced"]["step"] for t in (from_checkpoint, from_start, asked))
    ops = [path.read_bytes().split(b"\n", 1)[1] for path in sorted(tmp_path.glob("*.jsonl"))]
    assert len(ops) == 3 and ops[0] == ops[1] == ops[2]


def test_a_checkpoint_that_fails_its_check_is_said_even_without_progress(
    project: TinyProject, tmp_path: Path
) -> None:
    """A damaged step-4 checkpoint: ``trace --no-progress`` replays from the start and says why on
    stderr (a warning is not progress); transformers' loading bar stays off."""
    damaged = tmp_path / "damaged"
    shutil.copytree(project.root / "native", damaged)
    weights = damaged / "checkpoints" / "step-00000004" / "trainable.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 0x01
    weights.write_bytes(bytes(raw))
    out = tmp_path / "t.jsonl"
    done = project.run_cli("trace", str(damaged), "--step", "5", "--out", str(out), "--no-progress")
    assert (
        f"warning: checkpoint {damaged / 'checkpoints' / 'step-00000004'} is not used: "
        "trainable.safetensors does not match its recorded sha256"
    ) in done.stderr
    assert "Loading weights" not in done.stderr and "trace: replaying" not in done.stderr
    assert "replayed from     the start" in done.stdout and read_trace(out).header["replayed_from"] == 0


def _edit_checkpoint_weight(checkpoint: Path, name_part: str) -> str:
    """Nudge one trainable tensor of a checkpoint and re-seal its hashes (as a careless tool
    would): the checkpoint verifies, its weights are not the run's."""
    weights = load_file(str(checkpoint / "trainable.safetensors"))
    name = next(k for k in sorted(weights) if name_part in k)
    weights[name] = weights[name] * 1.001
    save_file(weights, str(checkpoint / "trainable.safetensors"))
    state = json.loads((checkpoint / STATE_FILE).read_text())
    state["files"]["trainable.safetensors"] = sha256_file(checkpoint / "trainable.safetensors")
    state["state_sha256"] = _state_sha256(state)
    write_json_atomic(checkpoint / STATE_FILE, state)
    return name


def test_a_weight_edited_in_a_checkpoint_shows_where_it_is_first_read(
    project: TinyProject, tmp_path: Path
) -> None:
    """A LoRA weight edited in the step-4 checkpoint: the replay of step 5 no longer reproduces the
    run, and against the honest trace the first difference is "inputs differ" at the first op that
    reads that parameter, named."""
    edited = tmp_path / "edited"
    shutil.copytree(project.root / "native", edited)
    name = _edit_checkpoint_weight(
        edited / "checkpoints" / "step-00000004", "layers.1.self_attn.v_proj.lora_A"
    )
    honest = trace_step(project.root / "native", 5, out=tmp_path / "honest.jsonl")
    bent = trace_step(edited, 5, out=tmp_path / "edited.jsonl")
    assert honest.header["reproduced"]["step"] and not bent.header["reproduced"]["step"]
    found = compare_traces(read_trace(tmp_path / "honest.jsonl"), read_trace(tmp_path / "edited.jsonl"))
    assert found.finding == "inputs", found.format()
    assert found.op_a is not None and "layers.1.self_attn.v_proj.lora_A" in found.op_a.module
    assert "lora_A" in name
    named = "is the parameter model.layers.1.self_attn.v_proj.lora_A.default.weight"
    assert any(named in line for line in found.explanation), found.explanation
    assert any("the weights going into the step differ" in note for note in found.notes)


def test_a_trace_holds_hashes_only(project: TinyProject) -> None:
    """A trace holds no row of the data, no secret from the environment and no absolute path:
    hashes, shapes, names."""
    out = project.root / "secret-check.jsonl"
    token = "hf_" + "Q" * 34
    project.run_cli(
        "trace", "native", "--step", "1", "--out", str(out), "--no-progress", env={"HF_TOKEN": token}
    )
    text = out.read_text()
    rows = [json.loads(line) for line in (project.root / "data.jsonl").read_text().splitlines()]
    assert token not in text
    assert not any(row["prompt"] in text or row["response"] in text for row in rows)
    # the run directory as given ("native"): where the project lies (a home directory) is not said
    assert str(project.root) not in text and json.loads(text.splitlines()[0])["run_dir"] == "native"


def test_trace_refuses_bad_input_clearly(project: TinyProject) -> None:
    """A step outside the run, an existing output file, a directory or a place inside a run as
    --out, a trace compared with a run: exit 2, the value named, nothing written."""
    for step in ("-1", "9"):
        done = project.run_cli("trace", "native", "--step", step, "--out", "x.jsonl", check=False)
        assert done.returncode == 2 and "steps 1 to 8; step 0 is the LoRA init" in done.stderr
    assert not (project.root / "x.jsonl").exists()
    (project.root / "exists.jsonl").write_text("mine\n")
    done = project.run_cli("trace", "native", "--step", "1", "--out", "exists.jsonl", check=False)
    assert done.returncode == 2 and "already exists" in done.stderr
    assert (project.root / "exists.jsonl").read_text() == "mine\n"
    done = project.run_cli("trace", "native", "--step", "1", "--out", "exists.jsonl/t.jsonl", check=False)
    assert done.returncode == 2
    assert "trace: error: --out 'exists.jsonl/t.jsonl' cannot be written: " in done.stderr
    assert "exists.jsonl is a file, not a directory" in done.stderr and "trace: replaying" not in done.stderr
    done = project.run_cli("trace", "native", "--step", "1", "--out", "", check=False)
    assert done.returncode == 2 and "argument --out: an empty path: give a file or directory" in done.stderr
    done = project.run_cli("trace", "native", "--step", "1", "--out", ".", check=False)
    assert done.returncode == 2 and "is a directory; --out names the trace file" in done.stderr
    assert "fix: give a file path, e.g. --out " in done.stderr and "-step-1.jsonl" in done.stderr
    for inside in ("native/t.jsonl", "native/checkpoints/t.jsonl"):  # written there before
        done = project.run_cli("trace", "native", "--step", "1", "--out", inside, check=False)
        assert done.returncode == 2 and f"--out '{inside}' is inside the run directory " in done.stderr
        assert not (project.root / inside).exists()
    project.run_cli("trace", "native", "--step", "1", "--out", "one.jsonl", "--no-progress")
    done = project.run_cli("compare", "one.jsonl", "native", check=False)
    assert done.returncode == 2 and "is not a trace" in done.stderr


def test_the_trace_command_names_the_gpu_a_step_was_replayed_on() -> None:
    """On CUDA the trace's device line names the GPU and the libraries that choose its kernels,
    from the trace's own kernel facts (a header as a trace on an H200 writes it); a trace from
    before the device was recorded says so."""
    from reprotune._cli.trace import device_line

    cuda = {
        "devices": [{"index": 0, "name": "NVIDIA H200", "capability": "9.0", "sm_count": 132}],
        "cuda_runtime": "13.0",
        "cublas": 130100,
        "cudnn": 91900,
    }
    header = {"environment": {"device": "cuda:0"}, "kernels": {"cuda": cuda}}
    assert device_line(header) == (
        "cuda:0 (NVIDIA H200, compute capability 9.0, 132 SMs; CUDA 13.0, cuBLAS 130100, cuDNN 91900)"
    )
    assert device_line({"environment": {"device": "cpu"}, "kernels": {"cuda": cuda}}) == "cpu"
    assert device_line({"environment": {}, "kernels": {}}) == "not recorded"


def test_the_reproduced_line_names_the_fields_or_the_steps_before_that_differ() -> None:
    """The CLI's ``reproduced`` line: yes; the traced step's differing fields; or, where the traced
    step agreed but a step replayed before it did not, those steps (never "NO ... (none)")."""
    from reprotune._cli.trace import reproduced_words

    same = {"step": True, "before": True, "differing_fields": [], "differing_steps_before": {}}
    assert (
        reproduced_words(same, init=False)
        == "yes: the replayed step gave the run's own ledger line, bit for bit"
    )
    assert reproduced_words(same, init=True).startswith("yes: the LoRA init gave the run's own init line")
    step = {**same, "step": False, "differing_fields": ["loss", "weights_sha256"]}
    assert reproduced_words(step, init=False).startswith(
        "NO: this machine's step differs from the run's (loss, weights_sha256); the trace\n"
    )
    earlier = {**same, "before": False, "differing_steps_before": {"2": ["loss"], "3": ["loss"]}}
    assert reproduced_words(earlier, init=False).startswith(
        "NO: this machine's steps before it (2, 3) differ from the run's; the trace\n"
    )
