"""Tests for reprotune._record: round trip, canonical bytes, schema refusal, bad files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reprotune._config import ExperimentConfig, config_from_dict, config_sha256
from reprotune._errors import InputError, SchemaVersionError
from reprotune._jsonio import canonical_dumps, sha256_file
from reprotune._record import (
    SCHEMA,
    SCHEMA_VERSION,
    RunRecord,
    fail_record,
    finish_record,
    load_record,
    load_run_record,
    make_run_id,
    new_record,
    write_record,
)
from reprotune._seeding import derive_seeds


def _record(cfg: ExperimentConfig | None = None) -> RunRecord:
    cfg = cfg or config_from_dict({"seed": {"root": 7, "overrides": {"eval": 3}}})
    return new_record(
        run_id="20260101-000000-abcdef12",
        config=cfg,
        code={"in_git": True, "commit": "a" * 40, "branch": "main", "dirty": False},
        data={
            "source": "builtin:chatterbot-en",
            "file_sha256": "b" * 64,
            "n_rows": 2026,
            "split_sizes": {"train": 1620, "validation": 203, "test": 203},
        },
        model={"source": "builtin:smollm2-135m-instruct", "weights_sha256": "c" * 64, "pad_token_id": 2},
        lora={"r": 8, "lora_alpha": 16},
        environment={"python": {"version": "3.11"}},
        started_at="2026-01-01T00:00:00.000000Z",
    )


def test_new_record_derives_config_identity_and_seeds() -> None:
    """new_record fills the resolved config, its sha256 and every derived seed from the config."""
    cfg = config_from_dict({"seed": {"root": 7, "overrides": {"eval": 3}}})
    record = _record(cfg)
    assert record.schema_ == SCHEMA and record.schema_version == SCHEMA_VERSION and record.status == "running"
    assert record.config == cfg.resolved() and record.config_sha256 == config_sha256(cfg)
    assert record.seeds == derive_seeds(7, {"eval": 3}) and record.seeds["eval"] == 3


def test_round_trip_is_exact_and_canonical(tmp_path: Path) -> None:
    """write then load gives an equal record; the file is canonical JSON; the sha256 returned is its own."""
    record = _record()
    sha = write_record(tmp_path / "record.json", record)
    assert load_run_record(tmp_path / "record.json") == record
    assert load_run_record(tmp_path) == record  # a run directory works too
    text = (tmp_path / "record.json").read_text(encoding="utf-8")
    assert text == canonical_dumps(json.loads(text)) and sha == sha256_file(tmp_path / "record.json")
    assert list(json.loads(text)) == sorted(json.loads(text))


def test_dict_records_are_stamped_and_keep_extra_keys(tmp_path: Path) -> None:
    """A dict record (as the training loop keeps it) gets schema keys added and loses nothing."""
    cfg = ExperimentConfig()
    data: dict[str, Any] = {
        "run_id": "r",
        "status": "running",
        "config": cfg.resolved(),
        "config_sha256": config_sha256(cfg),
        "seeds": derive_seeds(42),
        "timings": {"started_at": "2026-01-01T00:00:00Z"},
        "attempts": [{"resumed": False}],
        "data": {"source": "x", "order": {"version": 1}},
    }
    write_record(tmp_path / "record.json", data)
    loaded = load_record(tmp_path / "record.json")
    assert loaded["schema"] == SCHEMA and loaded["schema_version"] == SCHEMA_VERSION
    assert loaded["attempts"] == [{"resumed": False}] and loaded["data"]["order"] == {"version": 1}


def test_invalid_record_is_not_written(tmp_path: Path) -> None:
    """write_record refuses a record that breaks the schema, and leaves no file."""
    bad = {**_record().to_dict(), "status": "exploded"}
    with pytest.raises(ValueError, match="status"):
        write_record(tmp_path / "record.json", bad)
    assert not (tmp_path / "record.json").exists()


def test_unknown_schema_version_is_refused(tmp_path: Path) -> None:
    """A record with schema_version 2 raises SchemaVersionError naming both versions."""
    data = {**_record().to_dict(), "schema_version": 2}
    (tmp_path / "record.json").write_text(json.dumps(data))
    with pytest.raises(SchemaVersionError) as info:
        load_record(tmp_path / "record.json")
    assert (
        "schema_version 2 is not supported" in info.value.message
        and "reads schema_version 1" in info.value.message
    )


def test_foreign_schema_is_refused(tmp_path: Path) -> None:
    """A JSON file that is not a reprotune record raises SchemaVersionError."""
    (tmp_path / "record.json").write_text(json.dumps({"schema": "other/thing", "schema_version": 1}))
    with pytest.raises(SchemaVersionError, match="not a reprotune run record"):
        load_record(tmp_path / "record.json")


def test_non_json_file_is_an_input_error_with_position(tmp_path: Path) -> None:
    """A truncated record raises InputError whose source names line and column."""
    (tmp_path / "record.json").write_text('{\n "run_id": "x",\n "status": ')
    with pytest.raises(InputError) as info:
        load_record(tmp_path / "record.json")
    assert info.value.source == f"{tmp_path / 'record.json'}:3:12" and "not valid JSON" in info.value.message


def test_missing_and_invalid_records(tmp_path: Path) -> None:
    """A missing file and a record with a wrongly typed field raise InputError."""
    with pytest.raises(InputError, match="does not exist"):
        load_record(tmp_path / "nope.json")
    data = {**_record().to_dict(), "seeds": {"root": "forty-two"}}
    (tmp_path / "record.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"seeds.root"):
        load_record(tmp_path / "record.json")


def test_finish_and_fail() -> None:
    """finish_record and fail_record set status, outputs, error and timings."""
    record = _record()
    done = finish_record(
        record,
        outputs={"adapter_sha256": "d" * 64, "ledger_sha256": "e" * 64},
        steps_done=30,
        step_time_s_mean=0.5,
        ended_at="2026-01-01T00:01:00.000000Z",
    )
    assert done.status == "completed" and done.outputs is not None and done.outputs.adapter_sha256 == "d" * 64
    assert done.timings.duration_s == 60.0 and done.timings.steps_done == 30
    failed = fail_record(record, RuntimeError("out of memory"), steps_done=3)
    assert failed.status == "failed" and failed.error is not None
    assert (failed.error.type, failed.error.message) == ("RuntimeError", "out of memory")
    assert record.status == "running"  # records are frozen; each update is a new one


def test_run_id_format() -> None:
    """make_run_id is YYYYmmdd-HHMMSS-<8 hex of the config sha256> in UTC."""
    from datetime import datetime, timezone

    cfg = ExperimentConfig()
    run_id = make_run_id(cfg, datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc))
    assert run_id == f"20260304-050607-{config_sha256(cfg)[:8]}"


def test_recorded_config_reloads() -> None:
    """The config kept in a record validates back to the config it came from."""
    cfg = config_from_dict({"train": {"epochs": 2}})
    assert _record(cfg).experiment_config() == cfg
