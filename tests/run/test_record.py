"""Tests for reprotune._run.record: round trip, canonical bytes, schema refusal, bad files."""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

from reprotune._config.loading import config_from_dict
from reprotune._config.schema import ExperimentConfig, config_sha256
from reprotune._determinism.seeds import derive_seeds
from reprotune._errors import InputError, SchemaVersionError
from reprotune._formats import RECORD
from reprotune._jsonio import canonical_dumps, sha256_file
from reprotune._run.record import (
    load_record,
    make_run_id,
    parse_record,
    read_record,
    start_record,
    write_record,
    write_stopped_copy,
)


def _record(cfg: ExperimentConfig | None = None) -> dict[str, Any]:
    cfg = cfg or config_from_dict({"seed": {"root": 7, "overrides": {"eval": 3}}})
    record = start_record("20260101-000000-abcdef12", cfg, derive_seeds(cfg.seed.root, cfg.seed.overrides))
    record.update(
        status="running",
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
    )
    return record


def test_start_record_holds_config_identity_and_seeds() -> None:
    """start_record holds the resolved config, its sha256, the seeds given and a start time."""
    cfg = config_from_dict({"seed": {"root": 7, "overrides": {"eval": 3}}})
    record = _record(cfg)
    assert record["config"] == cfg.resolved() and record["config_sha256"] == config_sha256(cfg)
    assert record["seeds"] == derive_seeds(7, {"eval": 3}) and record["seeds"]["eval"] == 3
    assert record["attempts"] == [] and record["timings"]["started_at"].endswith("Z")
    parsed = parse_record(RECORD.stamp(record))
    assert parsed.status == "running" and parsed.config_sha256 == config_sha256(cfg)


def test_round_trip_is_exact_and_canonical(tmp_path: Path) -> None:
    """write then load gives an equal record; the file is canonical JSON; the sha256 returned is its own."""
    record = _record()
    sha = write_record(tmp_path / "record.json", record)
    stamped = RECORD.stamp(record)
    assert load_record(tmp_path / "record.json") == stamped
    assert load_record(tmp_path) == stamped  # a run directory works too
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
    assert loaded["schema"] == RECORD.schema and loaded["schema_version"] == RECORD.version
    assert loaded["attempts"] == [{"resumed": False}] and loaded["data"]["order"] == {"version": 1}


def test_invalid_record_is_not_written(tmp_path: Path) -> None:
    """write_record refuses a record that breaks the schema, and leaves no file."""
    bad = {**_stamped(), "status": "exploded"}
    with pytest.raises(ValueError, match="status"):
        write_record(tmp_path / "record.json", bad)
    assert not (tmp_path / "record.json").exists()


def test_a_world_size_change_is_checked_and_read_back_as_written(tmp_path: Path) -> None:
    """An attempt's ``world_size_change`` (``from``, ``to``, ``at_step``) is typed: written and read
    back under its own key names, and refused without its ``to``."""
    change = {"from": 2, "to": 1, "at_step": 4, "attempt": 1}
    record = {**_stamped(), "attempts": [{"resumed": False}, {"resumed": True, "world_size_change": change}]}
    write_record(tmp_path / "record.json", record)
    assert load_record(tmp_path)["attempts"][1]["world_size_change"] == change
    typed = parse_record(load_record(tmp_path)).attempts[1].world_size_change
    assert typed is not None and (typed.from_, typed.to, typed.at_step) == (2, 1, 4)
    partial = {k: v for k, v in change.items() if k != "to"}
    bad = {**_stamped(), "attempts": [{"resumed": True, "world_size_change": partial}]}
    with pytest.raises(ValueError) as refused:
        write_record(tmp_path / "other.json", bad)
    assert "attempts[0].world_size_change.to: field required" in str(refused.value)
    assert not (tmp_path / "other.json").exists()


