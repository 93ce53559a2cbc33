"""Batch-invariant generation: each row's tokens (and logits, bit for bit) are those it gets alone.

Plain ``model.generate`` on a left-padded batch gives a row other logit bits than at batch size
1 (measured on SmolLM2, fp32 CPU: every row's first logits differ, by up to 5e-5), because a
row's arithmetic depends on its neighbours: the attention runs over a padded shape, and a matrix
product's per-row bits depend on how many rows it has. A close argmax then flips. Three things
remove every dependence, and ``model.generate`` still does the rest (cache, positions from the
attention mask, eos):

1. ``rowwise`` attention (:func:`rowwise_attention`): each row attends alone, its left padding
   sliced off, with exactly the call and shapes it would get at batch size 1 (grouped-query
   heads expanded by the kernel, ``enable_gqa``, not by copies).
2. Matrix products in fixed blocks of rows, of a size probed on this machine
   (``_eval.invariance``): no product's row count depends on the batch.
3. Sampling per row (:class:`RowSampler`): each row warps its own logits and draws from its own
   ``torch.Generator``; the processor hands generate a score row that is 0 at the drawn token
   and -inf elsewhere, and generate's greedy pick takes it.

The thread count must stay fixed for the whole eval (it is, and it is recorded). Whether the
rows really are independent of the batch is measured on the machine at hand before it is
claimed (``_eval.invariance.make_batch_invariant``); docs/eval.md says what is proven where.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import LogitsProcessor

from reprotune._errors import InputError
from reprotune._eval.settings import GenerationSettings, row_seed

#: The attention implementation's registered name.
ROWWISE = "reprotune_rowwise"
#: The attribute of a model whose linear layers compute in fixed blocks (``_eval.invariance``):
#: the :class:`GeneratePass` they read to pick their block.
PASS_ATTRIBUTE = "reprotune_generate_pass"


class GeneratePass:
    """Which forward pass of ``generate`` runs: the prompt's (``prefill``) or a new token's
    (``decode``). :func:`generate_rows` sets it, never a guess from shapes: a one-token prompt's
    pass looks like a new token's."""

    def __init__(self) -> None:
        self.name = "prefill"


class _PromptDone(LogitsProcessor):
    """Called by generate after each forward pass: every pass after the first is a new token's."""

    def __init__(self, current: GeneratePass) -> None:
        self.current = current

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.current.name = "decode"
        return scores


def _refuse_other_attention(module: torch.nn.Module, kwargs: dict[str, Any], kv_len: int) -> None:
    """Refuse what transformers asks of an attention beyond softmax over every earlier key."""
    window = kwargs.get("sliding_window")
    asked = {
        "logit soft-capping (softcap)": kwargs.get("softcap") is not None,
        "attention sinks (s_aux)": kwargs.get("s_aux") is not None,
        f"a sliding window of {window} tokens": isinstance(window, int) and window < kv_len,
    }
    if found := [name for name, present in asked.items() if present]:
        raise InputError(
            f"the model's attention ({type(module).__name__}) asks for {' and '.join(found)}, which the "
            "eval's batch-invariant attention does not implement: its scores would be another model's",
            source="model.name",
            fix="evaluate a model whose attention is plain softmax attention (Llama, Qwen2, Mistral "
            "within its window, ...)",
        )


def rowwise_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention one row at a time, over that row's real (unpadded) keys.

    Args:
        query: ``[B, H, q, D]``; key, value: ``[B, H_kv, L, D]``.
        attention_mask: the boolean ``[B, 1, q, L]`` mask (True = attend) or None (no padding).

    Returns:
        ``([B, q, H, D], None)``, as transformers' sdpa attention; padding queries get zeros.

    Raises:
        NotImplementedError: a chunked prefill (neither a full prefill nor one new token).
        InputError: a model whose attention does more than softmax over every earlier key (logit
            soft-capping, attention sinks, a sliding window shorter than the keys): computed
            without it, the eval would score another model.
    """
    batch, heads, q_len, dim = query.shape
    kv_len = key.shape[2]
    if q_len not in (1, kv_len):
        raise NotImplementedError("rowwise attention supports a full prefill or one new token per step")
    _refuse_other_attention(module, kwargs, kv_len)
    if attention_mask is None:
        pads = [0] * batch
    else:
        # The last query sees every real key: its first True is the number of left pads.
        pads = attention_mask[:, 0, -1, :].to(torch.int8).argmax(dim=-1).tolist()
    # Grouped-query heads expanded inside the kernel, not by copying the keys per row: the same
    # bits as copying (tested), at about a third of the time.
    gqa = int(getattr(module, "num_key_value_groups", 1)) > 1
    out = query.new_zeros(batch, q_len, heads, dim)
    # One call per row, never one per group of equally padded rows: with more than one thread,
    # SDPA's CPU kernel splits its work by the number of rows, and a row's bits change with it.
    for b in range(batch):
        pad = int(pads[b])
        first_query = max(0, pad - (kv_len - q_len))
        q = query[b : b + 1, :, first_query:, :]
        k = key[b : b + 1, :, pad:, :]
        v = value[b : b + 1, :, pad:, :]
        o = F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1, scale=scaling, enable_gqa=gqa)
        out[b, first_query:] = o[0].transpose(0, 1)
    return out, None


def register_rowwise_attention() -> str:
    """Register :func:`rowwise_attention` with transformers (idempotent); return its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ROWWISE, rowwise_attention)
    AttentionMaskInterface.register(ROWWISE, sdpa_mask)
    return ROWWISE


