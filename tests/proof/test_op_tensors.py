"""What a trace writes of an op's tensors: the dropout RNG state of fused attention kernels is not
hashed. On an H200 (2026-12-04) a strict run and a run with determinism off differed, at step 2, in
the philox seed and offset of every ``_scaled_dot_product_efficient_attention`` (tensors the kernel
never writes at dropout 0), so the trace comparison named that op as a kernel difference; the real
first difference was the attention backward's gradient. No CPU runs those kernels, so the slots are
shown here with a custom op of the same schema names, through the real dispatcher."""

from __future__ import annotations

import torch

from reprotune._run.op_tensors import rng_state_inputs, rng_state_outputs, tensor_hash
from reprotune._run.op_tracer import ModulePaths, OpTracer
from reprotune._run.tracefile import RNG_STATE_HASH, UNINITIALIZED

_LIB = torch.library.Library("reprotune_test", "DEF")
_LIB.define(
    "attn(Tensor query, float dropout_p) -> (Tensor output, Tensor philox_seed, Tensor philox_offset)"
)
_LIB.define("attn_backward(Tensor grad, Tensor philox_seed, Tensor philox_offset) -> Tensor")
_calls = [0]


def _attn(query: torch.Tensor, dropout_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # like the CUDA kernels at dropout 0: the RNG state is left as it was (here: other bytes per call)
    _calls[0] += 1
    return query * 2, torch.tensor(_calls[0]), torch.tensor(-_calls[0])


def _attn_backward(grad: torch.Tensor, seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    return grad * 2


_LIB.impl("attn", _attn, "CPU")
_LIB.impl("attn_backward", _attn_backward, "CPU")


def _trace_once() -> list[tuple[tuple[str, ...], ...]]:
    model = torch.nn.Linear(2, 2)
    with ModulePaths(model) as modules, OpTracer(modules, {}) as tracer:
        out, seed, offset = torch.ops.reprotune_test.attn(torch.ones(3), 0.0)
        torch.ops.reprotune_test.attn_backward(out, seed, offset)
    return [(*op.inputs, *op.outputs) for op in tracer.ops if op.op.startswith("reprotune_test::")]


def test_the_slots_are_found_by_their_schema_names() -> None:
    forward = torch.ops.aten._scaled_dot_product_efficient_attention.default
    q, seed, offset = torch.ones(1), torch.tensor(1), torch.tensor(2)
    assert rng_state_outputs(forward, (q, q, seed, offset)) == {id(seed), id(offset)}
    assert rng_state_inputs(forward, (q, q, q, None, True), {}) == set()
    backward = torch.ops.aten._scaled_dot_product_efficient_attention_backward.default
    args = (q, q, q, q, q, q, q, seed, offset, 0.0, [True] * 4)
    assert rng_state_inputs(backward, args, {}) == {id(seed), id(offset)}
    assert rng_state_inputs(torch.ops.aten.mm.default, (q, q), {}) == set()
    assert rng_state_outputs(torch.ops.aten.mm.default, q) == set()


def test_rng_state_is_written_as_such_and_two_calls_agree() -> None:
    first, second = _trace_once(), _trace_once()
    forward, backward = first
    assert forward[0][2] == tensor_hash(torch.ones(3))  # the query: hashed
    assert forward[1][2] == tensor_hash(torch.ones(3) * 2)  # the output: hashed
    assert forward[2] == ("", "int64", RNG_STATE_HASH) and forward[3] == ("", "int64", RNG_STATE_HASH)
    assert backward[1][2] == RNG_STATE_HASH and backward[2][2] == RNG_STATE_HASH
    assert backward[0][2] != RNG_STATE_HASH
    # the seed tensors' bytes differed between the two calls; the trace lines do not
    assert first == second


def test_an_explicit_generator_is_written_without_its_address() -> None:
    """A random op given its own generator (a user's script may): its arguments are written as
    ``G``, not the generator object's repr with its address, so two traces of one step agree; the
    generator's state is an input of its own."""

    def traced() -> tuple[str, tuple[tuple[str, ...], ...]]:
        generator = torch.Generator().manual_seed(3)
        model = torch.nn.Linear(2, 2)
        with ModulePaths(model) as modules, OpTracer(modules, {}) as tracer:
            torch.rand(4, generator=generator)
        (op,) = [op for op in tracer.ops if op.op.startswith("aten::rand")]
        return op.args, op.inputs

    (args, inputs), again = traced(), traced()
    assert "'G'" in args and "0x" not in args and (args, inputs) == again
    assert any(entry[3:] == ("rng:cpu",) for entry in inputs)


def test_a_write_into_a_parameter_through_data_is_seen_by_its_later_readers() -> None:
    """A parameter's hash is kept while its version does not move; a write through ``.data`` (an
    alias with a version counter of its own) is an op the trace sees, so the parameter's next
    reader gets the hash of what it holds now, and the write's output is hashed afresh."""
    model = torch.nn.Linear(2, 2)
    weight = model.weight
    labels = {int(weight.untyped_storage().data_ptr()): "param:weight"}
    with ModulePaths(model) as modules, OpTracer(modules, labels) as tracer, torch.no_grad():
        torch.mul(weight, 2)
        weight.data.add_(1.0)
        torch.mul(weight, 2)
    first, write, second = (op for op in tracer.ops if op.op in {"aten::mul.Tensor", "aten::add_.Tensor"})
    assert write.op == "aten::add_.Tensor"
    now = tensor_hash(weight.detach())
    assert first.inputs[0][2] != now  # the weight before the write
    assert write.outputs[0][2] == now and second.inputs[0][2] == now
    assert second.inputs[0][3] == "param:weight"


def test_what_a_fused_optimizer_writes_in_place_is_in_its_outputs() -> None:
    """The fused AdamW update and ``_foreach_*_`` ops return nothing and write their tensors in
    place: their outputs are those tensors as the op left them (before, the list was empty, so two
    updates that gave other weights compared as the same op)."""
    weight = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 6).reshape(2, 3))
    before = tensor_hash(weight.detach())
    weight.grad = torch.linspace(0.1, 0.6, 6).reshape(2, 3)
    optimizer = torch.optim.AdamW([weight], lr=1e-2, fused=True)
    model = torch.nn.Linear(2, 2)
    with ModulePaths(model) as modules, OpTracer(modules, {}) as tracer, torch.no_grad():
        torch._foreach_mul_([weight.grad], 0.5)
        optimizer.step()
    [scale] = [op for op in tracer.ops if op.op.startswith("aten::_foreach_mul_")]
    [fused] = [op for op in tracer.ops if op.op == "aten::_fused_adamw_"]
    assert [entry[2] for entry in scale.outputs] == [tensor_hash(weight.grad)]
    assert fused.outputs and fused.outputs[0][2] == tensor_hash(weight.detach()) != before
    state = optimizer.state[weight]
    hashes = {entry[2] for entry in fused.outputs}
    assert {tensor_hash(state["exp_avg"]), tensor_hash(state["exp_avg_sq"])} <= hashes


