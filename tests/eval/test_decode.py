"""Batch-invariant generation (reprotune._eval.decode, _eval.invariance): where the eval claims it on
this machine, every row's tokens and logits, bit for bit, are those it gets at batch size 1, greedy
and sampling, on the tiny models with a LoRA adapter; and it claims it only where it was shown."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from reprotune._config.schema import ExperimentConfig, ModelConfig
from reprotune._eval.decode import Generated, generate_rows, rowwise_attention, sample_row, warp_row
from reprotune._eval.model import EvalModel, load_eval_model
from reprotune._eval.settings import GenerationSettings, row_seed
from reprotune.testing import build_tiny_model

GREEDY = GenerationSettings("greedy", 1.0, 0, 1.0, max_new_tokens=10, eval_seed=7)
SAMPLE = GenerationSettings("sample", 0.8, 50, 0.95, max_new_tokens=10, eval_seed=7)
PROMPTS = [f"question {i}: " + "why " * (i % 5) + "is the sky blue" * (i % 3) for i in range(11)]
TARGETS = {"llama": ["q_proj", "v_proj"], "qwen2": ["q_proj", "v_proj"], "gpt2": ["c_attn"]}


def _model(tmp_path: Path, architecture: str) -> EvalModel:
    """The tiny model with a random (not zero) LoRA adapter, loaded as an eval loads it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    directory = build_tiny_model(tmp_path / architecture, seed=0, architecture=architecture)  # type: ignore[arg-type]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_pretrained(directory)
        config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS[architecture], init_lora_weights=False)
        get_peft_model(base, config).save_pretrained(tmp_path / f"{architecture}-adapter")
    cfg = ExperimentConfig(model=ModelConfig(name=str(directory), max_length=64))
    return load_eval_model(
        cfg,
        {},
        tmp_path / f"{architecture}-adapter",
        device="cpu",
        allow_tokenizer_change=False,
        record_path=tmp_path,
    )


def _generate(
    loaded: EvalModel, settings: GenerationSettings, batch_size: int, order: list[int]
) -> list[Generated]:
    tokenizer = loaded.tokenizer
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[i]}], add_generation_prompt=True)
        for i in order
    ]
    return generate_rows(
        loaded.model,
        [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts],
        order,
        settings,
        batch_size=batch_size,
        eos_token_ids=loaded.eos_token_ids,
        pad_token_id=int(loaded.info["pad_token_id"]),
        keep_logits=True,
    )


def _claimed(loaded: EvalModel) -> None:
    """The eval claims batch invariance here, with its evidence (the probe and the check)."""
    invariance = loaded.invariance
    assert invariance.shown, invariance.to_json()
    assert invariance.check is not None and invariance.check["equal"]
    assert invariance.plan is not None and invariance.plan.threads == torch.get_num_threads()


def _same(a: list[Generated], b: list[Generated]) -> None:
    assert [g.ids for g in a] == [g.ids for g in b]
    for x, y in zip(a, b, strict=True):
        assert x.logits is not None and y.logits is not None
        assert torch.equal(x.logits, y.logits)  # bitwise, every generated step


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    # An eval runs at the run's thread count; 1 here (2 in the test that says so). The conftest
    # fixture puts the count back after each test.
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, EvalModel]:
    # Loaded (and so probed) at the thread count the tests generate with.
    root, threads = tmp_path_factory.mktemp("decode"), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {architecture: _model(root, architecture) for architecture in TARGETS}
    finally:
        torch.set_num_threads(threads)


@pytest.fixture()
def loaded(models: dict[str, EvalModel]) -> EvalModel:
    return models["llama"]


@pytest.mark.parametrize("architecture", list(TARGETS))
@pytest.mark.parametrize("settings", [GREEDY, SAMPLE], ids=["greedy", "sample"])
def test_batch_sizes_give_bitwise_identical_rows(
    models: dict[str, EvalModel], architecture: str, settings: GenerationSettings
) -> None:
    """The eval claims batch invariance on this machine, and batch sizes 1, 3 and 8 (left padding)
    give every row the same token ids and the same logits bits at every step, on Llama, Qwen2
    and GPT-2 with LoRA."""
    loaded = models[architecture]
    _claimed(loaded)
    order = list(range(len(PROMPTS)))
    alone = _generate(loaded, settings, 1, order)
    assert len({len(PROMPTS[i]) for i in order}) > 5  # prompts of many lengths: real left padding
    for batch_size in (3, 8):
        _same(alone, _generate(loaded, settings, batch_size, order))


def test_batch_sizes_agree_with_two_threads(tmp_path: Path) -> None:
    """With 2 threads (the config's default) the probe runs at 2 threads, the claim is made, and
    batch sizes 1 and 5 agree bit for bit."""
    torch.set_num_threads(2)
    loaded = _model(tmp_path, "llama")
    _claimed(loaded)
    order, short = list(range(5)), GenerationSettings("greedy", 1.0, 0, 1.0, max_new_tokens=4, eval_seed=7)
    _same(_generate(loaded, short, 1, order), _generate(loaded, short, 5, order))


def test_a_row_does_not_depend_on_its_neighbours(loaded: EvalModel) -> None:
    """Rows evaluated in reverse order (other neighbours, other batch positions) give the same
    sampled tokens: each row draws from its own generator, seeded by its row index."""
    order = list(range(len(PROMPTS)))
    forward = _generate(loaded, SAMPLE, 8, order)
    backward = _generate(loaded, SAMPLE, 8, order[::-1])[::-1]
    _same(forward, backward)


def test_sampling_repeats_under_a_seed_and_moves_with_it(loaded: EvalModel) -> None:
    """The same eval seed repeats every sampled row; another eval seed changes them; sampling is
    not greedy decoding."""
    order = list(range(len(PROMPTS)))
    first = _generate(loaded, SAMPLE, 8, order)
    _same(first, _generate(loaded, SAMPLE, 8, order))
    other = _generate(loaded, GenerationSettings("sample", 0.8, 50, 0.95, 12, eval_seed=8), 8, order)
    assert sum(a.ids != b.ids for a, b in zip(first, other, strict=True)) >= len(order) // 2
    greedy = _generate(loaded, GREEDY, 8, order)
    assert sum(a.ids != b.ids for a, b in zip(first, greedy, strict=True)) >= len(order) // 2


