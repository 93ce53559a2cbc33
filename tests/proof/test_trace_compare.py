"""Comparing two traces (reprotune._proof.trace_compare), on traces written by hand: what each kind
of first difference is called, and the trace file's own checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reprotune._errors import InputError
from reprotune._formats import TRACE
from reprotune._proof.trace_compare import compare_traces
from reprotune._run.tracefile import LOSS_LOG_HASH, UNINITIALIZED, TraceOp, read_trace, write_trace

KERNELS_A = {"cpu": {"aten_capability": "AVX512"}, "blas": {"mkl_code_path": "AVX512_E1"}, "attention": {}}
KERNELS_B = {"cpu": {"aten_capability": "AVX2"}, "blas": {"mkl_code_path": "AVX2"}, "attention": {}}


def _op(
    i: int, module: str, op: str, inputs: list[str], outputs: list[str], n: int = 0, **kw: Any
) -> TraceOp:
    return TraceOp(
        kind="op",
        i=i,
        phase=kw.get("phase", "forward.0"),
        module=module,
        op=op,
        n=n,
        args=kw.get("args", "['T', 'T']"),
        inputs=tuple(("4x8", "float32", h, *kw.get("labels", {}).get(k, ())) for k, h in enumerate(inputs)),
        outputs=tuple(("4x8", "float32", h) for h in outputs),
    )


def _trace(path: Path, ops: list[TraceOp], kernels: dict[str, Any], **header: Any) -> Any:
    body = {
        "schema": TRACE.schema,
        "schema_version": TRACE.version,
        "run_id": "r",
        "config_sha256": "c" * 64,
        "step": 3,
        "replayed_from": 0,
        "reproduced": {"step": True, "before": True},
        "weights_in_sha256": "w" * 64,
        "kernels": {"version": 1, **kernels},
        **header,
    }
    write_trace(path, body, ops)
    return read_trace(path)


BASE = [
    _op(0, "model.embed_tokens", "aten::embedding", ["w", "ids"], ["h0"]),
    _op(1, "model.layers.0.self_attn.q_proj", "aten::mm", ["h0", "wq"], ["q"]),
    _op(2, "model.layers.0.self_attn", "aten::_scaled_dot_product_flash_attention_for_cpu", ["q"], ["o"]),
]


def test_same_inputs_other_outputs_is_the_kernel(tmp_path: Path) -> None:
    """The first op whose inputs agree and outputs differ is named, with the kernel facts that differ."""
    other = [
        *BASE[:1],
        _op(1, "model.layers.0.self_attn.q_proj", "aten::mm", ["h0", "wq"], ["q'"]),
        *BASE[2:],
    ]
    found = compare_traces(_trace(tmp_path / "a", BASE, KERNELS_A), _trace(tmp_path / "b", other, KERNELS_B))
    assert (found.finding, found.ops_compared, found.exit_code) == ("kernel", 2, 1)
    assert found.explanation == (
        "step 3, forward.0, model.layers.0.self_attn.q_proj: aten::mm 4x8 @ 4x8 float32: same inputs, "
        "different outputs: the kernel differs "
        "(CPU capability AVX512 vs AVX2; MKL code path AVX512_E1 vs AVX2)",
    )


def test_every_op_agreeing_is_not_identical_when_the_replayed_steps_differ(tmp_path: Path) -> None:
    """Ops that agree, replays whose ledger lines of the step do not: a computation the trace could
    not see, said, exit 1 (before: IDENTICAL, exit 0, though the weights after the step differed)."""
    line = {"kind": "train", "step": 3, "loss": "0x1p-1", "weights_sha256": "a" * 64}

    def replayed(weights: str) -> dict[str, Any]:
        return {
            "reproduced": {"step": True, "before": True, "replayed_line": {**line, "weights_sha256": weights}}
        }

    a = _trace(tmp_path / "a", BASE, KERNELS_A, **replayed("a" * 64))
    found = compare_traces(a, _trace(tmp_path / "b", BASE, KERNELS_A, **replayed("b" * 64)))
    assert (found.finding, found.exit_code, found.ops_compared) == ("unseen", 1, 3)
    assert "ledger lines differ (weights_sha256)" in found.explanation[0]
    assert found.format().startswith("DIVERGED")
    same = compare_traces(a, _trace(tmp_path / "c", BASE, KERNELS_A, **replayed("a" * 64)))
    assert (same.finding, same.exit_code) == ("identical", 0)


def test_a_cpu_square_root_that_differs_is_explained_by_rsqrtps(tmp_path: Path) -> None:
    """aten::sqrt of float32 on a CPU (MKL's rsqrtps kernel; AdamW's for-loop form): the kernel
    finding says why no setting pins it; not on a GPU, nor for another op."""
    ops = [_op(0, "-", "aten::sqrt", ["v"], ["r"], phase="optimizer")]
    other = [_op(0, "-", "aten::sqrt", ["v"], ["r'"], phase="optimizer")]
    cpu = {"environment": {"device": "cpu"}}
    found = compare_traces(
        _trace(tmp_path / "a", ops, KERNELS_A, **cpu), _trace(tmp_path / "b", other, KERNELS_B, **cpu)
    )
    assert found.finding == "kernel" and len(found.explanation) == 2
    assert found.explanation[1].startswith("on a CPU ATen takes this square root from MKL's vector math")
    gpu = {"environment": {"device": "cuda:0"}}
    found = compare_traces(
        _trace(tmp_path / "c", ops, KERNELS_A, **gpu), _trace(tmp_path / "d", other, KERNELS_B, **gpu)
    )
    assert found.finding == "kernel" and len(found.explanation) == 1
    mm = [_op(0, "-", "aten::mm", ["v"], ["r"])]
    found = compare_traces(
        _trace(tmp_path / "e", mm, KERNELS_A, **cpu),
        _trace(tmp_path / "f", [_op(0, "-", "aten::mm", ["v"], ["r'"])], KERNELS_B, **cpu),
    )
    assert len(found.explanation) == 1


def test_same_kernels_and_other_outputs_is_nondeterminism(tmp_path: Path) -> None:
    """With equal kernel facts, other outputs from the same inputs are the op's own nondeterminism."""
    other = [
        *BASE[:1],
        _op(1, "model.layers.0.self_attn.q_proj", "aten::mm", ["h0", "wq"], ["q'"]),
        *BASE[2:],
    ]
    found = compare_traces(_trace(tmp_path / "a", BASE, KERNELS_A), _trace(tmp_path / "b", other, KERNELS_A))
    assert found.finding == "kernel" and "nondeterminism in the op itself" in found.explanation[0]


