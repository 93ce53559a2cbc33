"""The scripts of bench/ that tests exercise, loaded as modules (bench/ is not a package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench_script(name: str) -> ModuleType:
    """``bench/<name>.py``, freshly executed as a module named ``name``."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
