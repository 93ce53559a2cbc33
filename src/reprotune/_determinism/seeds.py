"""Seeds: one root, a seed per consumer derived from it by name, and global seeding helpers.

One root seed feeds every consumer through :func:`derive_seed`, a stable, documented function
of ``(root, consumer name)`` alone, so adding, renaming or overriding one consumer never shifts
another. :func:`seed_everything` and :func:`seed_worker` are public helpers for users' own
scripts (``reprotune.seed_everything``, ``reprotune.seed_worker``).

The pure functions (:data:`CONSUMERS`, :func:`derive_seed`, :func:`derive_seeds`) import nothing
heavy: commands that read records (compare, report) use them without importing torch. Functions
that touch torch or NumPy import them when called.
"""

from __future__ import annotations

import hashlib
import importlib.util
import operator
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from reprotune._errors import InputError

if TYPE_CHECKING:
    import torch

#: The consumers of randomness that get their own derived seed, in recording order.
CONSUMERS: tuple[str, ...] = ("split", "data_order", "lora_init", "dropout", "eval")

#: Seeds are non-negative and fit a signed 64-bit integer, so every library and JSON reader takes them.
SEED_LIMIT = 2**63

_DERIVATION_PREFIX = "reprotune/seed/v1"
_MASK_63 = SEED_LIMIT - 1
_U32 = 0xFFFFFFFF


def check_seed(
    value: object,
    what: str = "seed",
    *,
    source: str | None = None,
    fix: str = "use a whole number below 9223372036854775808, e.g. 42",
) -> int:
    """``value`` as an ``int`` if it is a seed (an integer in ``[0, 2**63)``, NumPy's too, not a
    bool), else raise :class:`InputError` naming ``what`` (and ``source``: where it came from)."""
    try:
        seed = -1 if isinstance(value, bool) else operator.index(value)  # type: ignore[arg-type]
    except TypeError:  # not an integer; NumPy's integers are
        seed = -1
    if not 0 <= seed < SEED_LIMIT:
        raise InputError(f"{what} must be an integer in [0, 2**63) (got {value!r})", source=source, fix=fix)
    return seed


def mixed_seed(prefix: str, *parts: object) -> int:
    """``sha256("<prefix>/<part>/<part>...")``, its first 8 bytes big-endian, masked to 63 bits:
    the one rule every seed reprotune derives follows (each use has its own versioned prefix, so
    records that depend on it never change meaning).

    Example:
        >>> mixed_seed("reprotune/seed/v1", 42, "split") == derive_seed(42, "split")
        True
    """
    digest = hashlib.sha256("/".join([prefix, *map(str, parts)]).encode()).digest()
    return int.from_bytes(digest[:8], "big") & _MASK_63


def derive_seed(root: int, name: str) -> int:
    """Derive the seed of consumer ``name`` from the root seed.

    The derivation (version 1, stable forever: records depend on it) is::

        digest = sha256(f"reprotune/seed/v1/{root}/{name}".encode("utf-8"))
        seed = int.from_bytes(digest[:8], "big") & (2**63 - 1)

    It depends on ``root`` and ``name`` only, so one consumer's seed never moves when another
    consumer is added, renamed or overridden.

    Args:
        root: the root seed, an integer in ``[0, 2**63)``.
        name: the consumer's name (any non-empty string; see :data:`CONSUMERS`).

    Returns:
        An integer in ``[0, 2**63)``.

    Raises:
        InputError: ``root`` is out of range or ``name`` is empty.

    Example:
        >>> derive_seed(42, "split")
        7567179834970707508
    """
    root = check_seed(root, "root seed")
    if not isinstance(name, str) or not name:
        raise InputError(f"seed consumer name must be a non-empty string (got {name!r})")
    return mixed_seed(_DERIVATION_PREFIX, root, name)


