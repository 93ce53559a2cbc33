"""``reprotune trace RUN --step 0``: the LoRA init under the microscope. ATen's ``uniform_`` is
compiled per CPU capability (its ``from + (to - from) * u`` contracted to an FMA where the CPU has
one), so the LoRA init of a layer whose bound is not a power of two (here ``down_proj``: fan-in 128)
differs between a lesser CPU's kernels and this one's before any step; the two runs part at step 0,
``compare`` gives the step-0 trace commands, and the traces name the first op."""

from __future__ import annotations

import pytest

from reprotune._proof.compare import compare_runs
from reprotune._proof.trace_compare import compare_traces
from reprotune._run.tracefile import read_trace
from tinyrun import TinyProject

LESSER = {"ATEN_CPU_CAPABILITY": "default"}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> TinyProject:
    """One config, LoRA on the MLP's down_proj, run with this CPU's kernels and a lesser CPU's."""
    project = TinyProject.create(tmp_path_factory.mktemp("trace-init"))
    config = project.config("cfg.yaml", lora={"target_modules": ["down_proj"]}, train={"max_steps": 2})
    project.run_cli("run", str(config), "--run-dir", "native", "--no-progress")
    project.run_cli("run", str(config), "--run-dir", "lesser", "--no-progress", env=LESSER)
    return project


def test_runs_that_part_at_the_lora_init_get_step_0_trace_commands(project: TinyProject) -> None:
    result = compare_runs(project.root / "native", project.root / "lesser")
    assert result.where.first_weights_step == 0 and result.where.first_divergence_step == 0
    assert result.causes[0].startswith("the LoRA initial weights differ (step 0): CPU kernels differ")
    assert result.causes[0].endswith("the trace commands below find the first op)")
    assert "--step 0 --out A-step-0.trace.jsonl" in result.next_steps[1]
    assert result.next_steps[3].startswith("  ATEN_CPU_CAPABILITY=default reprotune trace ")


def test_traces_of_the_lora_init_name_the_first_draw_that_differs(project: TinyProject) -> None:
    """Each run's init traced under its own kernels: both reproduce their ledger's init line, the
    generator state going into each draw agrees, and the first op that differs is a uniform_ of a
    down_proj LoRA layer: same inputs (uninitialized memory and the generator), other outputs."""
    a, b = project.root / "a0.jsonl", project.root / "b0.jsonl"
    done = project.run_cli("trace", "native", "--step", "0", "--out", str(a), "--no-progress")
    assert "trace of step 0 (the LoRA init) of run native" in done.stdout
    assert "reproduced        yes: the LoRA init gave the run's own init line, bit for bit" in done.stdout
    project.run_cli("trace", "lesser", "--step", "0", "--out", str(b), "--no-progress", env=LESSER)
    ta, tb = read_trace(a), read_trace(b)
    assert ta.header["reproduced"]["step"] and tb.header["reproduced"]["step"]
    assert ta.header["weights_in_sha256"] is None and ta.header["step"] == 0
    assert {op.phase for op in ta.ops} == {"lora-init"}
    first = ta.ops[0]
    assert first.op == "aten::empty.memory_format" and first.outputs[0][2] == "uninitialized"
    found = compare_traces(ta, tb)
    assert found.finding == "kernel", found.format()
    op = found.op_a
    assert op is not None and op.op == "aten::uniform_"
    assert op.module.endswith("mlp.down_proj")  # the layer PEFT was giving its adapter
    assert op.inputs[0][2] == "uninitialized"
    assert (op.inputs[1][1], op.inputs[1][3]) == ("generator", "rng:cpu")
    assert found.explanation[0].startswith(f"step 0, lora-init, {op.module}: aten::uniform_ ")
    assert "same inputs, different outputs: the kernel differs (CPU capability" in found.explanation[0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_lora_init_traced_twice_is_byte_identical(project: TinyProject, dtype: str) -> None:
    """Nothing of the allocator's memory or the process reaches the trace: two traces of step 0
    are the same bytes, every op named by its layer. In bfloat16 PEFT casts each new adapter to the
    base layer's dtype (new memory, the float32 freed and reused): ops named by the parameter they
    wrote once moved to other layers from one process to the next."""
    config = project.config(f"{dtype}.yaml", model={"dtype": dtype}, lora={"target_modules": ["down_proj"]})
    project.run_cli("run", str(config), "--run-dir", dtype, "--no-progress", "--set", "train.max_steps=1")
    one, two = project.root / f"{dtype}-1.jsonl", project.root / f"{dtype}-2.jsonl"
    for path in (one, two):
        project.run_cli("trace", dtype, "--step", "0", "--out", str(path), "--no-progress")
    assert one.read_bytes() == two.read_bytes()
    ops = read_trace(one).ops
    named = {op.module for op in ops if op.module != "-"}
    assert named == {f"model.layers.{i}.mlp.down_proj" for i in (0, 1)}
    # outside the layers' creation only PEFT's cast of the adapters to float32 (in bfloat16)
    assert {op.op for op in ops if op.module == "-"} == (set() if dtype == "float32" else {"aten::_to_copy"})
    assert read_trace(one).header["reproduced"]["step"]
