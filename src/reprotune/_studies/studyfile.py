"""``study.json``: the one writer and reader of a study's file (schema ``reprotune/study`` v1).

Canonical JSON, written atomically after every run that completes, so an interrupted study says
which runs are done; its final form holds nothing that depends on when or how often the study
ran (no times, no attempts), so an interrupted and resumed study ends with the same bytes as an
uninterrupted one. Fields: docs/seed-studies.md. Never imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reprotune._documents import read_json_file, validated
from reprotune._formats import STUDY
from reprotune._jsonio import write_json_atomic
from reprotune._studies import layout


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunEntry(_Part):
    """One run of the study: what the plan gave it and, once completed, what it produced."""

    name: str
    dir: str
    group: str
    varied: str
    index: int = Field(ge=0)
    seed: int = Field(ge=0)
    status: Literal["planned", "completed"]
    config_sha256: str
    seeds: dict[str, int] | None = None
    adapter_sha256: str | None = None
    ledger_sha256: str | None = None
    metrics: dict[str, float] | None = None
    metric_setups: dict[str, str] | None = None
    """Each eval metric's setup (rows, decoding, prompt); absent from studies made before."""


class StudyFile(_Part):
    """A whole ``study.json``."""

    schema_: Literal["reprotune/study"] = Field(alias="schema")
    schema_version: Literal[1]
    study_id: str
    status: Literal["running", "completed"]
    config: dict[str, Any]
    config_sha256: str
    vary: str
    n: int = Field(ge=2)
    groups: list[str]
    seed_rule: str
    notes: list[str]
    base_model: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    """The data file the runs trained on (``file_sha256``) and whether every run did
    (``runs_agree``); absent from studies made before it was kept."""
    bootstrap: dict[str, Any]
    runs: list[RunEntry]
    metrics: list[str] = Field(default_factory=list)
    summary: dict[str, dict[str, dict[str, Any]]] = Field(default_factory=dict)
    variance: dict[str, dict[str, dict[str, Any]]] | None = None
    metric_notes: list[str] = Field(default_factory=list)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def write_study(path: str | os.PathLike[str], study: dict[str, Any]) -> str:
    """Check ``study`` against :class:`StudyFile` and write it as canonical JSON, atomically.

    Returns:
        The sha256 of the bytes written.

    Raises:
        ValueError: the study does not satisfy the schema (a bug in the caller, not bad input).
    """
    data = STUDY.stamp(study)
    try:
        StudyFile.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"refusing to write an invalid study to {os.fspath(path)}: {exc}") from None
    return write_json_atomic(path, data)


def load_study(path: str | os.PathLike[str], *, option: str | None = None) -> dict[str, Any]:
    """Read and check a ``study.json`` (or the study directory holding one).

    Args:
        path: the study directory or its ``study.json``.
        option: the argument it came from, for messages (``STUDY_A``).

    Returns:
        The study as on disk (a dict), checked against :class:`StudyFile`.

    Raises:
        InputError: missing, not JSON (line and column), or not a valid study.
        SchemaVersionError: another schema, or a schema version this version does not read.
    """
    file = Path(path)
    fix = "pass a study directory written by `reprotune seeds` (it holds study.json)"
    if file.is_dir():
        inside = sorted(p.parent.name for p in file.glob(f"*/{layout.STUDY}"))
        if inside and not (file / layout.STUDY).exists():
            shown = ", ".join(inside[:5]) + (f" and {len(inside) - 5} more" if len(inside) > 5 else "")
            fix = f"pass one of the studies in {file}: {shown}"
        file = file / layout.STUDY
    data = read_json_file(file, what="study", fix=fix)
    where = f"{option} ({file})" if option else str(file)
    data = STUDY.check(
        data,
        source=where,
        fix=fix,
        version_fix="use the reprotune version that wrote the study, or upgrade",
    )
    validated(
        StudyFile,
        data,
        what="study file",
        source=where,
        fix="the file was edited or damaged; run the same `reprotune seeds` command again to rewrite it",
    )
    return data
