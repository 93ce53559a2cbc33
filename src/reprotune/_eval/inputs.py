"""What an eval starts from, every piece checked before any model is loaded.

The run's record (its resolved config, checked against its ``config_sha256``, seeds and hashes),
its adapter (present, and the bytes the record names), its own ``split.json`` (the file the record
hashed, verified against the data file now: the rows evaluated are the rows the run held out), and
the rows of the chosen split (all, or ``max_rows`` of them drawn with the eval seed:
:func:`sample_rows`). Bad input raises
``InputError`` naming the value, where it came from and the fix, before anything is written.
Never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprotune._config.schema import ExperimentConfig, config_sha256
from reprotune._data.checksplit import check_split
from reprotune._data.loaders import CONFIG_FORMAT, load_table
from reprotune._data.manifest import Manifest, load_manifest
from reprotune._data.sampling import SAMPLE_RULE, sample_rows
from reprotune._data.table import Table, not_text
from reprotune._determinism.seeds import derive_seeds
from reprotune._errors import InputError
from reprotune._jsonio import sha256_file
from reprotune._run.drift import refuse_trainer_run
from reprotune._run.layout import ADAPTER_WEIGHTS, RunLayout
from reprotune._run.record import load_record, record_config
from reprotune._run.rundir import check_is_run_dir

#: The splits an eval can take its rows from.
EVAL_SPLITS: tuple[str, ...] = ("test", "validation")
#: Config sections ``reprotune eval --set`` may change: the others describe the run, not the eval.
SETTABLE_SECTIONS: tuple[str, ...] = ("eval", "seed")


@dataclass(frozen=True)
class EvalRow:
    """One row to evaluate: its index in the data, its row hash (the manifest's), its texts."""

    index: int
    sha256: str
    prompt: str
    reference: str


@dataclass(frozen=True)
class EvalInputs:
    """A run ready to be evaluated.

    Attributes:
        run_dir: the run directory.
        record: its ``record.json``.
        cfg: its resolved config, with the eval's ``--set`` overrides applied.
        seeds: every derived seed of ``cfg`` (``eval`` seeds the sampling).
        split: ``test`` or ``validation``.
        split_size: rows in that split.
        rows: the rows evaluated (all the split's, or ``max_rows`` of them drawn with the eval
            seed by :func:`sample_rows`), in manifest order.
        sample: how the rows were drawn (``max_rows``, ``seed``, ``rule``), or None for the whole split.
        manifest_sha256: sha256 of the run's ``split.json``.
        data: what the data check found (``identical`` or ``formatting_only``), and the file's sha256.
        adapter_dir: the run's ``adapter/``, or None for ``--base-only``.
        adapter_files: name -> sha256 of the adapter's files (checked against the record).
    """

    run_dir: Path
    record: Mapping[str, Any]
    cfg: ExperimentConfig
    seeds: Mapping[str, int]
    split: str
    split_size: int
    rows: tuple[EvalRow, ...]
    sample: Mapping[str, Any] | None
    manifest_sha256: str
    data: Mapping[str, Any]
    adapter_dir: Path | None
    adapter_files: Mapping[str, str] | None

    @property
    def run_id(self) -> str:
        value = self.record.get("run_id")
        return value if isinstance(value, str) and value else self.run_dir.name


def prepare_inputs(
    run_dir: Path,
    *,
    split: str = "test",
    max_rows: int | None = None,
    overrides: Sequence[str] = (),
    base_only: bool = False,
) -> EvalInputs:
    """Open and check the run in ``run_dir`` for an eval.

    Args:
        run_dir: a directory written by ``reprotune run``.
        split: ``test`` or ``validation``.
        max_rows: evaluate N rows of the split drawn with the eval seed (:func:`sample_rows`);
            None: ``eval.generate_max_rows`` (null: every row).
        overrides: ``eval.KEY=VALUE`` / ``seed.KEY=VALUE`` changes to the recorded config.
        base_only: evaluate the base model alone (the run needs no adapter).

    Raises:
        InputError: not a completed run with an adapter (unless ``base_only``), an adapter that
            is not the recorded one (or a record that does not name its weights), a bad split or
            ``max_rows``, a recorded config that is not the one its ``config_sha256`` names, an
            override outside ``eval`` and ``seed``, an invalid setting (``ConfigError``), a
            ``split.json`` that is not the one the record hashed, data that no longer matches the
            run's manifest (naming the rows), an empty split, a row without text.
    """
    paths = RunLayout(Path(run_dir))
    check_is_run_dir(paths.root)
    record = load_record(paths.record)
    refuse_trainer_run(
        record,
        paths.root,
        why="reprotune eval needs a reprotune config (its model, data and prompt format)",
        fix="evaluate the adapter in your script, or train with `reprotune run` to evaluate it here",
    )
    if split not in EVAL_SPLITS:
        raise InputError(
            f"unknown split {split!r}", source="--split", fix=f"use one of: {', '.join(EVAL_SPLITS)}"
        )
    _check_max_rows(max_rows, "--max-rows")
    adapter_dir, adapter_files = (None, None) if base_only else _checked_adapter(paths, record)
    cfg = _eval_config(record, overrides, paths.record)
    seeds = derive_seeds(cfg.seed.root, dict(cfg.seed.overrides))
    manifest, manifest_sha256 = _manifest(paths, record)
    table = _run_data(cfg, record)
    data = _check_data(manifest, table, paths.manifest, cfg.data.path)
    indices = [int(i) for i in manifest.indices[split]]
    if not indices:
        other = "validation" if split == "test" else "test"
        raise InputError(
            f"the {split} split of the run in {paths.root} has no rows",
            source=f"{paths.manifest} ({split})",
            fix=f"evaluate another split (--split {other}), or train a run whose split gives {split} rows",
        )
    cap = max_rows if max_rows is not None else cfg.eval.generate_max_rows
    chosen = sample_rows(indices, cap, seeds["eval"])
    rows = tuple(_row(table, manifest, i, cfg) for i in chosen)
    sample = (
        None if len(chosen) == len(indices) else {"max_rows": cap, "seed": seeds["eval"], "rule": SAMPLE_RULE}
    )
    return EvalInputs(
        run_dir=paths.root,
        record=record,
        cfg=cfg,
        seeds=seeds,
        split=split,
        split_size=len(indices),
        rows=rows,
        sample=sample,
        manifest_sha256=manifest_sha256,
        data=data,
        adapter_dir=adapter_dir,
        adapter_files=adapter_files,
    )


def _check_max_rows(value: int | None, source: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(
            f"max rows must be a whole number >= 1 (got {value!r})",
            source=source,
            fix="give at least 1, or leave it out to evaluate every row of the split",
        )


def _checked_adapter(paths: RunLayout, record: Mapping[str, Any]) -> tuple[Path, dict[str, str]]:
    """The run's adapter directory and its files' sha256, checked against the record."""
    status = record.get("status")
    if status != "completed" or not paths.adapter_weights.is_file():
        why = f"status {status!r}" if status != "completed" else f"{paths.adapter_weights} is missing"
        first = (
            "restore adapter/ from a copy of the run directory"
            if status == "completed"
            else f"resume it first (`reprotune resume {paths.root}`)"
        )
        raise InputError(
            f"the run in {paths.root} has no adapter to evaluate ({why})",
            source=str(paths.record),
            fix=f"{first}, or evaluate the base model alone with --base-only",
        )
    outputs = record.get("outputs") or {}
    recorded = outputs.get("adapter_files") or {}
    _refuse_unnamed_weights(paths, recorded, outputs.get("adapter_sha256"))
    files = {name: paths.adapter_dir / name for name in sorted(recorded)}
    now = {name: sha256_file(path) if path.is_file() else "" for name, path in files.items()}
    changed = sorted(n for n in recorded if now.get(n) != recorded[n])
    if not recorded or changed:
        detail = ", ".join(
            f"{n} (recorded {recorded[n][:12]}..., now {f'{now[n][:12]}...' if now[n] else 'missing'})"
            for n in changed
        )
        raise InputError(
            f"the adapter in {paths.adapter_dir} is not the one the run recorded"
            + (f": {detail}" if detail else " (the record names no adapter files)"),
            source=str(paths.record),
            fix="restore adapter/ from a copy of the run directory, or rerun the run",
        )
    return paths.adapter_dir, now


def _refuse_unnamed_weights(paths: RunLayout, recorded: Mapping[str, Any], adapter_sha256: Any) -> None:
    """Refuse a record whose adapter file list lacks the weights, or gives them another sha256
    than ``outputs.adapter_sha256``: the weights would go unchecked (and the eval record name no
    adapter), or be checked against one of two answers."""
    if not recorded:
        return  # refused by the caller: the record names no adapter files
    listed = recorded.get(ADAPTER_WEIGHTS)
    if isinstance(listed, str) and listed == adapter_sha256:
        return
    found = f"gives it sha256 {listed[:12]}..." if isinstance(listed, str) else "does not list it"
    raise InputError(
        f"the run's record does not name its adapter weights {ADAPTER_WEIGHTS} consistently: "
        f"outputs.adapter_files {found}, outputs.adapter_sha256 is "
        + (f"{adapter_sha256[:12]}..." if isinstance(adapter_sha256, str) else repr(adapter_sha256)),
        source=f"{paths.record} (outputs)",
        fix="restore record.json from a copy of the run directory (an eval checks the adapter's "
        "weights against the record before it loads them), or evaluate the base model alone with "
        "--base-only",
    )


def _eval_config(record: Mapping[str, Any], overrides: Sequence[str], source: Path) -> ExperimentConfig:
    for item in overrides:
        section = item.partition("=")[0].strip().split(".")[0]
        if "=" in item and section not in SETTABLE_SECTIONS:
            raise InputError(
                f"--set {item!r} changes the run's {section!r} section, which an eval cannot change",
                source=f"--set {item}",
                fix="set only eval.* (decoding, temperature, top_k, top_p, max_new_tokens, ...) or "
                "seed.* keys; to change the run itself, train a new run",
            )
        key = item.partition("=")[0].strip()
        if key.startswith("seed.overrides.") and key != "seed.overrides.eval":
            raise InputError(
                f"--set {item!r} changes nothing in an eval: it takes the run's own split and adapter",
                source=f"--set {item}",
                fix="only seed.overrides.eval (or seed.root) moves an eval's sampling",
            )
    config = record.get("config")
    if not isinstance(config, Mapping):
        raise InputError("the record holds no config", source=str(source), fix="rerun the run")
    # The recorded config_dir, or where a moved project now is: relative data paths open there.
    run_config = record_config(record, run_dir=Path(source).parent, source=str(source))
    _refuse_edited_config(run_config, record.get("config_sha256"), source)
    # A problem is the run's config with this eval's --set, not the record: say so.
    shown = f"{source} (the run's config) with --set" if overrides else str(source)
    cfg = record_config(record, run_dir=Path(source).parent, source=shown, overrides=overrides)
    recorded = run_config.seed.overrides
    moved = sorted(
        k
        for k in {*recorded, *cfg.seed.overrides}
        if k != "eval" and recorded.get(k) != cfg.seed.overrides.get(k)
    )
    if moved:  # set as a whole mapping (--set 'seed.overrides={split: 5}'), which the key check misses
        raise InputError(
            f"--set changes seed.overrides of {', '.join(moved)}, which changes nothing in an eval: it "
            "takes the run's own split and adapter",
            source="--set seed.overrides",
            fix="only seed.overrides.eval (or seed.root) moves an eval's sampling",
        )
    return cfg.resolve_paths()


def _refuse_edited_config(run_config: ExperimentConfig, recorded: Any, source: Path) -> None:
    """Refuse a record whose config is not the one its ``config_sha256`` names (the hash
    ``reprotune run`` wrote, computed as then, before this eval's ``--set``): an edited config
    would be evaluated under the old hash's name."""
    now = config_sha256(run_config)
    if now == recorded:
        return
    was = f"{recorded[:12]}..." if isinstance(recorded, str) else repr(recorded)
    raise InputError(
        f"the config in {source} is not the config the run was made with: its sha256 is now "
        f"{now[:12]}..., the record's config_sha256 is {was}",
        source=f"{source} (config, config_sha256)",
        fix="restore the run's record.json (copy the run directory again from where it was made); a "
        "record is never edited: change eval settings with --set eval.KEY=VALUE, and train a new run "
        "to change the run",
    )


def _run_data(cfg: ExperimentConfig, record: Mapping[str, Any]) -> Table:
    """The run's data file; a file no longer there is to be restored, not replaced (an eval takes
    the run's own rows, checked against its manifest)."""
    if not cfg.data.path.startswith("builtin:") and not Path(cfg.data.path).exists():
        recorded = (record.get("data") or {}).get("file_sha256")
        raise InputError(
            f"the run's data file {cfg.data.path} is no longer there",
            source="record.json: config.data.path",
            fix=f"put the file the run trained on back at {cfg.data.path} (sha256 {recorded}); an eval "
            "takes the run's own rows, checked against its split.json",
        )
    return load_table(cfg.data.path, cfg.data.format, format_fix=CONFIG_FORMAT)


def _manifest(paths: RunLayout, record: Mapping[str, Any]) -> tuple[Manifest, str]:
    """The run's ``split.json`` and its sha256, refused when it is not the file the record hashed
    (``data.manifest_sha256``; a record without it is not checked): another split of the same data
    passes the data check, and would score training rows as held-out ones."""
    if not paths.manifest.is_file():
        raise InputError(
            f"the run directory has no {paths.manifest.name}",
            source=str(paths.root),
            fix="copy the whole run directory: an eval takes its rows from the run's own split",
        )
    found = sha256_file(paths.manifest)
    recorded = (record.get("data") or {}).get("manifest_sha256")
    if isinstance(recorded, str) and found != recorded:
        raise InputError(
            f"{paths.manifest} is not the split the run was made with: its sha256 is {found[:12]}..., "
            f"the record's data.manifest_sha256 is {recorded[:12]}...; its rows are not the ones the "
            "run held out",
            source=str(paths.record),
            fix="restore the run's own split.json (copy the run directory again from where it was made); "
            "a run's split is never edited: to evaluate on another split, train a new run with "
            "split.manifest set to it",
        )
    return load_manifest(paths.manifest), found


def _check_data(manifest: Manifest, table: Table, manifest_path: Path, data_path: str) -> dict[str, Any]:
    """Refuse data that is not the data of the run's manifest (formatting alone is fine)."""
    report = check_split(manifest, table, leak_columns=[])
    if not report.identical and not report.formatting_only:
        raise InputError(
            "the data is not the data the run was trained and split on:\n"
            + report.format(max_rows=20, all_rows="the command below lists all"),
            source=f"{data_path} vs {manifest_path}",
            fix="restore the original data file (its sha256 is in record.json under data.file_sha256); "
            f"`reprotune check-split {manifest_path} {data_path}` lists every changed row",
        )
    return {
        "source": table.source,
        "file_sha256": table.file_sha256,
        "check": "identical" if report.identical else "formatting_only",
    }


def _row(table: Table, manifest: Manifest, index: int, cfg: ExperimentConfig) -> EvalRow:
    values = table.row(index)
    texts = []
    for field in (cfg.data.prompt_field, cfg.data.response_field):
        value = values.get(field)
        if not isinstance(value, str):
            raise InputError(
                f"field {field!r} is {not_text(value)}",
                source=f"{table.source}, row {index}",
                fix=f"give every row a text {field!r}",
            )
        texts.append(value)
    return EvalRow(index=index, sha256=manifest.row_hashes.hex_at(index), prompt=texts[0], reference=texts[1])
