"""Open a run directory for reading: its record, its ledger (every line checked), manifest, adapter.

The read side of the format in docs/run-directory.md, used by ``compare``, ``report``, ``verify``
and ``rerun``. It never imports torch. Nothing malformed is tolerated silently: a bad or partial
ledger line, an unknown record schema or a missing file is an ``InputError`` that names the file,
the line and what to do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from reprotune._data.manifest import Manifest, load_manifest
from reprotune._errors import InputError
from reprotune._jsonio import sha256_file
from reprotune._run import layout
from reprotune._run.ledger import Ledger, read_ledger
from reprotune._run.record import Status, load_record, status_of


@dataclass(frozen=True)
class RunDir:
    """An opened run directory.

    Attributes:
        path: the directory.
        record: ``record.json`` as a JSON object (validated by ``reprotune._run.record``).
        ledger: the checked ledger.
        manifest: the split manifest, or None when the directory has no ``split.json``.
        manifest_sha256: sha256 of ``split.json``'s bytes, or None without one.
        adapter_path: ``adapter/adapter_model.safetensors``, or None when it is missing
            (a run that failed before saving it).
    """

    path: Path
    record: Mapping[str, Any]
    ledger: Ledger
    manifest: Manifest | None
    manifest_sha256: str | None
    adapter_path: Path | None

    @property
    def layout(self) -> layout.RunLayout:
        return layout.RunLayout(self.path)

    @property
    def run_id(self) -> str:
        """The record's ``run_id``, or the directory name when the record has none."""
        value = self.record.get("run_id")
        return value if isinstance(value, str) and value else self.path.name

    @property
    def status(self) -> Status | Literal["unknown"]:
        """The record's ``status`` (``running``, ``completed``, ``failed``...), or ``unknown``."""
        return status_of(self.record) or "unknown"

    def section(self, key: str) -> Mapping[str, Any]:
        """A top-level record section (``config``, ``seeds``, ...); empty when absent."""
        value = self.record.get(key)
        return value if isinstance(value, Mapping) else {}

    def adapter_sha256(self) -> str | None:
        """sha256 of the adapter weights file, or None when there is none."""
        return sha256_file(self.adapter_path) if self.adapter_path else None


def open_run_dir(path: str | Path) -> RunDir:
    """Open and check the run directory at ``path``.

    Args:
        path: a directory written by ``reprotune run`` (``runs/<run-id>/``).

    Returns:
        The record, ledger, manifest and adapter path, every one checked.

    Raises:
        InputError: ``path`` is not a run directory, or a file in it is missing or malformed
            (the message names the file, the line and the fix).
        SchemaVersionError: ``record.json`` is not a ``reprotune/record`` of a known schema version.
    """
    paths = layout.RunLayout(Path(path))
    check_is_run_dir(paths.root)
    record = load_record(paths.record)
    for path in (paths.ledger, paths.manifest, paths.adapter_weights):
        _refuse_if_not_a_file(path)
    if not paths.ledger.is_file():
        raise InputError(
            f"the run directory has no {layout.LEDGER}",
            source=str(paths.root),
            fix="a run writes its ledger from the first step; copy the whole run directory, "
            "or rerun it with `reprotune rerun`",
        )
    ledger = read_ledger(paths.ledger)
    if ledger.init is None and status_of(record) == "completed":
        raise InputError(
            f"{paths.ledger} is empty, yet the run completed: its ledger was emptied or replaced",
            source=str(paths.ledger),
            fix="restore the run directory from a copy, or reproduce the run with `reprotune rerun RUN_DIR`",
        )
    has_manifest = paths.manifest.is_file()
    return RunDir(
        path=paths.root,
        record=record,
        ledger=ledger,
        manifest=load_manifest(paths.manifest) if has_manifest else None,
        manifest_sha256=sha256_file(paths.manifest) if has_manifest else None,
        adapter_path=paths.adapter_weights if paths.adapter_weights.is_file() else None,
    )


def _refuse_if_not_a_file(path: Path) -> None:
    """A run's file that exists as something else (a directory) is damage, not a missing file."""
    if (path.exists() or path.is_symlink()) and not path.is_file():
        what = "a directory" if path.is_dir() else "not a regular file"
        raise InputError(
            f"{path} is {what}, where the run writes a file: the run directory is damaged",
            source=str(path),
            fix="restore the run directory from a copy, or reproduce the run with `reprotune rerun RUN_DIR`",
        )


def check_is_run_dir(root: Path, *, option: str | None = None) -> None:
    """Raise an InputError saying what ``root`` is instead, when it is not a run directory.

    Args:
        root: the path given.
        option: the option it was given to (``--reference``), for the message.
    """
    fix = "pass the directory `reprotune run` wrote, e.g. runs/<run-id>/, which holds record.json"
    if not root.exists():
        raise InputError(f"no such directory: {root}", source=option, fix=fix)
    if not root.is_dir():
        if root.name.endswith((".tar.gz", ".tgz")):  # a bundle (`reprotune pack`) is no run directory
            fix = f"rerun it here with `reprotune rerun {root} --out DIR` (its run unpacks to DIR/recorded)"
        elif root.suffix in (".yaml", ".yml"):  # a config: it starts a run, and is none
            fix = f"a config starts a run (`reprotune run {root}`); give the directory that run wrote"
        raise InputError(f"{root} is a file, not a run directory", source=option, fix=fix)
    if (root / layout.RECORD).is_file():
        return
    # A common slip is passing runs/ itself: name the run directories found inside; another,
    # passing a part of a run (its evals/ID or a checkpoint): name the run.
    inside = sorted(p.name for p in root.iterdir() if (p / layout.RECORD).is_file())
    parents = [*root.parents, *root.resolve().parents]  # as given first: the fix shows what was typed
    owner = next((p for p in parents if str(p) != "." and (p / layout.RECORD).is_file()), None)
    if owner is not None:
        part = (root if root.is_relative_to(owner) else root.resolve()).relative_to(owner)
        if not root.is_absolute() and owner.is_absolute():  # `.` inside a run: say `../..`, as typed
            owner = Path(os.path.relpath(owner))
        fix = f"pass the run directory {owner}: {part} is a part of that run"
    elif (root / layout.STUDY).is_file():  # a seed study: its runs are in runs/, studies compare apart
        fix = (
            "a seed study is compared with another by `reprotune significance STUDY_A STUDY_B`; its "
            f"runs are in {root / layout.STUDY_RUNS}"
        )
    elif inside:
        shown = ", ".join(str(root / name) for name in inside[:3])
        fix = f"pass one of the run directories inside it, e.g. {shown}"
    raise InputError(f"{root} is not a run directory: it has no {layout.RECORD}", source=option, fix=fix)
