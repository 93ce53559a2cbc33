"""The run record (``record.json``): typed, schema-versioned, canonical JSON, written atomically.

The record is the source of truth about a run (docs/run-directory.md). The training loop keeps it
as a plain dict that grows while the run goes (sections are filled in as they become known), and
writes it with :func:`write_record`, which stamps the schema, validates it against the typed
:class:`RunRecord` and writes canonical JSON atomically. :func:`load_record` reads a record back
as a dict, :func:`load_run_record` as a :class:`RunRecord`; both validate and refuse a schema or
schema version they do not know. :func:`new_record`, :func:`finish_record` and
:func:`fail_record` build typed records for callers that prefer them.

Sections are typed for the keys the contract names and accept extra keys (a run may add
``attempts``, ``trackers``, ``data.order``...); a record written before a section is known holds
no such key, so every section is optional.

Importing this module never imports torch: compare and report read records.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reprotune._config import ExperimentConfig, config_sha256
from reprotune._errors import InputError, SchemaVersionError
from reprotune._jsonio import read_json_file, write_json_atomic
from reprotune._seeding import derive_seeds
from reprotune._version import __version__

SCHEMA: Final = "reprotune/record"
SCHEMA_VERSION: Final = 1

Status = Literal["running", "completed", "failed", "stopped", "interrupted"]


class _Part(BaseModel):
    # extra="allow": the contract lists the keys that must mean what docs/run-directory.md says;
    # a run may record more, and a reader must not lose them.
    model_config = ConfigDict(extra="allow", frozen=True)


class ErrorInfo(_Part):
    """Why a run failed."""

    type: str
    message: str


class CodeRecord(_Part):
    """The code a run used (see :class:`reprotune._fingerprint.CodeInfo`)."""

    in_git: bool = False
    commit: str | None = None
    branch: str | None = None
    dirty: bool = False
    diff_sha256: str | None = None
    patch_file: str | None = None
    untracked: list[str] = Field(default_factory=list)


class DataRecord(_Part):
    """The data a run trained on."""

    source: str | None = None
    file_sha256: str | None = None
    n_rows: int | None = None
    manifest_sha256: str | None = None
    manifest_file: str | None = None
    split_sizes: dict[str, int] = Field(default_factory=dict)


class ModelRecord(_Part):
    """The base model a run started from."""

    source: str | None = None
    revision: str | None = None
    resolved_path: str | None = None
    weights_sha256: str | None = None
    tokenizer_sha256: str | None = None
    dtype: str | None = None
    pad_token_id: int | None = None
    max_length: int | None = None


class Timings(_Part):
    """When a run ran and how fast."""

    started_at: str
    ended_at: str | None = None
    duration_s: float | None = None
    steps_done: int = 0
    step_time_s_mean: float | None = None
    step_time_s_median: float | None = None


class Outputs(_Part):
    """Hashes of what a run produced."""

    adapter_sha256: str | None = None
    adapter_files: dict[str, str] = Field(default_factory=dict)
    ledger_sha256: str | None = None


class RunRecord(_Part):
    """A whole ``record.json``. Field names and meanings: docs/run-directory.md."""

    schema_: Literal["reprotune/record"] = Field(SCHEMA, alias="schema")
    schema_version: Literal[1] = SCHEMA_VERSION
    reprotune_version: str
    run_id: str
    status: Status
    error: ErrorInfo | None = None
    config: dict[str, Any]
    config_sha256: str
    seeds: dict[str, int]
    code: CodeRecord | None = None
    data: DataRecord | None = None
    model: ModelRecord | None = None
    lora: dict[str, Any] | None = None
    environment: dict[str, Any] | None = None
    timings: Timings
    outputs: Outputs | None = None

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-safe data, with the on-disk key names."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=False)

    def experiment_config(self) -> ExperimentConfig:
        """The recorded config as an :class:`ExperimentConfig` (as it was resolved for the run)."""
        from reprotune._config import config_from_dict

        return config_from_dict(self.config, source=f"record {self.run_id} config")


def utc_now() -> str:
    """The current UTC time, ISO 8601 with microseconds and a ``Z``."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def make_run_id(cfg: ExperimentConfig, now: datetime | None = None) -> str:
    """``YYYYmmdd-HHMMSS-<first 8 hex of the config's sha256>``, in UTC."""
    moment = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return f"{moment:%Y%m%d-%H%M%S}-{config_sha256(cfg)[:8]}"


def new_record(
    *,
    run_id: str,
    config: ExperimentConfig,
    code: CodeRecord | Mapping[str, Any],
    data: DataRecord | Mapping[str, Any],
    model: ModelRecord | Mapping[str, Any],
    lora: Mapping[str, Any],
    environment: Mapping[str, Any],
    started_at: str | None = None,
) -> RunRecord:
    """The record of a run that is starting (status ``running``).

    The resolved config, its sha256 and every derived seed are computed here from ``config``, so a
    record can never hold seeds that disagree with its config.

    Args:
        run_id: the run's id (see :func:`make_run_id`).
        config: the validated config.
        code: ``CodeInfo.to_record(patch_file)`` or a :class:`CodeRecord`.
        data: data identity (source, file and manifest sha256, split sizes).
        model: base model identity (source, revision, weight and tokenizer sha256, ...).
        lora: the LoRA config as PEFT received it.
        environment: :func:`reprotune._fingerprint.environment_fingerprint` output.
        started_at: UTC ISO 8601; default now.

    Returns:
        The new record.

    Raises:
        InputError: a part does not have the fields the schema requires.
    """
    fields = {
        "reprotune_version": __version__,
        "run_id": run_id,
        "status": "running",
        "config": config.resolved(),
        "config_sha256": config_sha256(config),
        "seeds": derive_seeds(config.seed.root, config.seed.overrides),
        "code": code,
        "data": data,
        "model": model,
        "lora": dict(lora),
        "environment": dict(environment),
        "timings": {"started_at": started_at or utc_now()},
    }
    return _validate(_jsonable(fields), source=f"new record {run_id}")


