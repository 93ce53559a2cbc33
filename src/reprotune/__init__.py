"""reprotune: reproducible LLM fine-tuning, proven.

Public names are listed once in ``__all__`` and imported lazily, so that ``import reprotune``
and the commands that need no model never import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from reprotune._errors import (
    ConfigError,
    InputError,
    ReprotuneError,
    RunFailedError,
    SchemaVersionError,
)
from reprotune._version import __version__

# public name -> module that defines it
_LAZY: dict[str, str] = {}

__all__ = [
    "ConfigError",
    "InputError",
    "ReprotuneError",
    "RunFailedError",
    "SchemaVersionError",
    "__version__",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'reprotune' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