def test_sparse_lazy_and_zero_tensors_hash_by_their_values() -> None:
    """A sparse tensor (COO, CSR), a lazy conjugate or negation and a ZeroTensor hash without
    error (before: sparse and ZeroTensor stopped the trace with an internal error), the same values
    alike and other values not; a lazy conjugate as the values it stands for (before: its repr)."""
    dense = torch.tensor([[0.0, 1.5], [2.0, 0.0]])
    coo = dense.to_sparse()
    assert tensor_hash(coo) == tensor_hash(dense.to_sparse()) != tensor_hash((dense * 2).to_sparse())
    assert tensor_hash(dense.to_sparse_csr()) != tensor_hash(coo)  # another layout, other bytes
    assert tensor_hash(dense.to_sparse_csr()) == tensor_hash(dense.clone().to_sparse_csr())
    z = torch.tensor([1 + 2j, 3 - 1j])
    assert tensor_hash(z.conj()) == tensor_hash(z.conj().resolve_conj()) != tensor_hash(z)
    assert tensor_hash(torch._neg_view(dense)) == tensor_hash(-dense)
    zeros = torch._efficientzerotensor((2, 3))
    assert tensor_hash(zeros) == tensor_hash(torch.zeros(2, 3))


def test_each_input_names_the_op_that_last_wrote_its_memory_also_through_a_view() -> None:
    """``src``: the op that wrote an input's memory, found by its storage, so a value read through
    a transposed view (whose bytes hash otherwise than what its op made) is still traced to that
    op; a parameter no op wrote has none; an in-place write moves the writer."""
    weight = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))
    model = torch.nn.Linear(2, 2)
    with ModulePaths(model) as modules, OpTracer(modules, {}) as tracer, torch.no_grad():
        x = torch.ones(3, 4)
        y = torch.mm(weight, x)  # 2x4
        torch.relu(y.t())  # reads y through a view
        y.mul_(2.0)
        torch.relu(y)
    ops = tracer.ops
    made = next(op for op in ops if op.op == "aten::mm")
    first, second = (op for op in ops if op.op == "aten::relu")
    scale = next(op for op in ops if op.op == "aten::mul_.Tensor")
    assert made.src[0] is None  # the parameter: no op of the trace wrote it
    assert first.src == (made.i,) and first.inputs[0][2] != made.outputs[0][2]  # a view: another hash
    assert scale.src[0] == made.i and second.src == (scale.i,)


