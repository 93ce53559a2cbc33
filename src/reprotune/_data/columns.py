"""The columns a config names (prompt, response, stratify and group columns), checked against a
table before anything uses them: every missing one reported at once, by its config key."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from reprotune._config.schema import ExperimentConfig
from reprotune._data.table import Table
from reprotune._errors import InputError


def config_columns(cfg: ExperimentConfig) -> list[tuple[str, str]]:
    """``(config key, column name)`` for every column the config names (unset keys left out; the
    split's columns only when the run makes its split: with ``split.manifest`` they are ignored)."""
    values: dict[str, str | None] = {
        "data.prompt_field": cfg.data.prompt_field,
        "data.response_field": cfg.data.response_field,
    }
    if cfg.split.manifest is None:
        values |= {"split.stratify_by": cfg.split.stratify_by, "split.group_by": cfg.split.group_by}
    return [(key, value) for key, value in values.items() if value is not None]


def missing_columns(cfg: ExperimentConfig, columns: Sequence[str]) -> list[tuple[str, str]]:
    """``(config key, column name)`` for each column the config names that ``columns`` lacks."""
    return [(key, name) for key, name in config_columns(cfg) if name not in columns]


def check_config_columns(cfg: ExperimentConfig, table: Table) -> None:
    """Raise when the config names a column the table does not have.

    Raises:
        InputError: naming every missing column with its config key (the ``source`` is the first
            key, which the CLI turns into file, line and column), the columns there are, and the fix.
    """
    missing = missing_columns(cfg, table.columns)
    if not missing:
        return
    named = "; ".join(f"{key} names column {name!r}{_close(name, table.columns)}" for key, name in missing)
    keys = " and ".join(key for key, _ in missing)
    raise InputError(
        f"{named}: no such column in {table.source}; its columns are {table.columns}",
        source=missing[0][0],
        fix=f"set {keys} to one of {table.columns}",
    )


def _close(name: str, columns: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(columns), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
