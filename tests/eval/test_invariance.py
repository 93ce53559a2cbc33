"""Batch invariance as a measured property of the machine (reprotune._eval.invariance): the GEMM
block probe, its cache, the check of the claim, and the claim withheld where it is not shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import reprotune._eval.invariance as invariance
from reprotune._eval.decode import ROWWISE, register_rowwise_attention
from reprotune._eval.settings import generation_identity
from reprotune._model.loading import load_base_model
from reprotune.testing import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("REPROTUNE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _tiny(tmp_path: Path) -> Any:
    """The tiny Llama, left-padded, with the rowwise attention, in eval mode."""
    directory = build_tiny_model(tmp_path / "tiny", seed=0)
    loaded = load_base_model(
        str(directory), revision=None, dtype="float32", pad_token_id=None, padding_side="left", device="cpu"
    )
    loaded.model.set_attn_implementation(register_rowwise_attention())
    loaded.model.eval()
    return loaded


def _invariant(loaded: Any) -> invariance.Invariance:
    return invariance.make_batch_invariant(
        loaded.model,
        device="cpu",
        attention=ROWWISE,
        rowwise=ROWWISE,
        eos_token_ids=[int(loaded.tokenizer.eos_token_id)],
        pad_token_id=int(loaded.info["pad_token_id"]),
        vocab_size=int(loaded.model.config.vocab_size),
    )


def test_the_claim_is_made_with_its_evidence(tmp_path: Path, cache: Path) -> None:
    """On the tiny Llama the claim is made, and the evidence says why: every linear shape has a
    block for each pass of generate, and rows generated alone and together were bit for bit equal."""
    torch.set_num_threads(2)
    found = _invariant(_tiny(tmp_path))
    assert found.shown, found.to_json()
    evidence = found.to_json()
    assert evidence["check"]["equal"] and evidence["check"]["rows_equal"] == len(invariance.CHECK_LENGTHS)
    blocks = evidence["gemm"]["blocks"]
    assert any(shape.startswith("head ") for shape in blocks)  # the output layer is keyed apart
    for shape, passes in blocks.items():
        assert set(passes) == {"prefill", "decode"}
        tried = evidence["gemm"]["probes"][shape]
        for name, block in passes.items():
            assert tried[name][str(block)] is True
            assert all(ok is False for size, ok in tried[name].items() if size != str(block))
    assert evidence["gemm"]["threads"] == 2


def test_the_probe_keeps_the_largest_position_free_block(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel that computes rows past the fourth of a product another way (an edge tile) makes
    the probe settle on blocks of 4 for every shape and pass, and the claim still holds."""
    exact = invariance._gemm

    def edge_tile(module: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
        out = exact(module, rows)
        if rows.shape[0] > 4:
            out = out.clone()
            out[4:] = out[4:] * (1 + 2**-20)
        return out

    monkeypatch.setattr(invariance, "_gemm", edge_tile)
    found = _invariant(_tiny(tmp_path))
    assert found.plan is not None
    assert {b for passes in found.plan.blocks.values() for b in passes.values()} == {4}
    assert found.shown, found.to_json()


def test_a_batch_dependent_op_withholds_the_claim(tmp_path: Path, cache: Path) -> None:
    """An op whose result depends on how many rows the batch has (here a norm nudged by the batch
    size) is caught by the check: no claim, the reason says so, and the batch size is then part
    of the eval's identity."""
    loaded = _tiny(tmp_path)
    norm = loaded.model.model.norm
    norm.register_forward_hook(lambda module, args, out: out * (1 + 1e-6 * out.shape[0]))
    found = _invariant(loaded)
    assert not found.shown
    assert found.check is not None and found.check["rows_equal"] < found.check["rows"]
    assert "differ" in found.reason and "identity" in found.reason
    generation = {"decoding": "greedy", "batch_invariant": found.shown, "batch_size": 8}
    assert generation_identity(generation)["batch_size"] == 8


def test_no_claim_off_the_cpu_or_without_rowwise_attention(tmp_path: Path, cache: Path) -> None:
    """Where the construction is not in place (another attention) or not measured (CUDA), the
    claim is not made and nothing is probed."""
    loaded = _tiny(tmp_path)
    common = {
        "eos_token_ids": [int(loaded.tokenizer.eos_token_id)],
        "pad_token_id": int(loaded.info["pad_token_id"]),
        "vocab_size": 259,
    }
    sdpa = invariance.make_batch_invariant(
        loaded.model, device="cpu", attention="sdpa", rowwise=ROWWISE, **common
    )
    cuda = invariance.make_batch_invariant(
        loaded.model, device="cuda:0", attention=ROWWISE, rowwise=ROWWISE, **common
    )
    assert not sdpa.shown and "sdpa" in sdpa.reason and sdpa.plan is None
    assert not cuda.shown and "cuda" in cuda.reason and cuda.plan is None
    assert not cache.exists()


def test_the_plan_is_cached_per_machine_and_thread_count(tmp_path: Path, cache: Path) -> None:
    """The second probe of the same shapes at the same thread count is read from the cache (same
    blocks); another thread count is another key; a damaged cache file is probed again."""
    model = _tiny(tmp_path).model
    torch.set_num_threads(1)
    first = invariance.plan_gemm_blocks(model)
    second = invariance.plan_gemm_blocks(model)
    assert (first.cached, second.cached) == (False, True)
    assert first.blocks == second.blocks and first.cache_key == second.cache_key
    torch.set_num_threads(2)
    other = invariance.plan_gemm_blocks(model)
    assert other.cache_key != first.cache_key and not other.cached
    files = sorted((cache / "invariance").glob("gemm-*.json"))
    assert len(files) == 2
    for path in files:
        path.write_text('{"blocks": ')
    again = invariance.plan_gemm_blocks(model)
    assert not again.cached and again.blocks == other.blocks
    assert json.loads(invariance._cache_file(again.cache_key).read_text())["blocks"] == again.blocks
    # A cache file that parses but holds a block size the probe never tries (0 crashed the eval
    # with ZeroDivisionError) is probed again too.
    path = invariance._cache_file(again.cache_key)
    body = json.loads(path.read_text())
    body["blocks"] = {shape: {**passes, "decode": 0} for shape, passes in body["blocks"].items()}
    path.write_text(json.dumps(body))
    third = invariance.plan_gemm_blocks(model)
    assert not third.cached and third.blocks == other.blocks


def test_changing_the_thread_count_after_the_probe_is_refused(tmp_path: Path, cache: Path) -> None:
    """The blocks hold for the thread count they were probed with: a forward at another count
    raises instead of computing rows that may depend on their batch."""
    torch.set_num_threads(1)
    loaded = _tiny(tmp_path)
    _invariant(loaded)
    torch.set_num_threads(2)
    with pytest.raises(RuntimeError, match="probed with 1 threads"):
        loaded.model(input_ids=torch.tensor([[5, 6, 7]]))


def test_blocked_products_compute_what_the_layer_computes(tmp_path: Path, cache: Path) -> None:
    """A layer computing in blocks gives each row what the plain layer gives it, to float
    rounding (the blocks change which kernel runs, not the function)."""
    torch.set_num_threads(2)
    loaded = _tiny(tmp_path)
    layer = loaded.model.model.layers[0].mlp.up_proj
    x = torch.randn(3, 37, layer.in_features, generator=torch.Generator().manual_seed(1))
    plain = F.linear(x, layer.weight)
    _invariant(loaded)
    blocked = layer(x)
    assert blocked.shape == plain.shape
    assert torch.allclose(blocked, plain, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_the_claim_holds_on_an_emulated_avx2_cpu() -> None:
    """The same tests in a process whose kernel dispatch is capped to AVX2 (ATen's capability,
    MKL's instruction cap, oneDNN's ISA cap): a lesser CPU's kernels, other row-count classes,
    and still the claim is made and holds bit for bit. On a CPU with nothing above AVX2 (no
    AVX-512, no AMX: these caps take nothing away) the capped process's CPU and BLAS facts are
    asserted to be this process's, and the tests, which the suite runs here on those kernels,
    are not run a second time."""
    from reprotune._run.kernels import kernel_facts

    env = {
        **os.environ,
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
    }
    probe = (
        "import json; from reprotune._run.kernels import kernel_facts; "
        "f = kernel_facts(); print(json.dumps([f['cpu'], f['blas']]))"
    )
    capped = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    capped_cpu, capped_blas = json.loads(capped.stdout)
    assert capped_cpu["aten_capability"] in ("AVX2", "DEFAULT")
    native = kernel_facts()
    if native["cpu"]["aten_capability"] == "AVX2" and not any(
        flag.startswith(("avx512", "amx")) for flag in native["cpu"]["isa"]
    ):
        assert [capped_cpu, capped_blas] == [native["cpu"], native["blas"]]
        return
    tests = [
        "tests/eval/test_decode.py::test_batch_sizes_give_bitwise_identical_rows",
        "tests/eval/test_decode.py::test_batch_sizes_agree_with_two_threads",
        "tests/eval/test_invariance.py::test_the_claim_is_made_with_its_evidence",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