def test_an_allocation_written_in_parts_is_uninitialized_where_it_is_not_yet_written() -> None:
    """``empty(64)``, then its halves filled one after the other: the second fill's argument is
    the half no op has written yet, ``uninitialized`` (before: its leftover bytes were hashed,
    once the first half was written, so two traces of one step could differ there); a read of the
    whole after both are written is hashed."""
    model = torch.nn.Linear(2, 2)
    with ModulePaths(model) as modules, OpTracer(modules, {}) as tracer, torch.no_grad():
        x = torch.empty(64)
        x[:32].fill_(1.0)
        x[32:].fill_(2.0)
        torch.neg(x)
    first, second = (op for op in tracer.ops if op.op.startswith("aten::fill_"))
    assert first.inputs[0][2] == UNINITIALIZED and second.inputs[0][2] == UNINITIALIZED
    assert second.outputs[0][2] == tensor_hash(torch.full((32,), 2.0))
    [neg] = [op for op in tracer.ops if op.op == "aten::neg"]
    assert neg.inputs[0][2] == tensor_hash(torch.cat([torch.ones(32), torch.full((32,), 2.0)]))


def test_a_buffer_filled_by_column_halves_is_uninitialized_where_not_yet_written() -> None:
    """``empty(4, 4)`` filled by its left columns, then its right: the second fill's argument spans
    no byte the first wrote (runs of bytes, not the view's first-to-last extent: before, the
    leftover bytes between the left halves were hashed)."""
    model = torch.nn.Linear(2, 2)
    with ModulePaths(model) as modules, OpTracer(modules, {}) as tracer, torch.no_grad():
        x = torch.empty(4, 4)
        x[:, :2].fill_(1.0)
        x[:, 2:].fill_(2.0)
    first, second = (op for op in tracer.ops if op.op.startswith("aten::fill_"))
    assert first.inputs[0][2] == UNINITIALIZED and second.inputs[0][2] == UNINITIALIZED


def test_src_is_the_last_op_that_wrote_the_bytes_read_not_any_byte_of_the_storage() -> None:
    """Two ops write the two halves of one buffer; a read of the first half names the op that
    wrote that half (before: the last op that wrote anywhere in the storage)."""
    model = torch.nn.Linear(2, 2)
    with ModulePaths(model) as modules, OpTracer(modules, {}) as tracer, torch.no_grad():
        buf = torch.zeros(8)
        buf[:4].add_(1.0)
        buf[4:].add_(2.0)
        torch.neg(buf[:4])
        torch.neg(buf[::2])  # every other element: both halves, the newest writer
    first_half, second_half = (op for op in tracer.ops if op.op == "aten::add_.Tensor")
    reads = [op for op in tracer.ops if op.op == "aten::neg"]
    assert reads[0].src == (first_half.i,) and reads[1].src == (second_half.i,)


def test_a_sparse_allocation_does_not_stop_the_trace() -> None:
    """``empty`` with a sparse layout makes a tensor without storage: traced as uninitialized
    (before: NotImplementedError, the trace stopped with an internal error)."""
    model = torch.nn.Linear(2, 2)
    with ModulePaths(model) as modules, OpTracer(modules, {}) as tracer, torch.no_grad():
        torch.empty((2, 2), layout=torch.sparse_coo)
        torch.empty((2, 2), layout=torch.sparse_csr)
    assert [op.outputs[0][2] for op in tracer.ops if op.op == "aten::empty.memory_format"] == [
        UNINITIALIZED,
        UNINITIALIZED,
    ]
