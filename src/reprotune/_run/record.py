"""The run record (``record.json``): typed, schema-versioned, canonical JSON, written atomically.

The record is the source of truth about a run (docs/run-directory.md). There is one way to make
one: :func:`start_record` begins its data, which a run holds in a ``_run.live_record.LiveRecord``
(changed only through its named operations while the run goes, each one checked by
:func:`typed_record` against the typed, frozen :class:`RunRecord`), and :func:`write_record`
stamps the schema, validates it again and writes canonical JSON atomically, on every write.
:func:`read_record` reads a record back as a typed :class:`RunRecord` (a reader that asks for named
fields), :func:`load_record` as the dict on disk (a reader that copies or rewrites it), both
validated; a schema or schema version they do not know is refused.

Sections (``_run.record_sections``) are typed for the keys the contract names and accept extra
keys (a Trainer's run adds its ``trainer`` and ``findings``...); a record
written before a section is known holds no such key, so every section is optional.

Importing this module never imports torch: compare and report read records.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, cast, get_args

from pydantic import ConfigDict, Field, ValidationError

from reprotune._config.loading import config_from_dict
from reprotune._config.schema import ExperimentConfig, config_sha256
from reprotune._config.secrets import mask_config, mask_data
from reprotune._documents import read_json_file, validated, validation_problems
from reprotune._formats import RECORD
from reprotune._jsonio import write_json_atomic
from reprotune._run import layout
from reprotune._run.record_sections import (
    Attempt,
    CodeRecord,
    DataRecord,
    DeterminismRecord,
    DistributedRecord,
    EnvironmentRecord,
    ErrorInfo,
    LoraRecord,
    ModelRecord,
    Outputs,
    RecordPart,
    Timings,
    TrackerSummary,
)
from reprotune._version import __version__

Status = Literal["running", "completed", "failed", "stopped", "interrupted"]


def status_of(record: Mapping[str, Any]) -> Status | None:
    """A record's status as the type says it can be (None: missing, or no status reprotune
    writes, as in a damaged record), so that every check of it is one the type checker sees."""
    status = record.get("status")
    return cast(Status, status) if status in get_args(Status) else None


def ended_status(exc: BaseException) -> Status:
    """The status of a run that ``exc`` ended: ``interrupted`` for Ctrl-C (and the signals reprotune
    turns into it), ``failed`` for anything else."""
    return "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"


class RunRecord(RecordPart):
    """A whole ``record.json``. Field names and meanings: docs/run-directory.md."""

    schema_: Literal["reprotune/record"] = Field(alias="schema")
    schema_version: Literal[1]
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
    determinism: DeterminismRecord | None = None
    lora: LoraRecord | None = None
    lora_defaults: dict[str, Any] | None = None
    environment: EnvironmentRecord | None = None
    timings: Timings
    outputs: Outputs | None = None
    attempts: list[Attempt] = Field(default_factory=list)
    distributed: DistributedRecord | None = None
    trackers: dict[str, TrackerSummary] | None = None

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    def tracker(self, name: str) -> TrackerSummary | None:
        """What tracker ``name`` (``mlflow``, ``wandb``) reported at the end; None: it had none."""
        return (self.trackers or {}).get(name)

    @property
    def total_steps(self) -> int | None:
        """The run's optimizer steps, from its data order (None: a Trainer-made run has none)."""
        order = self.data.order if self.data is not None else None
        return order.total_steps if order is not None else None

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-safe data, with the on-disk key names: the keys it was made with, no
        default added for a key it lacks (a record read and written again is the same record)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


def utc_now() -> str:
    """The current UTC time, ISO 8601 with microseconds and a ``Z``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def start_record(run_id: str, cfg: ExperimentConfig, seeds: Mapping[str, int]) -> dict[str, Any]:
    """The record of a run of ``cfg`` that is starting: :func:`new_record` of its resolved config."""
    return new_record(run_id, cfg.resolved(), config_sha256(cfg), seeds)


def new_record(
    run_id: str, config: Mapping[str, Any], config_sha: str, seeds: Mapping[str, int]
) -> dict[str, Any]:
    """The record of a run that is starting (``running``): config, its hash, seeds, start time, no
    attempt yet (``reprotune run``'s config, or a Trainer's settings).

    A run holds it in a ``_run.live_record.LiveRecord``, whose operations fill it in as the run
    goes; :func:`write_record` validates it against :class:`RunRecord` on every write.
    """
    return {
        "run_id": run_id,
        "reprotune_version": __version__,
        "status": "running",
        "config": dict(config),
        "config_sha256": config_sha,
        "seeds": dict(seeds),
        "timings": {"started_at": utc_now()},
        "attempts": [],
    }


def make_run_id(config_sha: str, now: datetime | None = None) -> str:
    """``YYYYmmdd-HHMMSS-<first 8 hex of the config's sha256>``, in UTC."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    return f"{moment:%Y%m%d-%H%M%S}-{config_sha[:8]}"


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
        data = stamped_record(record)
        try:
            typed_record(data)
        except ValueError as exc:
            raise ValueError(f"refusing to write an invalid record to {os.fspath(path)}: {exc}") from None
    return write_json_atomic(path, masked_record(data))


