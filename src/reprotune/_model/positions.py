"""How many tokens a model can take: an eval that generates past them is refused, before the
run that would evaluate at its end trains (``eval.generate_at_end``) and before ``reprotune eval``."""

from __future__ import annotations

from typing import Any

from reprotune._errors import InputError


def refuse_past_the_model(config: Any, max_length: int, max_new_tokens: int) -> None:
    """Refuse an eval whose longest sequence (a prompt of ``model.max_length`` tokens and
    ``eval.max_new_tokens`` more) runs past the model's positions (transformers only warns, and
    generates from positions the model never learned), or past a sliding window, which the rowwise
    attention (over every earlier token) does not implement."""
    tokens = max_length + max_new_tokens
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and tokens > positions:
        raise InputError(
            f"eval.max_new_tokens {max_new_tokens} after prompts of up to model.max_length {max_length} "
            f"tokens reaches {tokens} tokens, past the model's {positions} positions",
            source="eval.max_new_tokens",
            fix=f"set eval.max_new_tokens to at most {max(positions - max_length, 0)}, or lower "
            "model.max_length",
        )
    softcap = getattr(config, "attn_logit_softcapping", None)
    if softcap is not None:  # Gemma 2's: the rowwise attention does not implement it
        raise InputError(
            f"the model soft-caps its attention logits (attn_logit_softcapping {softcap}), which the "
            "eval's batch-invariant attention does not implement: its scores would be another model's",
            source="model.name",
            fix="evaluate a model whose attention is plain softmax attention",
        )
    window = getattr(config, "sliding_window", None)
    uses = getattr(config, "use_sliding_window", True)
    if isinstance(window, int) and uses and window < tokens:
        raise InputError(
            f"the model attends through a sliding window of {window} tokens, which the eval's "
            f"batch-invariant attention does not implement (sequences reach {tokens} tokens)",
            source="model.name",
            fix=f"lower model.max_length + eval.max_new_tokens to at most {window}",
        )