def derive_seeds(root: int, overrides: Mapping[str, int] | None = None) -> dict[str, int]:
    """Every seed of a run: ``root`` plus one per consumer in :data:`CONSUMERS`.

    Args:
        root: the root seed.
        overrides: consumer -> explicit seed, replacing that consumer's derived seed only.

    Returns:
        ``{"root": root, "split": ..., "data_order": ..., "lora_init": ..., "dropout": ..., "eval": ...}``.

    Raises:
        InputError: an override names an unknown consumer, or a seed is out of range.
    """
    root = check_seed(root, "root seed")
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(CONSUMERS))
    if unknown:
        raise InputError(
            f"unknown seed consumer(s) {', '.join(map(repr, unknown))}",
            source="seed.overrides",
            fix=f"use one of {', '.join(CONSUMERS)}",
        )
    seeds = {"root": root}
    for consumer in CONSUMERS:
        if consumer in overrides:
            seeds[consumer] = check_seed(overrides[consumer], f"seed.overrides.{consumer}")
        else:
            seeds[consumer] = derive_seed(root, consumer)
    return seeds


#: What the last :func:`seed_everything` in this process seeded (None before the first call).
_last_seeding: dict[str, Any] | None = None


def seed_everything(seed: int) -> int:
    """Seed Python's ``random``, NumPy's legacy global RNG and torch (CPU and every CUDA device),
    and TensorFlow when it is installed.

    NumPy's legacy seeding takes 32-bit words, so the seed is passed as its low and high 32-bit
    halves: every bit of a 63-bit seed counts. TensorFlow (never a requirement of reprotune) gets
    ``tf.random.set_seed(seed)`` and its deterministic ops
    (``tf.config.experimental.enable_op_determinism()``), for scripts that use it beside torch.
    What was seeded is kept for the run's record (:func:`last_seeding`).

    Args:
        seed: an integer in ``[0, 2**63)``.

    Returns:
        The seed used.

    Raises:
        InputError: ``seed`` is out of range.
    """
    import numpy as np
    import torch

    global _last_seeding
    seed = check_seed(seed, "seed")
    random.seed(seed)
    np.random.seed([seed & _U32, seed >> 32])
    torch.manual_seed(seed)  # also seeds every CUDA device
    seeding: dict[str, Any] = {"seed": seed, "seeded": ["python", "numpy", "torch"]}
    tensorflow = _seed_tensorflow(seed)
    if tensorflow is not None:
        if "error" not in tensorflow:
            seeding["seeded"].append("tensorflow")
        seeding["tensorflow"] = tensorflow
    _last_seeding = seeding
    return seed


def _seed_tensorflow(seed: int) -> dict[str, Any] | None:
    """Seed TensorFlow and turn on its deterministic ops, if it is installed; what was done."""
    if importlib.util.find_spec("tensorflow") is None:
        return None
    try:
        import tensorflow as tf

        tf.random.set_seed(seed)
        tf.config.experimental.enable_op_determinism()
    except Exception as exc:  # a broken TensorFlow must not stop a torch script: said and recorded
        import warnings

        problem = f"{type(exc).__name__}: {str(exc)[:200]}"
        warnings.warn(f"reprotune.seed_everything: TensorFlow is installed but {problem}", stacklevel=3)
        return {"error": problem}
    return {"version": str(tf.__version__), "op_determinism": True}


def last_seeding() -> dict[str, Any] | None:
    """What the last :func:`seed_everything` in this process seeded, or None if it was never called:
    ``{"seed": ..., "seeded": ["python", "numpy", "torch", ("tensorflow")], ("tensorflow":
    {"version": ..., "op_determinism": true})}``."""
    if _last_seeding is None:
        return None
    return {**_last_seeding, "seeded": list(_last_seeding["seeded"])}


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn`` for a ``torch.utils.data.DataLoader``: seed Python and NumPy in a worker.

    torch seeds each worker with ``base_seed + worker_id``, where ``base_seed`` is drawn from the
    DataLoader's ``generator``; this carries that seed to ``random`` and NumPy, which torch leaves
    alone. Pass ``generator=torch_generator(seeds["data_order"])`` too, or the base seed itself
    comes from the unseeded global generator.

    Args:
        worker_id: the worker's index (unused: torch already folded it into the seed).
    """
    import numpy as np
    import torch

    del worker_id
    worker_seed = torch.initial_seed() & _MASK_63
    random.seed(worker_seed)
    np.random.seed([worker_seed & _U32, worker_seed >> 32])


def torch_generator(seed: int, device: str = "cpu") -> torch.Generator:
    """A new ``torch.Generator`` on ``device`` seeded with ``seed``: randomness reprotune owns.

    Raises:
        InputError: ``seed`` is out of range.
    """
    import torch

    seed = check_seed(seed, "seed")
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator
