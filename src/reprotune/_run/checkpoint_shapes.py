"""Whether a checkpoint's weights and optimizer state fit the model, checked before anything is
loaded: ``copy_`` would broadcast a tensor of a smaller shape into a weight without a word, and
an optimizer takes moments of any shape until its first step fails. A checkpoint that does not fit
is refused (``InputError``), and the resume falls back to the previous one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from reprotune._errors import InputError

_FIX = "resume from a checkpoint this run saved"


def check_state_shapes(
    weights: Mapping[str, torch.Tensor],
    optimizer: Mapping[str, Mapping[str, Any]],
    shapes: Mapping[str, tuple[int, ...]],
) -> None:
    """Refuse ``weights`` or per-parameter ``optimizer`` state (by parameter name) that are not the
    trainable parameters ``shapes`` describes (name to shape).

    Raises:
        InputError: the first name that is not a trainable parameter, a trainable parameter it
            lacks (it would stay at its initial value), or a tensor of another shape.
    """
    missing = sorted(set(shapes) - set(weights))
    if missing:
        raise InputError(
            f"the checkpoint lacks {len(missing)} trainable weight(s), e.g. {missing[0]}",
            source=missing[0],
            fix=_FIX,
        )
    for name, tensor in weights.items():
        if name not in shapes:
            raise InputError(f"{name} is not a trainable weight of this model", source=name, fix=_FIX)
        if tuple(tensor.shape) != shapes[name]:
            shape, want = list(tensor.shape), list(shapes[name])
            raise InputError(f"{name} has shape {shape}, the model's is {want}", source=name, fix=_FIX)
    for name, entry in optimizer.items():
        if name not in shapes:
            raise InputError(f"the optimizer state of {name}: not a trainable weight", source=name, fix=_FIX)
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.ndim > 0 and tuple(value.shape) != shapes[name]:
                shape, want = list(value.shape), list(shapes[name])
                what = f"the optimizer's {key} of {name}"
                raise InputError(f"{what} has shape {shape}, the weight's is {want}", source=name, fix=_FIX)


def trainable_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Every trainable parameter's shape, by full name."""
    return {name: tuple(p.shape) for name, p in model.named_parameters() if p.requires_grad}


def optimizer_state_by_name(
    saved: Mapping[str, Any], optimizer: torch.optim.Optimizer, model: torch.nn.Module
) -> dict[str, Mapping[str, Any]]:
    """A saved ``optimizer.state_dict()``'s per-parameter state, keyed by the names of ``model``'s
    parameters that ``optimizer`` holds at those places (the saved state numbers them in order).

    Raises:
        InputError: a saved parameter group holds another number of parameters.
    """
    names = {id(p): name for name, p in model.named_parameters()}
    groups = zip(saved.get("param_groups") or [], optimizer.param_groups, strict=False)
    by_index: dict[Any, str] = {}
    for g, (kept, live) in enumerate(groups):
        indices, params = kept["params"], live["params"]
        if len(indices) != len(params):
            raise InputError(
                f"the optimizer state's parameter group {g} holds {len(indices)} parameters, the "
                f"optimizer's {len(params)}",
                source="optimizer.pt",
                fix=_FIX,
            )
        by_index.update((i, names.get(id(p), str(i))) for i, p in zip(indices, params, strict=True))
    return {by_index.get(i, str(i)): entry for i, entry in (saved.get("state") or {}).items()}