def test_inputs_from_outside_the_traced_ops(tmp_path: Path) -> None:
    """An input that differs at the first op that reads it, made by no traced op: a named parameter,
    or data / an op that bypasses the dispatcher, said so."""
    labels = {"labels": {1: ("param:model.layers.0.self_attn.q_proj.weight",)}}
    a = [BASE[0], _op(1, "model.layers.0.self_attn.q_proj", "aten::mm", ["h0", "wq"], ["q"], **labels)]
    b = [BASE[0], _op(1, "model.layers.0.self_attn.q_proj", "aten::mm", ["h0", "wq2"], ["q2"], **labels)]
    found = compare_traces(_trace(tmp_path / "a", a, KERNELS_A), _trace(tmp_path / "b", b, KERNELS_A))
    assert found.finding == "inputs"
    assert "input 1 is the parameter model.layers.0.self_attn.q_proj.weight" in found.explanation
    c = [_op(0, "model.embed_tokens", "aten::embedding", ["w", "ids2"], ["h9"])]
    found = compare_traces(_trace(tmp_path / "c", BASE[:1], KERNELS_A), _trace(tmp_path / "d", c, KERNELS_A))
    assert found.finding == "inputs" and "bypasses the dispatcher" in found.explanation[1]


def test_other_arguments_are_named(tmp_path: Path) -> None:
    """The same tensors with other non-tensor arguments: the step was asked something else."""
    b = [BASE[0], _op(1, "model.layers.0.self_attn.q_proj", "aten::mm", ["h0", "wq"], ["q"], args="['T', 2]")]
    found = compare_traces(_trace(tmp_path / "a", BASE[:2], KERNELS_A), _trace(tmp_path / "b", b, KERNELS_A))
    assert found.finding == "inputs" and "other arguments" in found.explanation[0]


