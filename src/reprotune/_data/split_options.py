"""What a split accepts: three ratios, a seed, a rare-class policy, one of stratify or group; each
checked before any row is drawn, with the value named and the fix."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, get_args

from reprotune._data.manifest import SPLITS
from reprotune._data.table import Table
from reprotune._errors import InputError

RarePolicy = Literal["train", "drop", "error"]
RARE_POLICIES: tuple[str, ...] = get_args(RarePolicy)


def check_ratios(ratios: Sequence[Any], *, source: str = "ratios") -> tuple[float, float, float]:
    """Validate three split ratios: finite, non-negative, summing to 1 (within 1e-9).

    Returns:
        The ratios as floats.

    Raises:
        InputError: wrong count, not numbers, negative, or not summing to 1.
    """
    fix = "give three non-negative numbers that sum to 1, e.g. 0.8,0.1,0.1 (train,validation,test)"
    values = list(ratios)
    if len(values) != 3:
        raise InputError(f"ratios {values} has {len(values)} values, not 3", source=source, fix=fix)
    out = []
    for name, value in zip(SPLITS, values, strict=True):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InputError(f"{name} ratio {value!r} is not a finite number", source=source, fix=fix)
        if value < 0:
            raise InputError(f"{name} ratio {value!r} is negative", source=source, fix=fix)
        out.append(float(value) + 0.0)  # -0.0 is 0.0: a manifest records no negative zero
    total = sum(out)
    if abs(total - 1.0) > 1e-9:
        raise InputError(f"ratios {out} sum to {total!r}, not 1", source=source, fix=fix)
    return out[0], out[1], out[2]


def check_options(
    table: Table, stratify_by: str | None, group_by: str | None, rare_class_policy: str
) -> None:
    """Refuse an unknown rare-class policy, an empty table, or both a stratify and a group column."""
    for bad, message, source, fix in (
        (
            rare_class_policy not in RARE_POLICIES,
            f"unknown rare-class policy {rare_class_policy!r}",
            "rare_class_policy",
            f"use one of {list(RARE_POLICIES)}",
        ),
        (table.n_rows == 0, "the dataset has no rows", table.source, "give a file with at least one row"),
        (
            stratify_by is not None and group_by is not None,
            f"both stratify_by ({stratify_by!r}) and group_by ({group_by!r}) were given",
            "--stratify-by / --group-by",
            "choose one: stratify to keep class proportions, or group to keep groups together",
        ),
    ):
        if bad:
            raise InputError(message, source=source, fix=fix)