def warp_row(logits: torch.Tensor, settings: GenerationSettings) -> torch.Tensor:
    """One row's logits ``[V]`` after temperature, then top-k, then top-p (-inf where dropped).

    The same order and the same kept tokens as transformers' warpers; top-p keeps the tokens whose
    ascending cumulative probability exceeds ``1 - top_p``, and always the most likely one.
    """
    x = logits.float() / settings.temperature
    if settings.top_k and settings.top_k < x.numel():
        kth = torch.topk(x, settings.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if settings.top_p < 1.0:
        ordered, order = torch.sort(x, descending=False)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative <= (1 - settings.top_p)
        drop[-1] = False
        x = x.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    return x


def sample_row(logits: torch.Tensor, generator: torch.Generator, settings: GenerationSettings) -> int:
    """One token drawn from one row's warped logits (:func:`warp_row`) with ``generator``."""
    probs = warp_row(logits, settings).softmax(-1)
    # drawn where the generator is (the CPU's: a row's seed draws the same token on any device,
    # and a CUDA tensor refuses a CPU generator)
    return int(torch.multinomial(probs.to(generator.device), 1, generator=generator).item())


class RowSampler(LogitsProcessor):
    """A logits processor that samples each batch row from its own generator.

    Returns scores of -inf everywhere except 0 at each row's drawn token, so generate's greedy
    choice is the draw.
    """

    def __init__(self, generators: Sequence[torch.Generator], settings: GenerationSettings) -> None:
        self.generators = list(generators)
        self.settings = settings

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(scores, float("-inf"))
        for b, generator in enumerate(self.generators):
            out[b, sample_row(scores[b], generator, self.settings)] = 0.0
        return out


@dataclass(frozen=True)
class Generated:
    """One row's output.

    Attributes:
        ids: the generated token ids, up to and including the first eos.
        stopped_at_eos: whether an eos ended the row (else ``max_new_tokens`` did).
        logits: per generated token, the model's raw logits (only when asked for: tests).
    """

    ids: list[int]
    stopped_at_eos: bool
    logits: torch.Tensor | None = None


def _padded_batch(prompts: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(p) for p in prompts)
    ids = [[pad_token_id] * (longest - len(p)) + list(p) for p in prompts]
    mask = [[0] * (longest - len(p)) + [1] * len(p) for p in prompts]
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)


def generation_config(
    settings: GenerationSettings, *, eos_token_ids: Sequence[int], pad_token_id: int, logits: bool
) -> Any:
    """The full transformers ``GenerationConfig`` of an eval: greedy argmax over the processors'
    scores (sampling is a processor), KV cache on, nothing else."""
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=settings.max_new_tokens,
        eos_token_id=list(eos_token_ids),
        pad_token_id=pad_token_id,
        use_cache=True,
        return_dict_in_generate=True,
        output_logits=logits,
    )


@torch.no_grad()
def generate_rows(
    model: Any,
    prompts: Sequence[Sequence[int]],
    row_indices: Sequence[int],
    settings: GenerationSettings,
    *,
    batch_size: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    keep_logits: bool = False,
    on_batch: Callable[[int, int], None] | None = None,
) -> list[Generated]:
    """Generate for each prompt, ``batch_size`` rows at a time, in the given order.

    Args:
        model: a causal LM (or a PEFT model over one) whose ``generation_config`` holds nothing
            of its own (the eval's config is passed whole); batch-invariant when its attention is
            ``rowwise`` and its products run in fixed blocks (``_eval.invariance``).
        prompts: prompt token ids, one list per row.
        row_indices: each row's index in the data (its sampling seed depends on it).
        settings: decoding and length.
        batch_size: rows per generate call.
        eos_token_ids: a row stops at its first of these.
        pad_token_id: the id in padding positions.
        keep_logits: keep each generated token's raw logits (tests).
        on_batch: called with (rows done, rows in all) after each batch.

    Returns:
        One :class:`Generated` per prompt, in order.
    """
    from transformers import LogitsProcessorList

    config = generation_config(
        settings, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, logits=keep_logits
    )
    stops = {int(t) for t in eos_token_ids}
    current: GeneratePass | None = getattr(model, PASS_ATTRIBUTE, None)
    results: list[Generated] = []
    for start in range(0, len(prompts), batch_size):
        rows = list(range(start, min(start + batch_size, len(prompts))))
        input_ids, mask = _padded_batch([prompts[i] for i in rows], pad_token_id)
        processors: list[LogitsProcessor] = []
        if current is not None:
            current.name = "prefill"
            processors.append(_PromptDone(current))
        if settings.sampling:
            seeds = [row_seed(settings.eval_seed, int(row_indices[i])) for i in rows]
            generators = [torch.Generator().manual_seed(seed) for seed in seeds]
            processors.append(RowSampler(generators, settings))
        try:
            out = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                generation_config=config,
                logits_processor=LogitsProcessorList(processors),
            )
        finally:
            if current is not None:
                current.name = "prefill"
        width = input_ids.shape[1]
        for b in range(len(rows)):
            ids = [int(t) for t in out.sequences[b, width:].tolist()]
            end = next((i for i, t in enumerate(ids) if t in stops), None)
            kept = ids if end is None else ids[: end + 1]
            logits = torch.stack([step[b] for step in out.logits[: len(kept)]]) if keep_logits else None
            results.append(Generated(ids=kept, stopped_at_eos=end is not None, logits=logits))
        if on_batch is not None:
            on_batch(len(results), len(prompts))
    return results