def test_op_sequences_that_part_name_the_module_and_both_sequences(tmp_path: Path) -> None:
    """Another code path (eager attention instead of SDPA): the first module whose ops differ, what
    each side runs there, and the recorded attention implementations."""
    eager = [
        *BASE[:2],
        _op(2, "model.layers.0.self_attn", "aten::bmm", ["q"], ["s"]),
        _op(3, "model.layers.0.self_attn", "aten::_softmax", ["s"], ["p"]),
    ]
    ka = {**KERNELS_A, "attention": {"implementation": "sdpa"}}
    kb = {**KERNELS_A, "attention": {"implementation": "eager"}}
    found = compare_traces(_trace(tmp_path / "a", BASE, ka), _trace(tmp_path / "b", eager, kb))
    assert found.finding == "sequence" and found.ops_compared == 2
    assert found.explanation[0].startswith(
        "step 3, forward.0, model.layers.0.self_attn: the op sequences part"
    )
    assert found.explanation[1] == "A runs: aten::_scaled_dot_product_flash_attention_for_cpu"
    assert found.explanation[2] == "B runs: aten::bmm, aten::_softmax"
    assert "attention sdpa vs eager" in found.explanation[3]


def test_identical_and_longer(tmp_path: Path) -> None:
    """Equal streams are IDENTICAL (exit 0); one that goes on is named where it goes on."""
    same = compare_traces(_trace(tmp_path / "a", BASE, KERNELS_A), _trace(tmp_path / "b", BASE, KERNELS_B))
    assert same.finding == "identical" and same.exit_code == 0 and same.format().startswith("IDENTICAL")
    longer = compare_traces(
        _trace(tmp_path / "c", BASE[:2], KERNELS_A), _trace(tmp_path / "d", BASE, KERNELS_A)
    )
    assert longer.finding == "length" and "trace B goes on" in longer.explanation[0]


def test_headers_that_say_not_reproduced_are_noted(tmp_path: Path) -> None:
    """A trace whose replay did not give its run's ledger line, or that starts from other weights,
    is said so beside the finding."""
    not_reproduced = {"reproduced": {"step": False, "before": True, "differing_fields": ["loss"]}}
    a = _trace(tmp_path / "a", BASE, KERNELS_A, weights_in_sha256="1" * 64)
    b = _trace(tmp_path / "b", BASE, KERNELS_A, weights_in_sha256="2" * 64, **not_reproduced)
    notes = compare_traces(a, b).notes
    assert any("trace B did not reproduce its run's ledger line of step 3 (loss)" in n for n in notes)
    assert any("the weights going into the step differ (111111111111 vs 222222222222)" in n for n in notes)