def finish_record(
    record: RunRecord,
    *,
    outputs: Outputs | Mapping[str, Any],
    steps_done: int,
    step_time_s_mean: float | None = None,
    ended_at: str | None = None,
) -> RunRecord:
    """A copy of ``record`` marked ``completed``, with outputs and timings filled in."""
    return _ended(record, "completed", None, outputs, steps_done, step_time_s_mean, ended_at)


def fail_record(
    record: RunRecord,
    error: BaseException,
    *,
    steps_done: int,
    step_time_s_mean: float | None = None,
    ended_at: str | None = None,
) -> RunRecord:
    """A copy of ``record`` marked ``failed``, with the error's type and message."""
    info = ErrorInfo(type=type(error).__name__, message=str(error))
    return _ended(record, "failed", info, record.outputs or Outputs(), steps_done, step_time_s_mean, ended_at)


def _ended(
    record: RunRecord,
    status: Status,
    error: ErrorInfo | None,
    outputs: Outputs | Mapping[str, Any],
    steps_done: int,
    step_time_s_mean: float | None,
    ended_at: str | None,
) -> RunRecord:
    end = ended_at or utc_now()
    duration = (_parse_time(end) - _parse_time(record.timings.started_at)).total_seconds()
    timings = record.timings.model_copy(
        update={
            "ended_at": end,
            "duration_s": duration,
            "steps_done": steps_done,
            "step_time_s_mean": step_time_s_mean,
        }
    )
    out = outputs if isinstance(outputs, Outputs) else Outputs.model_validate(dict(outputs))
    return record.model_copy(update={"status": status, "error": error, "timings": timings, "outputs": out})


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def write_record(path: str | os.PathLike[str], record: RunRecord | Mapping[str, Any]) -> str:
    """Validate ``record`` and write it as canonical JSON, atomically.

    A mapping is written as given, with ``schema``, ``schema_version`` and ``reprotune_version``
    added when absent; a :class:`RunRecord` is written as :meth:`RunRecord.to_dict`.

    Args:
        path: where to write (normally ``runs/<run-id>/record.json``).
        record: the record.

    Returns:
        The sha256 of the bytes written.

    Raises:
        ValueError: the record does not satisfy the schema (a bug in the caller, not bad input).
    """
    if isinstance(record, RunRecord):
        data = record.to_dict()
    else:
        data = {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "reprotune_version": __version__,
            **dict(record),
        }
        try:
            RunRecord.model_validate(data)
        except ValidationError as exc:
            raise ValueError(
                f"refusing to write an invalid record to {os.fspath(path)}: {_problems(exc)}"
            ) from None
    return write_json_atomic(path, data)


def parse_record(data: Any, source: str = "<dict>") -> RunRecord:
    """Validate record data (as read from JSON) into a :class:`RunRecord`.

    Raises:
        SchemaVersionError: ``schema`` is not ``reprotune/record`` or ``schema_version`` is unknown.
        InputError: the data is not a valid record (every problem listed).
    """
    if not isinstance(data, dict):
        raise InputError(
            f"a record must be a JSON object (got {type(data).__name__})",
            source=source,
            fix="pass the record.json of a reprotune run",
        )
    schema, version = data.get("schema"), data.get("schema_version")
    if schema != SCHEMA:
        raise SchemaVersionError(
            f"not a reprotune run record: schema is {schema!r}, expected {SCHEMA!r}",
            source=source,
            fix="pass the record.json of a reprotune run directory",
        )
    if version != SCHEMA_VERSION:
        raise SchemaVersionError(
            f"record schema_version {version!r} is not supported; reprotune {__version__} reads "
            f"schema_version {SCHEMA_VERSION}",
            source=source,
            fix="use the reprotune version that wrote this record (see its reprotune_version), or upgrade",
        )
    return _validate(data, source=source)


def load_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a ``record.json`` (or a run directory holding one); return it as a dict.

    The dict is exactly what is on disk (extra keys included), checked against :class:`RunRecord`.

    Raises:
        InputError: the file is missing, not JSON (with line and column), or not a valid record.
        SchemaVersionError: the record's schema or schema version is not one this version reads.
    """
    data, source = _read_json(path)
    parse_record(data, source=source)
    result: dict[str, Any] = data
    return result


def load_run_record(path: str | os.PathLike[str]) -> RunRecord:
    """Like :func:`load_record`, returning the typed :class:`RunRecord`."""
    data, source = _read_json(path)
    return parse_record(data, source=source)


def _read_json(path: str | os.PathLike[str]) -> tuple[Any, str]:
    file = Path(path)
    if file.is_dir():
        file = file / "record.json"
    fix = "pass a run directory (runs/<run-id>) or its record.json; a damaged record: restore it or rerun"
    return read_json_file(file, what="record", fix=fix), str(file)


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<top level>'}: {err['msg']} "
        f"(got {err.get('input')!r:.60})"
        for err in exc.errors()
    )


def _validate(data: Mapping[str, Any], source: str) -> RunRecord:
    try:
        return RunRecord.model_validate(dict(data))
    except ValidationError as exc:
        raise InputError(
            f"invalid run record ({len(exc.errors())} problem(s)): {_problems(exc)}",
            source=source,
            fix="the record was edited or written by another tool; rerun to regenerate it",
        ) from None


def _jsonable(value: Any) -> Any:
    """Parts given as models become plain data, so one validation pass covers everything."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    return value