def stamped_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with ``schema``, ``schema_version`` and ``reprotune_version`` added when absent."""
    return RECORD.stamp({"reprotune_version": __version__, **record})


def typed_record(record: Mapping[str, Any]) -> RunRecord:
    """``record`` (as a run holds it: the schema keys added when absent) validated into a frozen
    :class:`RunRecord`.

    Raises:
        ValueError: the record does not satisfy the schema (every problem listed): a bug in the
            caller, not bad input.
    """
    try:
        return RunRecord.model_validate(stamped_record(record))
    except ValidationError as exc:
        raise ValueError("; ".join(validation_problems(exc))) from None


def masked_record(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` as it may be written: every text outside ``config`` with URL credentials, secret
    query parameters and token-shaped strings masked (a branch named after a key, a Trainer's
    ``hub_token``); ``config`` with URL credentials and query secrets masked only, since a value
    the config marked ``!not-secret`` is an input of the run."""
    return {key: mask_config(value) if key == "config" else mask_data(value) for key, value in data.items()}


def parse_record(data: Any, source: str = "<dict>") -> RunRecord:
    """Validate record data (as read from JSON) into a :class:`RunRecord`.

    Raises:
        SchemaVersionError: ``schema`` is not ``reprotune/record`` or ``schema_version`` is unknown.
        InputError: the data is not a valid record (every problem listed).
    """
    RECORD.check(
        data,
        source=source,
        fix="pass the record.json of a reprotune run directory",
        version_fix="use the reprotune version that wrote it (see its reprotune_version), or upgrade",
    )
    return validated(
        RunRecord,
        data,
        what="run record",
        source=source,
        fix="the record was edited or written by another tool; rerun to regenerate it",
    )


def read_record(path: str | os.PathLike[str]) -> RunRecord:
    """Read and validate a ``record.json`` (or a run directory holding one) as a typed, frozen
    :class:`RunRecord` (extra keys kept in its ``model_extra``).

    Raises:
        InputError: the file is missing, not JSON (with line and column), or not a valid record.
        SchemaVersionError: the record's schema or schema version is not one this version reads.
    """
    data, source = _read_json(path)
    return parse_record(data, source=source)


def write_stopped_copy(
    source: str | os.PathLike[str], target: str | os.PathLike[str], *, data_path: str | None = None
) -> RunRecord:
    """Write at ``target`` the record at ``source`` (a record or run directory) as that of a run
    stopped at a checkpoint copied beside it, to be resumed there (status ``stopped``; its data
    path ``data_path`` when given: a bundle's data here). The source is validated when read; the
    copy changes only those two typed fields (numbers typed float are written as floats).

    Raises:
        InputError: the source record is missing or not valid.
    """
    record = read_record(source)
    config = dict(record.config)
    if data_path is not None:
        config["data"] = {**(config.get("data") or {}), "path": data_path}
    stopped = record.model_copy(update={"status": "stopped", "config": config})
    write_record(target, stopped)
    return stopped


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


def _read_json(path: str | os.PathLike[str]) -> tuple[Any, str]:
    file = Path(path)
    if file.is_dir():
        file = file / layout.RECORD
    fix = "pass a run directory (runs/<run-id>) or its record.json; a damaged record: restore it or rerun"
    return read_json_file(file, what="record", fix=fix), str(file)


def record_config(
    record: RunRecord | Mapping[str, Any], *, run_dir: Path, source: str, overrides: Sequence[str] = ()
) -> ExperimentConfig:
    """The config a record holds, with a ``config_dir`` its relative paths resolve against here.

    The recorded ``config_dir`` when it still exists; otherwise (a project moved, or a run
    directory copied to another machine) the nearest parent of ``run_dir`` under which the
    config's relative data path exists, so ``rerun`` of a moved project finds its data.

    Raises:
        ConfigError: the recorded config is not valid (a record edited by hand).
    """
    data = dict(record.config if isinstance(record, RunRecord) else record.get("config") or {})
    recorded = data.get("config_dir")
    if not (isinstance(recorded, str) and Path(recorded).is_dir()):
        data["config_dir"] = str(_find_config_dir(data, run_dir))
    return config_from_dict(data, source=source, overrides=overrides)


def _find_config_dir(config: Mapping[str, Any], run_dir: Path) -> Path:
    path = str((config.get("data") or {}).get("path", ""))
    candidates = list(run_dir.resolve().parents)
    if path and not path.startswith("builtin:") and not Path(path).is_absolute():
        for parent in candidates:
            if (parent / path).exists():
                return parent
    return candidates[1] if len(candidates) > 1 else run_dir.resolve().parent  # runs/<id>/ -> project


def attempt_timings(
    started: float,
    step_times: Sequence[float],
    steps_done: int,
    recording_s: float,
    save_times: list[float] | None,
) -> dict[str, Any]:
    """The record's ``timings`` of one attempt, from its step and checkpoint times (``save_times``
    None: checkpoints not made by reprotune, as in a Trainer's run, and not timed)."""
    total = sum(step_times)
    timings = {
        "ended_at": utc_now(),
        "duration_s": round(time.perf_counter() - started, 3),
        "steps_done": steps_done,
        "step_time_s_mean": round(statistics.fmean(step_times), 6) if step_times else None,
        # The median ignores the first step's warm-up and one-off stalls: the loop's typical pace.
        "step_time_s_median": round(float(statistics.median(step_times)), 6) if step_times else None,
        # The ledger lines, weights hashes and tracker hand-offs of this attempt's steps, timed
        # where they run: what recording cost this run, as a share of its step time.
        "recording_time_s": round(recording_s, 6),
        "recording_share": round(recording_s / total, 6) if total else None,
    }
    if save_times is not None:  # checkpoint saves of this attempt (ledger sync included), in the step times
        timings["checkpoint_time_s"] = round(sum(save_times), 6)
    return timings
