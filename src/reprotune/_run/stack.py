"""Whether the installed library stack is one CI proves: the record's ``environment.stack``.

pyproject.toml declares ranges; CI proves two points in them, each a constraints file shipped in
the package (``reprotune/stacks/``): the lock (the exact versions this project's own runs use)
and the floors (the oldest versions the ranges allow). A stack is *tested* when every runtime
requirement of reprotune (and torch) is installed at one file's exact version, else *untested*,
with the packages that differ named. Versions compare by their public part: torch's local build
label (``+cpu``, ``+cu128``) is another record field (``environment.torch``).
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping
from importlib import resources
from typing import Any

#: The constraints files CI proves, in the order they are tried.
STACK_FILES: tuple[str, ...] = ("lock", "floor")

#: Distributions whose code computes a training step, as the record names them: a version
#: difference among them is a numbers cause ``reprotune trace`` can take apart (where the two code
#: paths part, and where that changes the numbers). Most direct first.
COMPUTING_LIBRARIES: tuple[str, ...] = (
    "torch", "transformers", "peft", "accelerate", "trl", "bitsandbytes", "flash-attn", "xformers",
    "deepspeed", "triton", "liger-kernel", "numpy",
)  # fmt: skip


def library_versions() -> dict[str, str]:
    """The installed version of each of :data:`COMPUTING_LIBRARIES` that is installed."""
    found = {}
    for name in COMPUTING_LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def pinned(stack: str) -> dict[str, str]:
    """``name -> version`` of every ``name==version`` line of a shipped constraints file."""
    text = resources.files("reprotune").joinpath("stacks", f"{stack}.txt").read_text(encoding="utf-8")
    pins: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[_canonical(name)] = _public(version.strip())
    return pins


def runtime_requirements() -> tuple[str, ...]:
    """The names of reprotune's runtime requirements (no extras), canonical; empty when
    reprotune is not installed as a distribution (run from a source tree)."""
    try:
        requires = importlib.metadata.requires("reprotune") or []
    except importlib.metadata.PackageNotFoundError:
        return ()
    runtime = [spec for spec in requires if "extra" not in spec]
    names = {_canonical(re.split(r"[\s;<>=!~\[(]", spec, maxsplit=1)[0]) for spec in runtime}
    return tuple(sorted(names))


def stack_facts(distributions: Mapping[str, str | None]) -> dict[str, Any]:
    """``{"stack": "tested (lock)" | "tested (floor)" | "untested", "differs": {...}}``.

    Args:
        distributions: canonical name -> installed version (the record's
            ``environment.distributions``).

    Returns:
        For an untested stack, ``closest`` names the file it differs least from and ``differs``
        maps each runtime requirement installed at another version (or missing) to
        ``{"installed": ..., <closest>: ...}``; ``differs`` is empty for a tested stack.
    """
    names = runtime_requirements()
    if not names:
        return {"stack": "untested", "closest": None, "differs": {"reprotune": {"installed": None}}}
    versions = {name: distributions.get(name) for name in names}
    installed = {name: _public(version) if version else None for name, version in versions.items()}
    files = {stack: pinned(stack) for stack in STACK_FILES}
    off = {
        stack: [name for name in names if installed[name] != pins.get(name)] for stack, pins in files.items()
    }
    for stack in STACK_FILES:
        if not off[stack]:
            return {"stack": f"tested ({stack})", "differs": {}}
    closest = min(STACK_FILES, key=lambda stack: len(off[stack]))
    differs = {
        name: {"installed": installed[name], closest: files[closest].get(name)} for name in off[closest]
    }
    return {"stack": "untested", "closest": closest, "differs": differs}


def mlflow_store_problem(distributions: Mapping[str, str | None]) -> str | None:
    """Why MLflow cannot open a SQL tracking store with the installed pair, or None: mlflow-skinny
    (or mlflow) before 3.9 imports a pool class SQLAlchemy 2.1 removed. pyproject.toml's ranges
    exclude it (mlflow-skinny >= 3.9); a stack installed past them (``--no-deps``) can hold it.

    Example:
        >>> mlflow_store_problem({"mlflow-skinny": "3.8.1", "sqlalchemy": "2.1.9"})[:40]
        'mlflow-skinny 3.8.1 cannot open a SQL tr'
        >>> mlflow_store_problem({"mlflow-skinny": "3.9.0", "sqlalchemy": "2.1.9"}) is None
        True
    """
    name = "mlflow-skinny" if distributions.get("mlflow-skinny") else "mlflow"
    mlflow, sqlalchemy = distributions.get(name), distributions.get("sqlalchemy")
    if not (mlflow and sqlalchemy) or not (_release(mlflow) < (3, 9) and _release(sqlalchemy) >= (2, 1)):
        return None
    return (
        f"{name} {mlflow} cannot open a SQL tracking store with SQLAlchemy {sqlalchemy}: it imports a "
        "pool class SQLAlchemy 2.1 removed (mlflow-skinny 3.9 and later do not)"
    )


def _release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version: ``2.1.0rc1`` -> (2, 1, 0)."""
    numbers = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(n) for n in numbers.group(0).split(".")) if numbers else ()