def test_a_distributed_section_is_typed_and_refused_with_the_key_that_is_wrong(tmp_path: Path) -> None:
    """The ``distributed`` section of a torchrun run reads back as written (extra keys kept) and
    typed; a section without ``world_size`` or with a rank that is not a number is refused, each
    problem named by its key."""
    section = {
        "world_size": 2,
        "backend": "gloo",
        "strategy": "ddp",
        "launcher": "torchrun",
        "nodes": 1,
        "timeout_s": 600.0,
        "rank_seeds": [11, 12],
        "reductions": {"loss": "gathered"},
        "ranks": [{"rank": 0, "host": "a", "environment_differs": []}, {"rank": 1, "host": "b"}],
        "world_size_changes": [{"from": 2, "to": 1, "at_step": 4, "attempt": 1}],
        "later_key": "kept",
    }
    write_record(tmp_path / "record.json", {**_stamped(), "distributed": section})
    assert load_record(tmp_path)["distributed"] == section
    typed = parse_record(load_record(tmp_path)).distributed
    assert typed is not None and typed.world_size == 2 and [r.host for r in typed.ranks] == ["a", "b"]
    assert typed.world_size_changes[0].to == 1 and typed.model_extra == {"later_key": "kept"}

    bad = {k: v for k, v in section.items() if k != "world_size"}
    bad["ranks"] = [{"rank": "zero"}]
    with pytest.raises(ValueError) as refused:
        write_record(tmp_path / "other.json", {**_stamped(), "distributed": bad})
    assert "distributed.world_size: field required" in str(refused.value)
    assert "distributed.ranks[0].rank:" in str(refused.value)
    assert not (tmp_path / "other.json").exists()


def test_a_typed_record_is_written_as_it_was_read(tmp_path: Path) -> None:
    """A record read into its type and written again is byte for byte the file it came from: no
    default is added for a section or key it lacks (an older record stays what it was)."""
    write_record(tmp_path / "a.json", {**_stamped(), "environment": {"cpu": {"model": "x"}}, "later": 1})
    typed = parse_record(load_record(tmp_path / "a.json"))
    write_record(tmp_path / "b.json", typed)
    assert (tmp_path / "b.json").read_bytes() == (tmp_path / "a.json").read_bytes()


def test_the_determinism_lora_and_environment_sections_are_typed(tmp_path: Path) -> None:
    """A real run's ``determinism``, ``lora`` and ``environment`` (this machine's, read back) pass
    the record's types and read back as written, PEFT's and later keys kept; a value of the wrong
    kind in any of them is refused, each problem named by its key, and nothing is written."""
    from reprotune._determinism.flags import determinism_flags
    from reprotune._run.fingerprint import environment_fingerprint

    environment = environment_fingerprint()
    environment["distributions"]["no-version-in-its-metadata"] = None  # read as importlib reads it
    lora = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "use_dora": False}
    sections = {"determinism": determinism_flags(), "lora": lora, "environment": environment}
    write_record(tmp_path / "record.json", {**_stamped(), **sections})
    loaded = load_record(tmp_path)
    assert {key: loaded[key] for key in sections} == json.loads(canonical_dumps(sections))
    typed = parse_record(loaded)
    assert typed.lora is not None and typed.lora.r == 8 and typed.lora.model_extra == {"use_dora": False}
    assert typed.environment is not None and typed.environment.torch is not None
    assert typed.environment.torch.version == environment["torch"]["version"]
    assert typed.determinism is not None and typed.determinism.deterministic_algorithms is not None

    bad = {
        "determinism": {**sections["determinism"], "deterministic_algorithms": "sometimes"},
        "lora": {**lora, "r": "eight"},
        "environment": {**environment, "cpu": {"logical_cores": "two"}, "python": "3.11"},
    }
    with pytest.raises(ValueError) as refused:
        write_record(tmp_path / "other.json", {**_stamped(), **bad})
    for key in ("determinism.deterministic_algorithms:", "lora.r:", "environment.cpu.logical_cores:"):
        assert key in str(refused.value)
    assert "environment.python: input should be a valid dictionary" in str(refused.value)
    assert not (tmp_path / "other.json").exists()


def test_tracker_summaries_are_typed_by_ok_and_keep_their_own_keys(tmp_path: Path) -> None:
    """Each tracker's summary says ``ok`` (and its ``error`` when it failed) beside its own keys;
    one without ``ok`` is refused naming trackers.NAME.ok."""
    trackers = {
        "mlflow": {"ok": True, "mlflow_run_id": "abc", "metrics_logged": 12},
        "wandb": {"ok": False, "error": "ConnectionError: offline"},
    }
    write_record(tmp_path / "record.json", {**_stamped(), "trackers": trackers})
    typed = parse_record(load_record(tmp_path)).trackers
    assert typed is not None and typed["wandb"].error == "ConnectionError: offline"
    assert typed["mlflow"].ok and typed["mlflow"].mlflow_run_id == "abc"  # read back by reprotune
    assert typed["mlflow"].model_extra == {"metrics_logged": 12}  # kept, as written
    assert typed["mlflow"].tracking_uri is None and typed["wandb"].wandb_run_id is None
    with pytest.raises(ValueError) as refused:
        write_record(
            tmp_path / "other.json", {**_stamped(), "trackers": {"mlflow": {"mlflow_run_id": "abc"}}}
        )
    assert "trackers.mlflow.ok: field required" in str(refused.value)
    assert not (tmp_path / "other.json").exists()


