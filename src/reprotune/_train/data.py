"""The data side of a run: load the table, make or load the split manifest, serve rows by index.

Tokenisation happens later, in the training loop, and only on rows of the split it trains on.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprotune._config.schema import ExperimentConfig
from reprotune._data.columns import check_config_columns
from reprotune._data.loaders import CONFIG_FORMAT, load_table
from reprotune._data.manifest import Manifest, copy_manifest, load_manifest, write_manifest
from reprotune._data.sampling import sample_rows
from reprotune._data.split import RareClassWarning, holds_same_rows, split_table
from reprotune._data.table import Table, not_text
from reprotune._errors import InputError
from reprotune._jsonio import sha256_file
from reprotune._run import layout

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class RunData:
    """The table a run trains on, its manifest, and where each came from.

    ``manifest_sha256`` is None until the manifest is in the run directory (:func:`save_manifest`);
    ``given_manifest`` is the user's manifest file that is copied there, if one was given.
    """

    table: Table
    manifest: Manifest
    manifest_sha256: str | None
    manifest_source: str
    prompt_field: str
    response_field: str
    eval_max_rows: int | None
    split_warnings: tuple[str, ...] = ()
    given_manifest: Path | None = None

    def split_rows(self, name: str) -> list[int]:
        """Dataset row indices of split ``name``, in manifest order."""
        return [int(i) for i in self.manifest.indices[name]]

    def eval_rows(self, seed: int) -> list[int]:
        """Validation rows, capped at ``eval.max_rows`` by a seeded draw (kept in manifest order)."""
        return sample_rows(self.split_rows("validation"), self.eval_max_rows, seed)

    def describe(self) -> dict[str, Any]:
        """The record's ``data`` section."""
        return {
            "source": self.table.source,
            "file_sha256": self.table.file_sha256,
            "n_rows": self.table.n_rows,
            "manifest_sha256": self.manifest_sha256,
            "manifest_source": self.manifest_source,
            "manifest_file": layout.MANIFEST,
            "split_sizes": {name: len(self.manifest.indices[name]) for name in SPLITS},
            "prompt_field": self.prompt_field,
            "response_field": self.response_field,
            "split_warnings": list(self.split_warnings),
        }


def prepare_data(
    cfg: ExperimentConfig,
    seeds: Mapping[str, int],
    manifest_out: Path | None,
    *,
    reuse_manifest: bool = False,
    manifest: Path | None = None,
) -> RunData:
    """Load the data, then take the split from the configured manifest or make it with the split seed.

    The manifest used is written to ``manifest_out`` (the run directory's ``split.json``); with
    ``manifest_out`` None nothing is written (a new run checks its data before its directory
    exists, then calls :func:`save_manifest`). With ``reuse_manifest`` (a resumed run) the one
    already at ``manifest_out`` is used; ``manifest`` overrides the config's split (a rerun of a
    recorded run).

    Raises:
        InputError: missing fields, a manifest made from other data, a row without text.
    """
    table = load_table(cfg.data.path, cfg.data.format, format_fix=CONFIG_FORMAT)
    check_config_columns(cfg, table)
    given = manifest if manifest is not None else cfg.split.manifest
    reused = reuse_manifest and manifest_out is not None and manifest_out.exists()
    split_warnings: list[str] = []
    if reused:
        assert manifest_out is not None
        loaded, source = load_manifest(manifest_out), "run directory (resumed)"
    elif given is not None:
        loaded, source = load_manifest(given), str(given)
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RareClassWarning)
            loaded = split_table(
                table,
                ratios=tuple(cfg.split.ratios),
                seed=seeds["split"],
                stratify_by=cfg.split.stratify_by,
                group_by=cfg.split.group_by,
                rare_class_policy=cfg.split.rare_class_policy,
            )
        split_warnings = [str(w.message) for w in caught if issubclass(w.category, RareClassWarning)]
        source = "made for this run with the derived split seed"
    if not holds_same_rows(table, loaded):
        named = manifest_out if reused else given  # a resume's: the run directory's split.json
        raise InputError(
            f"the split manifest was made from other data (manifest dataset sha256 "
            f"{loaded.dataset_sha256[:12]}..., data {table.file_sha256[:12]}...)",
            source=f"split manifest {named}",
            fix=f"run `reprotune check-split {named} {cfg.data.path}` to see what changed, "
            "then make a new manifest or restore the data",
        )
    _check_text_fields(table, loaded, cfg)
    data = RunData(
        table=table,
        manifest=loaded,
        manifest_sha256=sha256_file(manifest_out) if reused and manifest_out is not None else None,
        manifest_source=source,
        prompt_field=cfg.data.prompt_field,
        response_field=cfg.data.response_field,
        eval_max_rows=cfg.eval.max_rows,
        split_warnings=tuple(split_warnings),
        given_manifest=None if reused or given is None else Path(given),
    )
    if manifest_out is not None and not reused:
        data = save_manifest(data, manifest_out)
    return data


def save_manifest(data: RunData, path: Path) -> RunData:
    """Put the run's manifest at ``path``; return ``data`` with the manifest's sha256.

    A manifest made for the run is written; a given one is copied byte for byte, so the recorded
    sha256 is the one the user holds.
    """
    if data.given_manifest is not None:
        digest = copy_manifest(data.given_manifest, path)
    else:
        digest = write_manifest(data.manifest, path)
    return dataclasses.replace(data, manifest_sha256=digest)


def check_rows_per_step(cfg: ExperimentConfig, data: RunData) -> None:
    """Refuse a step that needs more rows than the training split holds (or an empty split).

    Raises:
        InputError: naming the batch size, the split's size and the fix.
    """
    n_train = len(data.manifest.indices["train"])
    per_step = cfg.train.batch_size * cfg.train.grad_accum_steps
    if n_train == 0:
        raise InputError(
            f"the training split of {data.table.source} is empty ({data.table.n_rows} rows in all)",
            source="split.ratios" if data.given_manifest is None else str(data.given_manifest),
            fix="give more rows, or a larger train ratio",
        )
    if per_step > n_train:
        raise InputError(
            f"one optimizer step takes {per_step} rows (train.batch_size {cfg.train.batch_size} x "
            f"train.grad_accum_steps {cfg.train.grad_accum_steps}), but the training split holds "
            f"only {n_train}",
            source="train.batch_size",
            fix=f"set train.batch_size x train.grad_accum_steps to at most {n_train}",
        )


def _check_text_fields(table: Table, manifest: Manifest, cfg: ExperimentConfig) -> None:
    """Refuse, before any training, a row the run will read whose prompt or response is not text:
    train and validation rows, and the test rows ``eval.generate_at_end`` evaluates."""
    rows = {split: manifest.indices[split] for split in ("train", "validation")}
    if cfg.eval.generate_at_end:
        rows["test"] = manifest.indices["test"][: cfg.eval.generate_max_rows]
        if not rows["test"]:  # refused now, not once the whole run has trained
            raise InputError(
                f"eval.generate_at_end evaluates the test split, and the split of {table.source} "
                "gives it no rows",
                source="eval.generate_at_end",
                fix="give the test split rows (split.ratios), or set eval.generate_at_end: false",
            )
    for name in (cfg.data.prompt_field, cfg.data.response_field):
        column = table.column(name)
        for split, indices in rows.items():
            for row in indices:
                value = column[int(row)]
                if not isinstance(value, str):
                    raise InputError(
                        f"field {name!r} is {not_text(value)} (a {split} row)",
                        source=f"{table.source}, row {row}",
                        fix=f"give every row a text {name!r}, or point data.prompt_field / "
                        "data.response_field at the right columns",
                    )
