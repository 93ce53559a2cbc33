"""The doctor's checks of the data: a split manifest that matches it, and every column the config
names present in it (read without torch); the exact ``reprotune split`` command for the config."""

from __future__ import annotations

import shlex
from pathlib import Path

from reprotune._builtins import BUILTIN_PREFIX
from reprotune._config.schema import ExperimentConfig
from reprotune._data.columns import missing_columns
from reprotune._data.loaders import CONFIG_FORMAT, load_table
from reprotune._data.manifest import Manifest, load_manifest
from reprotune._data.split import holds_same_rows
from reprotune._determinism.seeds import derive_seeds
from reprotune._doctor.findings import Context
from reprotune._errors import InputError
from reprotune._jsonio import sha256_file
from reprotune._run.findings import Finding


def check_data(ctx: Context) -> list[Finding]:
    """The data file is frozen by a split manifest that matches it."""
    cfg = ctx.cfg
    builtin = cfg.data.path.startswith(BUILTIN_PREFIX)
    if cfg.split.manifest is None:
        if builtin:
            return [
                Finding(
                    "data-no-manifest",
                    "info",
                    f"{cfg.data.path} is split at run time (no split.manifest)",
                    "the split is recomputed from the split seed; builtin data is pinned with the package",
                    f"freeze it with `{split_command(cfg)}` and set split.manifest to compare splits "
                    "across runs",
                )
            ]
        return [
            Finding(
                "data-no-manifest",
                "warning",
                f"data file {cfg.data.path} is not covered by a split manifest",
                "the split is recomputed each run: if the file changes, rows move between train and test "
                "without notice",
                f"freeze the split this config makes, exactly (its strategy, ratios, policy and derived "
                f"split seed): `{split_command(cfg)}`, then set split.manifest: split.json",
            )
        ]

    manifest = Path(cfg.split.manifest)
    try:
        loaded = load_manifest(manifest)
    except InputError as exc:  # missing, not JSON, unknown schema version, damaged
        return [
            Finding(
                "data-manifest-unreadable",
                "error",
                f"split manifest {manifest} cannot be read: {exc.message}",
                "the run cannot check that the data is the data the split was made from",
                "point split.manifest at a manifest written by `reprotune split`",
            )
        ]
    if builtin:  # the rows reprotune ships, which the run checks against the manifest as these
        if _reformatted(cfg, loaded):
            return []
        return [
            Finding(
                "data-manifest-mismatch",
                "error",
                f"{cfg.data.path} is not the data manifest {manifest} was made from "
                f"(sha256 {loaded.dataset_sha256[:12]}..., {loaded.n_rows} rows)",
                "the split indices would point at different rows; the run refuses it",
                f"point split.manifest at a manifest of {cfg.data.path} (`{split_command(cfg)}` makes the "
                "split a run of this config makes), or data.path at the data it was made from",
            )
        ]
    try:
        actual = sha256_file(cfg.data.path)
    except OSError as exc:
        return [
            Finding(
                "data-unreadable",
                "error",
                f"data file {cfg.data.path} cannot be read: {exc}",
                "the run would fail",
                "fix data.path",
            )
        ]
    expected = loaded.dataset_sha256
    if expected != actual and not _reformatted(cfg, loaded):
        return [
            Finding(
                "data-manifest-mismatch",
                "error",
                f"data file {cfg.data.path} (sha256 {actual[:12]}...) is not the file manifest {manifest} "
                f"was made from (sha256 {expected[:12]}..., {loaded.n_rows} rows)",
                "the split indices would point at different rows",
                f"run `reprotune check-split {manifest} {cfg.data.path}` to see what changed",
            )
        ]
    return []


def _reformatted(cfg: ExperimentConfig, manifest: Manifest) -> bool:
    """The same rows as the manifest's in another file (key order, line endings, format): the run
    takes it, as the split holds."""
    try:
        return holds_same_rows(load_table(cfg.data.path, cfg.data.format, format_fix=CONFIG_FORMAT), manifest)
    except InputError:
        return False


def split_command(cfg: ExperimentConfig, out: str | None = None) -> str:
    """The ``reprotune split`` command that makes exactly the split a run of ``cfg`` makes: the
    same strategy, column, ratios, rare-class policy and the derived ``split`` seed; written to
    ``out``, by default ``split.json`` beside the config (where ``split.manifest: split.json`` in it
    finds it, from whatever directory the command runs)."""
    if out is None:
        out = str(Path(cfg.config_dir) / "split.json") if cfg.config_dir else "split.json"
    seed = derive_seeds(cfg.seed.root, dict(cfg.seed.overrides))["split"]
    parts = ["reprotune split", shlex.quote(cfg.data.path)]
    if cfg.split.stratify_by is not None:
        parts.append(f"--stratify-by {shlex.quote(cfg.split.stratify_by)}")
    if cfg.split.group_by is not None:
        parts.append(f"--group-by {shlex.quote(cfg.split.group_by)}")
    if cfg.data.format != "auto":
        parts.append(f"--format {cfg.data.format}")
    ratios = ",".join(repr(float(r)) for r in cfg.split.ratios)
    parts += [f"--ratios {ratios}", f"--rare-class-policy {cfg.split.rare_class_policy}", f"--seed {seed}"]
    return " ".join([*parts, f"--out {shlex.quote(out)}"])


def check_columns(ctx: Context) -> list[Finding]:
    """Every column the config names (prompt, response, stratify, group) exists in the data."""
    try:
        table = load_table(ctx.cfg.data.path, ctx.cfg.data.format, format_fix=CONFIG_FORMAT)
    except InputError as exc:
        return [
            Finding(
                "data-unreadable",
                "error",
                f"data {ctx.cfg.data.path} cannot be read: {exc.message}",
                "the run would fail before training",
                exc.fix or "fix data.path",
            )
        ]
    findings = []
    for key, name in missing_columns(ctx.cfg, table.columns):
        where = ctx.where(key)
        findings.append(
            Finding(
                "config-column-missing",
                "error",
                f"{key} names column {name!r}, which {table.source} does not have ({where})",
                "the run refuses it (exit 2) before it trains",
                f"set {key} to one of the data's columns: {table.columns}",
            )
        )
    return findings