def test_unknown_schema_version_is_refused(tmp_path: Path) -> None:
    """A record with schema_version 2 raises SchemaVersionError naming both versions."""
    data = {**_stamped(), "schema_version": 2}
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


def test_a_record_read_typed_holds_what_the_file_holds(tmp_path: Path) -> None:
    """read_record gives the file as a typed, frozen record: named fields of their types, extra
    keys kept, and the same dict as load_record when written back out; the same refusals."""
    record = {**_record(), "status": "completed", "findings": [{"code": "x"}]}
    record["timings"].update(duration_s=12.5, steps_done=3, step_time_s_mean=0.25)
    record["outputs"] = {"adapter_sha256": "d" * 64, "ledger_sha256": "e" * 64}
    write_record(tmp_path / "record.json", record)
    typed = read_record(tmp_path)
    assert typed.status == "completed" and typed.timings.steps_done == 3
    assert typed.timings.duration_s == 12.5 and typed.outputs is not None
    assert typed.outputs.adapter_sha256 == "d" * 64 and typed.data is not None
    assert typed.data.split_sizes == {"train": 1620, "validation": 203, "test": 203}
    assert (typed.model_extra or {})["findings"] == [{"code": "x"}]
    assert typed.to_dict() == load_record(tmp_path)
    with pytest.raises(Exception, match="frozen"):
        typed.status = "failed"  # type: ignore[misc]
    (tmp_path / "record.json").write_text(json.dumps({**_stamped(), "seeds": {"root": "forty-two"}}))
    with pytest.raises(InputError, match=r"seeds.root"):
        read_record(tmp_path)


def test_a_stopped_copy_changes_the_status_and_data_path_alone(tmp_path: Path) -> None:
    """The record of a run directory copied to be resumed (a spot check's interval): status
    ``stopped``, the data path given (a bundle's data), every other key as it was, validated."""
    record = {**_record(), "status": "completed", "findings": [{"code": "x"}]}
    write_record(tmp_path / "record.json", record)
    before = load_record(tmp_path)
    write_stopped_copy(tmp_path, tmp_path / "copy.json", data_path="/elsewhere/data.jsonl")
    after = load_record(tmp_path / "copy.json")
    assert after["status"] == "stopped" and after["config"]["data"]["path"] == "/elsewhere/data.jsonl"
    after["status"], after["config"]["data"]["path"] = before["status"], before["config"]["data"]["path"]
    assert after == before
    write_stopped_copy(tmp_path, tmp_path / "plain.json")
    assert load_record(tmp_path / "plain.json") == {**before, "status": "stopped"}


def test_missing_and_invalid_records(tmp_path: Path) -> None:
    """A missing file and a record with a wrongly typed field raise InputError."""
    with pytest.raises(InputError, match="does not exist"):
        load_record(tmp_path / "nope.json")
    data = {**_stamped(), "seeds": {"root": "forty-two"}}
    (tmp_path / "record.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"seeds.root"):
        load_record(tmp_path / "record.json")


def test_run_id_format() -> None:
    """make_run_id is YYYYmmdd-HHMMSS-<8 hex of the config sha256> in UTC."""
    from datetime import datetime

    cfg = ExperimentConfig()
    run_id = make_run_id(config_sha256(cfg), datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC))
    assert run_id == f"20260304-050607-{config_sha256(cfg)[:8]}"


def test_recorded_config_reloads() -> None:
    """The config kept in a record validates back to the config it came from."""
    cfg = config_from_dict({"train": {"epochs": 2}})
    assert config_from_dict(_record(cfg)["config"]) == cfg


def _stamped() -> dict[str, Any]:
    return RECORD.stamp({"reprotune_version": "0", **_record()})


def test_a_records_status_is_read_as_its_type() -> None:
    """``status_of``: a status reprotune writes comes back as itself; anything else (a damaged or
    hand-edited record) is None, so no check mistakes it for a status."""
    from reprotune._run.record import Status, ended_status, status_of

    for status in ("running", "completed", "failed", "stopped", "interrupted"):
        assert status_of({"status": status}) == status
    assert status_of({"status": "complete"}) is None and status_of({}) is None
    assert status_of({"status": ["completed"]}) is None
    ended: tuple[Status, Status] = (ended_status(KeyboardInterrupt()), ended_status(ValueError()))
    assert ended == ("interrupted", "failed")
