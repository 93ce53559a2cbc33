"""Which layers of a model a LoRA config targets: the names it can target, the targets that match
nothing, a rank past every targeted layer's width. No torch import (modules are read by name)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from reprotune._errors import InputError

if TYPE_CHECKING:
    import torch

# Layer types PEFT's LoRA can wrap, by class name (transformers' GPT-2 style Conv1D included).
_LORA_LAYER_TYPES = frozenset({"Linear", "Embedding", "Conv1d", "Conv2d", "Conv3d", "Conv1D"})


def target_module_names(model: torch.nn.Module) -> list[str]:
    """Short names of the model's layers LoRA can target (``q_proj``, ``v_proj``, ``lm_head``, ...).

    Returns:
        Sorted, deduplicated last components of the names of leaf modules of a type LoRA supports.
    """
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if name and type(module).__name__ in _LORA_LAYER_TYPES and not any(True for _ in module.children())
    }
    return sorted(names)


def unmatched_targets(model: torch.nn.Module, target_modules: Sequence[str]) -> list[str]:
    """The entries of ``target_modules`` that match no module (PEFT's suffix rule for lists)."""
    module_names = [name for name, _ in model.named_modules() if name]
    return [key for key in target_modules if not any(_targeted(n, [key]) for n in module_names)]


def _targeted(name: str, target_modules: Sequence[str]) -> bool:
    """Whether the module ``name`` is one of ``target_modules`` (PEFT's suffix rule for lists)."""
    return any(name == key or name.endswith(f".{key}") for key in target_modules)


def refuse_a_rank_past_the_layers(model: torch.nn.Module, r: int, targets: Sequence[str]) -> None:
    """Refuse a rank above every targeted layer's width: it adds nothing, and a huge one exhausts
    memory inside PEFT (an internal error, before)."""
    widths = {
        name: (m.in_features, m.out_features)
        for name, m in model.named_modules()
        if type(m).__name__ == "Linear" and (targets == ["all-linear"] or _targeted(name, targets))
    }
    name, shape = max(widths.items(), key=lambda item: max(item[1]), default=("", (r, r)))
    if r > max(shape):
        raise InputError(
            f"lora.r {r} is larger than any layer it targets is wide (the widest, {name}, is "
            f"{shape[0]} x {shape[1]})",
            source="lora.r",
            fix=f"set lora.r to at most {max(shape)} (LoRA ranks are usually 4 to 64)",
        )