@pytest.mark.parametrize("threads", [1, 2])
def test_rowwise_attention_expands_kv_heads_without_changing_a_bit(threads: int) -> None:
    """Grouped-query heads expanded by the kernel (``enable_gqa``) give each row, prefill and
    decode step, the bits that SDPA gives on that row alone with its keys copied per head."""
    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(0)
    heads, kv_heads, length, dim = 9, 3, 12, 16
    pads = [0, 3, 7, 3]
    mask = torch.tensor([[i >= pad for i in range(length)] for pad in pads])
    module = torch.nn.Module()
    module.num_key_value_groups = heads // kv_heads  # type: ignore[assignment]
    key = torch.randn(len(pads), kv_heads, length, dim, generator=generator)
    value = torch.randn(len(pads), kv_heads, length, dim, generator=generator)
    for q_len in (length, 1):  # a full prefill, then one new token
        query = torch.randn(len(pads), heads, q_len, dim, generator=generator)
        causal = torch.ones(q_len, length, dtype=torch.bool).tril(length - q_len)
        attention_mask = mask[:, None, None, :] & causal  # [B, 1, q, L], True = attend
        out, _ = rowwise_attention(module, query, key, value, attention_mask, scaling=dim**-0.5)
        for b, pad in enumerate(pads):
            first = max(0, pad - (length - q_len))
            copied = [x[b : b + 1, :, pad:].repeat_interleave(heads // kv_heads, dim=1) for x in (key, value)]
            alone = torch.nn.functional.scaled_dot_product_attention(
                query[b : b + 1, :, first:].contiguous(), *copied, is_causal=q_len > 1, scale=dim**-0.5
            )
            assert torch.equal(out[b, first:], alone[0].transpose(0, 1))
            assert not out[b, :first].any()  # padding queries get zeros


def test_rowwise_attention_computes_what_sdpa_computes(loaded: EvalModel) -> None:
    """At batch size 1 the rowwise attention's logits agree with transformers' sdpa to float
    rounding: it is the same function, arranged so that no row depends on another."""
    ids = torch.tensor([[5, 17, 99, 3, 250, 8]])
    model: Any = loaded.model
    with torch.no_grad():
        rowwise = model(input_ids=ids).logits
        base = model.get_base_model()
        base.set_attn_implementation("sdpa")
        try:
            sdpa = model(input_ids=ids).logits
        finally:
            base.set_attn_implementation(loaded.attention)
    assert torch.allclose(rowwise, sdpa, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(0.7, 50, 0.9), (1.0, 0, 0.95), (1.3, 20, 1.0), (0.5, 0, 0.5)]
)
def test_warp_row_keeps_what_transformers_warpers_keep(temperature: float, top_k: int, top_p: float) -> None:
    """The per-row warpers keep exactly the tokens transformers' temperature, top-k and top-p
    warpers keep, with the same values, so seeded sampling means what users expect; draws come
    from the kept tokens only."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(3))
    expected = TemperatureLogitsWarper(temperature)(None, logits.clone())  # type: ignore[arg-type]
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)  # type: ignore[arg-type]
    if top_p < 1.0:
        expected = TopPLogitsWarper(top_p)(None, expected)  # type: ignore[arg-type]
    settings = GenerationSettings("sample", temperature, top_k, top_p, 1, 0)
    for row in range(4):
        ours = warp_row(logits[row], settings)
        kept = torch.isfinite(expected[row])
        assert torch.equal(torch.isfinite(ours), kept)
        assert torch.allclose(ours[kept], expected[row][kept], atol=0, rtol=1e-6)
        draws = {sample_row(logits[row], torch.Generator().manual_seed(s), settings) for s in range(200)}
        assert draws <= set(kept.nonzero().flatten().tolist())


def test_row_seed_is_a_function_of_seed_and_row() -> None:
    """A row's sampling seed depends on the eval seed and its row index only (pinned values)."""
    assert (
        row_seed(7, 12) == 1476910712508461924
    )  # sha256("reprotune/eval-row/v1/7/12"): records depend on it
    assert row_seed(7, 12) == row_seed(7, 12)
    assert len({row_seed(7, i) for i in range(100)}) == 100
    assert row_seed(7, 12) != row_seed(8, 12)
    assert 0 <= row_seed(2**63 - 1, 10**9) < 2**63


@pytest.mark.parametrize(
    ("asked", "named"),
    [
        ({"softcap": 50.0}, "logit soft-capping (softcap)"),
        ({"s_aux": torch.zeros(2)}, "attention sinks (s_aux)"),
        ({"sliding_window": 4}, "a sliding window of 4 tokens"),
    ],
    ids=["gemma2 softcap", "gpt-oss sinks", "window shorter than the keys"],
)
def test_rowwise_attention_refuses_what_it_does_not_compute(asked: dict[str, Any], named: str) -> None:
    """Attention arguments beyond softmax over every earlier key were dropped without a word (the
    eval scored another model); a window as long as the keys, or none, computes as before."""
    from reprotune._errors import InputError

    query = key = value = torch.zeros(1, 2, 6, 4)
    with pytest.raises(InputError, match=re.escape(named)):
        rowwise_attention(torch.nn.Module(), query, key, value, None, **asked)
    rowwise_attention(torch.nn.Module(), query, key, value, None, sliding_window=6, softcap=None, s_aux=None)


def test_a_soft_capping_model_is_refused_before_the_eval() -> None:
    """Gemma 2's attn_logit_softcapping is named from the model's config, before any row runs."""
    from types import SimpleNamespace

    from reprotune._errors import InputError
    from reprotune._model.positions import refuse_past_the_model

    config = SimpleNamespace(max_position_embeddings=8192, attn_logit_softcapping=50.0)
    with pytest.raises(InputError, match=r"attn_logit_softcapping 50\.0"):
        refuse_past_the_model(config, 64, 8)
    refuse_past_the_model(SimpleNamespace(max_position_embeddings=8192, attn_logit_softcapping=None), 64, 8)
