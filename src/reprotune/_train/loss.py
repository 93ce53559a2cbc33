"""The loss: next-token cross-entropy over the response tokens, summed.

Logits are computed only where the loss reads them (``logits_to_keep``: from the first position
any row scores), and the labels are shifted instead of the logits (no copy of the largest
activation of a small model). The step and validation that use it: ``_train.step``.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch
import torch.nn.functional as F


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The autocast context for a ``train.precision`` (none for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def supports_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the (base) model's ``forward`` takes ``logits_to_keep`` (transformers' causal LMs do)."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def logits_to_keep(labels: torch.Tensor) -> int:
    """How many trailing positions need logits: from the first one whose next token is labelled.

    The prompt before it is never scored, so its logits (a ``vocab``-wide row per position, the
    largest activation of a small model) need not be computed. Give CPU labels: this reads them.
    """
    scored = (labels[:, 1:] != -100).any(dim=0).nonzero()
    first = int(scored[0]) if len(scored) else labels.shape[1] - 1
    return int(labels.shape[1]) - first


def token_loss_sum(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], *, keep: int | None = None
) -> torch.Tensor:
    """Sum of next-token cross-entropy over the labelled (response) tokens.

    Args:
        model: the causal LM.
        batch: ``input_ids``, ``attention_mask``, ``labels`` (-100 where not scored), ``position_ids``.
        keep: compute logits only for the last ``keep`` positions (:func:`logits_to_keep`; the
            model must take ``logits_to_keep``); None: every position.
    """
    extra = {} if keep is None else {"logits_to_keep": keep}
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch.get("position_ids"),
        **extra,
    ).logits
    # Position p predicts token p + 1: shift the labels (not the logits, which would copy them).
    length, kept = batch["labels"].shape[1], logits.shape[1]
    labels = F.pad(batch["labels"][:, length - kept + 1 :], (0, 1), value=-100)
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100, reduction="sum"
    )
