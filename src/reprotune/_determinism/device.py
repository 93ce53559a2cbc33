"""The one place a config's device name becomes a torch device."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reprotune._errors import InputError

if TYPE_CHECKING:
    import torch


def resolve_device(name: str, *, source: str = "determinism.device") -> torch.device:
    """The concrete device for a device name: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.

    Args:
        name: the name; ``auto`` is cuda when torch sees a GPU, else cpu.
        source: where the name came from, for messages.

    Returns:
        A ``torch.device`` of type ``cpu`` or ``cuda``.

    Raises:
        InputError: not a device name, or a CUDA device that is not present.
    """
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise InputError(
            f"device {name!r} is not a torch device", source=source, fix="use cpu, cuda, cuda:N or auto"
        ) from None
    if device.type not in ("cpu", "cuda"):
        raise InputError(f"unknown device {name!r}", source=source, fix="use cpu, cuda, cuda:N or auto")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(
                f"device {name!r} was asked for but torch sees no CUDA device",
                source=source,
                fix="use --set determinism.device=cpu (or auto), or a CUDA build of torch on a GPU machine",
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError(
                f"device {name!r} does not exist: {torch.cuda.device_count()} CUDA device(s) here",
                source=source,
                fix="use 'cuda' or a smaller index",
            )
    return device