def test_trace_files_are_checked(tmp_path: Path) -> None:
    """A cut trace, a line that is not an op, another schema version: each refused with its line."""
    _trace(tmp_path / "t.jsonl", BASE, KERNELS_A)
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    (tmp_path / "cut.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(InputError, match="announces 3 ops, the file holds 2"):
        read_trace(tmp_path / "cut.jsonl")
    (tmp_path / "bad.jsonl").write_text("\n".join([*lines[:2], '{"kind": "x"}']) + "\n")
    with pytest.raises(InputError, match=r"bad\.jsonl:3: not a trace op line: kind: input should be 'op'"):
        read_trace(tmp_path / "bad.jsonl")
    no_kind = lines[2].replace('"kind":"op",', "")
    (tmp_path / "nokind.jsonl").write_text("\n".join([*lines[:2], no_kind]) + "\n")
    with pytest.raises(InputError, match=r"nokind\.jsonl:3: not a trace op line: kind: field required"):
        read_trace(tmp_path / "nokind.jsonl")
    # 1: before a random op's generator went in and uninitialized memory out; 2: before what an op
    # writes in place without returning it (the fused optimizer update) went in
    for version in (9, 2, 1):
        older = lines[0].replace('"schema_version":3', f'"schema_version":{version}')
        (tmp_path / f"v{version}.jsonl").write_text(older + "\n")
        with pytest.raises(InputError, match=f"trace schema_version {version} is not supported"):
            read_trace(tmp_path / f"v{version}.jsonl")
    gz = _trace(tmp_path / "t.jsonl.gz", BASE, KERNELS_A)
    assert gz.ops == read_trace(tmp_path / "t.jsonl").ops


def test_a_line_separator_inside_a_string_does_not_split_an_op_line(tmp_path: Path) -> None:
    """Canonical JSON writes U+2028 and U+0085 raw inside strings; the reader splits at newlines only."""
    ops = [_op(0, "model.a\u2028b", "aten::mm", ["x"], ["y"], args="['\u0085']")]
    assert _trace(tmp_path / "t.jsonl", ops, KERNELS_A).ops == tuple(ops)


def test_an_input_an_agreeing_op_made_is_not_blamed_on_the_weights(tmp_path: Path) -> None:
    """An input that differs though the op that made it agreed changed out of the trace's sight (or a
    file was edited): not said to come from the weights, data or config."""
    b = [BASE[0], _op(1, "model.layers.0.self_attn.q_proj", "aten::mm", ["h0'", "wq"], ["q2"])]
    found = compare_traces(_trace(tmp_path / "a", BASE[:2], KERNELS_A), _trace(tmp_path / "b", b, KERNELS_A))
    assert found.finding == "inputs"
    assert "that op agreed in both traces" in found.explanation[1]
    assert not any("the weights going into the step" in text for text in found.explanation)


def test_traces_of_two_configs_say_so(tmp_path: Path) -> None:
    """Other config_sha256 in the headers: the note names the configs, and the weights' difference is
    not sent looking for an earlier step."""
    a = _trace(tmp_path / "a", BASE, KERNELS_A, weights_in_sha256="1" * 64)
    b = _trace(tmp_path / "b", BASE, KERNELS_A, weights_in_sha256="2" * 64, config_sha256="d" * 64)
    notes = compare_traces(a, b).notes
    assert notes[0].startswith("the two runs' configs differ (config_sha256 cccccccccccc vs dddddddddddd)")
    assert any(n.endswith("(111111111111 vs 222222222222): as their configs do") for n in notes)
    assert not any("trace the first step" in n for n in notes)


def test_a_trace_made_under_other_kernels_than_its_run_is_noted(tmp_path: Path) -> None:
    """A header whose kernels_vs_run lists differences: the note says so and how to trace again."""
    against = {
        "differences": ["CPU capability DEFAULT vs AVX2"],
        "assignments": ["ATEN_CPU_CAPABILITY=default"],
    }
    a = _trace(tmp_path / "a", BASE, KERNELS_A)
    b = _trace(tmp_path / "b", BASE, KERNELS_A, kernels_vs_run=against, run_dir="/runs/my run")
    notes = compare_traces(a, b).notes
    assert notes == (
        "trace B was made under other kernels than its run's (run vs here: CPU capability DEFAULT vs "
        "AVX2): it shows those kernels' step; trace again as the run was made: "
        "ATEN_CPU_CAPABILITY=default reprotune trace '/runs/my run' --step 3 "
        "--out B-step-3.as-made.trace.jsonl",
    )
    # a Trainer script's trace (made with --command): the command to trace again runs it again
    c = _trace(tmp_path / "c", BASE, KERNELS_A, kernels_vs_run=against, run_dir="/r", command="python t.py")
    assert (
        compare_traces(a, c)
        .notes[0]
        .endswith("reprotune trace /r --step 3 --command 'python t.py' --out B-step-3.as-made.trace.jsonl")
    )
    # its command with a secret masked (a trace is fit to send) would run without it: a placeholder
    d = _trace(
        tmp_path / "d",
        BASE,
        KERNELS_A,
        kernels_vs_run=against,
        run_dir="/r",
        command="python t.py --token ***",
    )
    assert (
        compare_traces(a, d)
        .notes[0]
        .endswith(
            "--step 3 --command '<the command that made the run, its secrets masked in the trace>' "
            "--out B-step-3.as-made.trace.jsonl"
        )
    )


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({"reproduced": "yes"}, "reproduced: input should be an object (got 'yes')"),
        ({"step": None}, "step: input should be a valid integer"),
        ({"step": -1}, "step: input should be greater than or equal to 0"),
        ({"kernels": "x"}, "kernels: input should be an object (got 'x')"),
        ({"kernels": {"version": 1, "cpu": "x"}}, "kernels.cpu: input should be an object (got 'x')"),
        ({"environment": {"libraries": ["x"]}}, "environment.libraries: input should be an object"),
        ({"environment": {"buffers": {"b": 1}}}, "environment.buffers.b: input should be a valid string"),
    ],
)
def test_a_hand_edited_header_is_refused_at_its_key(
    tmp_path: Path, edit: dict[str, Any], problem: str
) -> None:
    """A header edited by hand is refused naming the file, line 1 and the key, never crashed on."""
    _trace(tmp_path / "t.jsonl", BASE, KERNELS_A)
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    header = {**json.loads(lines[0]), **edit}
    (tmp_path / "e.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with pytest.raises(InputError) as caught:
        read_trace(tmp_path / "e.jsonl")
    assert caught.value.source == f"{tmp_path / 'e.jsonl'}:1"
    assert problem in caught.value.message.lower()


def test_a_cut_header_or_gzip_is_called_cut(tmp_path: Path) -> None:
    """A first line that is not whole JSON, or a .gz cut short, gets the fix for a cut trace."""
    _trace(tmp_path / "t.jsonl", BASE, KERNELS_A)
    text = (tmp_path / "t.jsonl").read_text()
    (tmp_path / "h.jsonl").write_text(text[:40])
    with pytest.raises(InputError, match="the first line is not JSON") as caught:
        read_trace(tmp_path / "h.jsonl")
    assert "trace the step again if it was cut" in str(caught.value)
    _trace(tmp_path / "t.jsonl.gz", BASE, KERNELS_A)
    data = (tmp_path / "t.jsonl.gz").read_bytes()
    (tmp_path / "cut.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="cannot read") as caught:
        read_trace(tmp_path / "cut.jsonl.gz")
    assert "trace the step again if it was cut" in str(caught.value)


def test_a_first_line_nested_too_deep_is_not_a_trace(tmp_path: Path) -> None:
    """JSON nested past Python's recursion limit on the first line: refused as not JSON, and not
    taken for a trace (before: an internal error, exit 1)."""
    from reprotune._cli import main
    from reprotune._run.tracefile import is_trace_file

    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 200_000 + "\n")
    with pytest.raises(InputError, match="the first line is not JSON"):
        read_trace(deep)
    assert not is_trace_file(deep)
    _trace(tmp_path / "t.jsonl", BASE, KERNELS_A)
    assert main(["compare", str(tmp_path / "t.jsonl"), str(deep)]) == 2


# Two code paths: B's rotary embedding runs other ops (another library version), and what it makes
# feeds the attention, which both run alike.
ROTARY_A = [
    _op(0, "model.rotary_emb", "aten::mul.Tensor", ["pos", "inv"], ["ang"]),
    _op(1, "model.rotary_emb", "aten::cos", ["ang"], ["cos"]),
]
ROTARY_B = [
    _op(0, "model.rotary_emb", "aten::bmm", ["inv", "pos"], ["ang2"]),
    _op(1, "model.rotary_emb", "aten::cos", ["ang2"], ["cos2"]),
]


def _attention(cos: str, out: str) -> list[TraceOp]:
    return [
        _op(2, "model.layers.0.self_attn.q_proj", "aten::mm", ["h0", "wq"], ["q"]),
        _op(3, "model.layers.0.self_attn", "aten::mul.Tensor", ["q", cos], [out]),
        _op(4, "model.layers.0.self_attn.o_proj", "aten::mm", [out, "wo"], ["y"]),
    ]


def test_after_the_code_paths_part_the_first_op_whose_numbers_differ_is_found(tmp_path: Path) -> None:
    """Where the op sequences part, the modules both run alike are still compared op by op: the
    first whose input differs names the parted module that made it, with both sides' ops there,
    and the library versions the headers hold."""
    libraries = {"torch": "2.13.0", "transformers": "5.24.0", "peft": "0.21.2"}
    older = {"torch": "2.13.0", "transformers": "4.56.0", "peft": "0.17.0"}
    a = _trace(
        tmp_path / "a", [*ROTARY_A, *_attention("cos", "r")], KERNELS_A, environment={"libraries": libraries}
    )
    b = _trace(
        tmp_path / "b", [*ROTARY_B, *_attention("cos2", "r2")], KERNELS_A, environment={"libraries": older}
    )
    found = compare_traces(a, b)
    assert found.finding == "sequence" and found.op_a is not None and found.op_a.op == "aten::mul.Tensor"
    text = "\n".join(found.explanation)
    assert (
        "recorded: the libraries that compute the step differ: transformers 5.24.0 vs 4.56.0; "
        "peft 0.21.2 vs 0.17.0" in text
    )
    assert "the code paths differ in 1 module(s): forward.0 model.rotary_emb" in text
    assert (
        "where the numbers part: step 3, forward.0, model.layers.0.self_attn: aten::mul.Tensor 4x8 @ 4x8 "
        "float32: its inputs differ" in text
    )
    assert (
        "input 1 (4x8 float32) was made in model.rotary_emb (forward.0), where the code paths differ: "
        "A runs aten::mul.Tensor, aten::cos; B runs aten::bmm, aten::cos" in text
    )
    numbers_a, numbers_b = found.numbers
    assert numbers_a is not None and numbers_b is not None and numbers_a.module == "model.layers.0.self_attn"
    assert found.to_json()["numbers_part"]["op_a"]["module"] == "model.layers.0.self_attn"


def test_a_value_read_through_a_view_is_traced_to_the_module_that_made_it(tmp_path: Path) -> None:
    """The attention reads the rotary output through a view (other bytes order, another hash than
    the op that made it): the op the trace names as its writer (``src``) places it in the parted
    module (before, by hash alone, it was "a tensor no traced op made (step data)")."""

    def viewed(ops: list[TraceOp], cos_view: str) -> list[TraceOp]:
        attention = _attention(cos_view, "r" + cos_view)
        read = attention[1].model_copy(update={"src": (2, 1)})  # q from op 2, the cos from op 1
        return [*ops, attention[0], read, attention[2]]

    a = _trace(tmp_path / "a", viewed(ROTARY_A, "cosT"), KERNELS_A)
    b = _trace(tmp_path / "b", viewed(ROTARY_B, "cos2T"), KERNELS_A)
    text = "\n".join(compare_traces(a, b).explanation)
    assert (
        "input 1 (4x8 float32) was made in model.rotary_emb (forward.0), where the code paths differ" in text
    )
    assert "no traced op made" not in text


def test_an_input_whose_writer_agreed_is_a_write_out_of_sight_also_through_a_view(tmp_path: Path) -> None:
    """Every op before agreed; the first op that differs reads, through a view (its own hash), what
    an earlier op wrote: said as a write the trace could not see (before, by hash alone: step data)."""
    first = _op(0, "model.a", "aten::mm", ["x", "w"], ["y"])
    read_a = _op(1, "model.b", "aten::relu", ["yT"], ["z"]).model_copy(update={"src": (0,)})
    read_b = _op(1, "model.b", "aten::relu", ["yT'"], ["z'"]).model_copy(update={"src": (0,)})
    found = compare_traces(
        _trace(tmp_path / "a", [first, read_a], KERNELS_A), _trace(tmp_path / "b", [first, read_b], KERNELS_A)
    )
    assert found.finding == "inputs"
    assert "is what an earlier op made, and that op agreed in both traces" in found.explanation[1]


def test_code_paths_that_part_without_changing_a_number_are_said_so(tmp_path: Path) -> None:
    """Both code paths make the same values: every op after them agrees, and the comparison says
    the parted modules change nothing the rest of the step sees."""
    same_b = [ROTARY_B[0], _op(1, "model.rotary_emb", "aten::cos", ["ang2"], ["cos"])]
    a = _trace(tmp_path / "a", [*ROTARY_A, *_attention("cos", "r")], KERNELS_A)
    b = _trace(tmp_path / "b", [*same_b, *_attention("cos", "r")], KERNELS_A)
    found = compare_traces(a, b)
    assert found.finding == "sequence" and found.numbers == (None, None)
    assert found.explanation[-1].startswith(
        "every op both code paths run alike agrees in its inputs and outputs"
    )


def test_after_the_code_paths_part_an_op_computed_otherwise_names_the_torch_versions(tmp_path: Path) -> None:
    """Past the parted module an op both run alike gets the same inputs and gives other outputs:
    the op is computed otherwise, and with equal kernel facts the torch versions say why (also
    outside a code-path part: then it is the kernel finding)."""
    same_b = [ROTARY_B[0], _op(1, "model.rotary_emb", "aten::cos", ["ang2"], ["cos"])]
    a = _trace(
        tmp_path / "a", [*ROTARY_A, *_attention("cos", "r")], KERNELS_A, environment={"torch": "2.13.0"}
    )
    b = _trace(
        tmp_path / "b", [*same_b, *_attention("cos", "r9")], KERNELS_A, environment={"torch": "2.14.1"}
    )
    text = "\n".join(compare_traces(a, b).explanation)
    assert (
        "where the numbers part: step 3, forward.0, model.layers.0.self_attn: aten::mul.Tensor 4x8 @ 4x8 "
        "float32: same inputs, different outputs, outside the parted modules: the op is computed "
        "otherwise (torch 2.13.0 vs 2.14.1)" in text
    )
    plain_a = _trace(tmp_path / "pa", BASE, KERNELS_A, environment={"torch": "2.13.0"})
    changed = [*BASE[:2], _op(2, BASE[2].module, BASE[2].op, ["q"], ["o2"])]
    plain_b = _trace(tmp_path / "pb", changed, KERNELS_A, environment={"torch": "2.14.1"})
    kernel = compare_traces(plain_a, plain_b)
    assert (
        kernel.finding == "kernel" and "the kernel differs (torch 2.13.0 vs 2.14.1)" in kernel.explanation[0]
    )


def test_buffers_the_config_made_at_load_that_differ_are_noted(tmp_path: Path) -> None:
    """A model buffer (the rotary frequencies) whose hash differs in the two headers is noted."""
    a = _trace(
        tmp_path / "a", BASE, KERNELS_A, environment={"buffers": {"model.rotary_emb.inv_freq": "1" * 64}}
    )
    b = _trace(
        tmp_path / "b", BASE, KERNELS_A, environment={"buffers": {"model.rotary_emb.inv_freq": "2" * 64}}
    )
    notes = compare_traces(a, b).notes
    assert any(
        "the model's buffers differ, which the library computes from the config at load" in n
        and "model.rotary_emb.inv_freq 111111111111 vs 222222222222" in n
        for n in notes
    )


def test_the_trainers_loss_log_agrees_with_whatever_an_older_trace_hashed_there(tmp_path: Path) -> None:
    """A Trainer trace writes its loss log ``trainer-loss-log``; one made before hashed it. Its
    bytes are no computation's, so the two agree there, and an op that differs after it is found."""
    log = _op(3, "-", "aten::add_.Tensor", [LOSS_LOG_HASH, "loss"], [LOSS_LOG_HASH], phase="backward.0")
    older = _op(3, "-", "aten::add_.Tensor", ["total-so-far", "loss"], ["total"], phase="backward.0")
    tail = _op(4, "-", "aten::mul", ["loss", "g"], ["x"], phase="backward.0")
    other_tail = _op(4, "-", "aten::mul", ["loss", "g"], ["x'"], phase="backward.0")
    a, b = (
        _trace(tmp_path / "a", [*BASE, log, tail], KERNELS_A),
        _trace(tmp_path / "b", [*BASE, older, tail], KERNELS_A),
    )
    assert compare_traces(a, b).finding == "identical"
    c = _trace(tmp_path / "c", [*BASE, older, other_tail], KERNELS_B)
    found = compare_traces(a, c)
    assert (found.finding, found.ops_compared) == ("kernel", 5) and "aten::mul" in found.explanation[0]
    shapes = _op(3, "-", "aten::add_.Tensor", ["total-so-far", "loss"], ["total"], phase="backward.0")
    shapes = shapes.model_copy(update={"inputs": (("", "float32", "total-so-far"), shapes.inputs[1])})
    assert compare_traces(a, _trace(tmp_path / "d", [*BASE, shapes, tail], KERNELS_A)).finding == "inputs"


def test_the_trainers_loss_log_agrees_also_where_the_code_paths_part(tmp_path: Path) -> None:
    """Past a parted module the ops both run alike are compared by the same rule: the loss log
    against an older trace's hash is no difference there either."""
    same_b = [ROTARY_B[0], _op(1, "model.rotary_emb", "aten::cos", ["ang2"], ["cos"])]
    log = _op(5, "-", "aten::add_.Tensor", [LOSS_LOG_HASH, "y"], [LOSS_LOG_HASH], phase="backward.0")
    older = _op(5, "-", "aten::add_.Tensor", ["total-so-far", "y"], ["total"], phase="backward.0")
    a = _trace(tmp_path / "a", [*ROTARY_A, *_attention("cos", "r"), log], KERNELS_A)
    b = _trace(tmp_path / "b", [*same_b, *_attention("cos", "r"), older], KERNELS_A)
    found = compare_traces(a, b)
    assert found.finding == "sequence" and found.numbers == (None, None), found.format()


def test_an_input_an_agreeing_op_left_unhashed_is_not_said_changed_after_it(tmp_path: Path) -> None:
    """A placeholder an agreeing op wrote (memory no op had written yet) stands for no content: an
    input that differs from it is not taken for one changed after that op, nor for an edited file."""
    empty = _op(3, "model.layers.0.mlp", "aten::empty.memory_format", [], [UNINITIALIZED])
    reads_a = _op(4, "model.layers.0.mlp", "aten::mul.Tensor", [UNINITIALIZED, "g"], ["m"])
    reads_b = _op(4, "model.layers.0.mlp", "aten::mul.Tensor", ["filled", "g"], ["m2"])
    a = _trace(tmp_path / "a", [*BASE, empty, reads_a], KERNELS_A)
    b = _trace(tmp_path / "b", [*BASE, empty, reads_b], KERNELS_A)
    text = "\n".join(compare_traces(a, b).explanation)
    assert "inputs differ at the first op that reads them" in text
    assert "was changed after it" not in text and "a trace file was edited" not in text


def test_a_module_name_with_braces_is_written_as_it_is(tmp_path: Path) -> None:
    """A module name is the user's (a ModuleDict key may hold braces): the first op that differs is
    named with it, not taken for a format string."""
    ops = [_op(0, "model.blocks.{a}", "aten::mm", ["h0", "wq"], ["q"])]
    other = [_op(0, "model.blocks.{a}", "aten::mm", ["h0", "wq"], ["q2"])]
    found = compare_traces(_trace(tmp_path / "a", ops, KERNELS_A), _trace(tmp_path / "b", other, KERNELS_B))
    assert found.finding == "kernel" and found.explanation[0].startswith(
        "step 3, forward.0, model.blocks.{a}: "
    )


def test_the_same_ops_in_another_order_are_compared_op_by_op(tmp_path: Path) -> None:
    """Two independent ops of the backward scheduled the other way round (each module's own ops in
    the same order): no code path parts; each op is compared with its namesake: IDENTICAL when all
    agree, the first that differs named otherwise (before: "the code paths differ in 0 module(s)",
    DIVERGED though every op agreed)."""
    x = _op(0, "model.a", "aten::mm", ["g", "w1"], ["d1"], phase="backward.0")
    y = _op(1, "model.b", "aten::mm", ["g", "w2"], ["d2"], phase="backward.0")
    swapped = [y.model_copy(update={"i": 0}), x.model_copy(update={"i": 1})]
    a = _trace(tmp_path / "a", [x, y], KERNELS_A)
    found = compare_traces(a, _trace(tmp_path / "b", swapped, KERNELS_A))
    assert (found.finding, found.exit_code) == ("identical", 0)
    assert "run the same ops in another order (first: backward.0, model.a: aten::mm)" in found.explanation[1]
    other = [swapped[0], _op(1, "model.a", "aten::mm", ["g", "w1"], ["d1'"], phase="backward.0")]
    differs = compare_traces(a, _trace(tmp_path / "c", other, KERNELS_B))
    assert differs.finding == "kernel" and differs.op_a is not None and differs.op_a.module == "model.a"
    assert "in another order" in differs.explanation[0]
    assert differs.explanation[1].startswith("step 3, backward.0, model.a: aten::mm")


def test_an_input_made_by_an_agreeing_op_outside_the_parted_modules_is_said_so(tmp_path: Path) -> None:
    """Past a code-path part, an input that differs though the op that made it (named by src) ran
    alike and agreed on both sides: a write the trace cannot see, not "step data" (before)."""
    same_b = [ROTARY_B[0], _op(1, "model.rotary_emb", "aten::cos", ["ang2"], ["cos"])]

    def attention(q_read: str) -> list[TraceOp]:
        ops = _attention("cos", "r" + q_read)
        return [
            ops[0],
            ops[1].model_copy(
                update={"inputs": (("4x8", "float32", q_read), ops[1].inputs[1]), "src": (2, 1)}
            ),
            ops[2],
        ]

    a = _trace(tmp_path / "a", [*ROTARY_A, *attention("q")], KERNELS_A)
    b = _trace(tmp_path / "b", [*same_b, *attention("q2")], KERNELS_A)
    text = "\n".join(compare_traces(a, b).explanation)
    assert (
        "input 0 (4x8 float32) was made by aten::mm in model.layers.0.self_attn.q_proj (forward.0), which "
        "both code paths run alike and which agreed: it was changed after, by a write the trace cannot see"
    ) in text
    assert "step data" not in text
