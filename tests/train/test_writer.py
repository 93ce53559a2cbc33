"""The one run writer (``_train.writer.RunWriter``): how every path that writes a run directory
(``reprotune run``, rank 0 under torchrun, the Trainer callback) records an attempt and its end."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import ValidationError

from reprotune._config.schema import ExperimentConfig
from reprotune._run.layout import RunLayout
from reprotune._run.live_record import LiveRecord
from reprotune._run.lock import lock_run_dir
from reprotune._run.record import Status, start_record
from reprotune._trackers.base import RunDescription, TrackerSet
from reprotune._train.writer import RunWriter


class _Observer:
    """A tracker that keeps what it was told (a test's observer, not a stand-in for a library)."""

    name = "observer"

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def start(self, run: RunDescription) -> None:
        self.events.append(("start", run.run_id))

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.events.append(("metrics", step))

    def log_artifacts(self, paths: Mapping[str, Path]) -> None:
        self.events.append(("artifacts", {key: path.name for key, path in paths.items()}))

    def finish(self, status: Status) -> dict[str, Any]:
        self.events.append(("finish", status))
        return {"status_seen": status}

    def close(self) -> None:
        self.events.append(("close", None))


def _writer(tmp_path: Path) -> tuple[RunWriter, _Observer]:
    observer = _Observer()
    record = LiveRecord.start("20261202-000000-abcdef12", ExperimentConfig(), {"root": 0})
    writer = RunWriter(RunLayout(tmp_path), record, TrackerSet([observer]))
    writer.record.begin_attempt(resumed=False)
    writer.write_record()
    writer.start_trackers()
    (tmp_path / "ledger.jsonl").write_text('{"kind": "init", "step": 0}\n', encoding="utf-8")
    return writer, observer


def _saved(writer: RunWriter) -> dict[str, Any]:
    adapter = writer.paths.adapter_dir
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    return writer.adapter_outputs({"adapter_model.safetensors": "ab" * 32}, final_val_loss=None)


def test_completed_attempt_saves_outputs_and_logs_only_files_the_run_holds(tmp_path: Path) -> None:
    writer, observer = _writer(tmp_path)
    writer.finish("completed", timings=lambda: {"steps_done": 3}, save_outputs=lambda: _saved(writer))
    record = json.loads(writer.paths.record.read_text(encoding="utf-8"))
    assert record["status"] == "completed"
    assert record["outputs"]["adapter_sha256"] == "ab" * 32
    assert record["outputs"]["ledger_sha256"] is not None and "final_val_loss" in record["outputs"]
    assert record["timings"]["steps_done"] == 3
    assert record["trackers"] == {"observer": {"ok": True, "status_seen": "completed"}}
    # No config.yaml and no split.json here (a Trainer-made run without a manifest): not sent.
    artifacts = dict(observer.events)["artifacts"]
    assert artifacts == {"": "record.json", "ledger": "ledger.jsonl", "adapter": "adapter"}
    assert [name for name, _ in observer.events] == ["start", "artifacts", "finish"]
    assert record["attempts"][-1]["resumed"] is False and record["error"] is None


def test_a_failed_save_tells_the_trackers_failed_and_the_end_is_recorded_once(tmp_path: Path) -> None:
    writer, observer = _writer(tmp_path)

    def full_disk() -> dict[str, Any]:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        writer.finish("completed", timings=dict, save_outputs=full_disk)
    assert ("finish", "failed") in observer.events
    # The caller records the end as failed: the trackers are not finished a second time.
    writer.finish("failed", timings=dict, error=OSError(28, "No space left on device"))
    record = json.loads(writer.paths.record.read_text(encoding="utf-8"))
    assert record["status"] == "failed" and record["error"]["type"] == "OSError"
    assert "outputs" not in record
    assert [e for e in observer.events if e[0] == "finish"] == [("finish", "failed")]
    assert record["trackers"] == {"observer": {"ok": True, "status_seen": "failed"}}


def test_a_resumed_attempt_is_added_with_what_it_resumed_from(tmp_path: Path) -> None:
    writer, _ = _writer(tmp_path)
    writer.finish("stopped", timings=dict)
    writer.record.begin_attempt(resumed=True, from_step=2)
    assert writer.record["status"] == "running" and writer.record["error"] is None
    assert writer.record["attempts"][-1]["from_step"] == 2
    assert [a["resumed"] for a in writer.record["attempts"]] == [False, True]


class _UnsavableAdapter:
    """A model whose adapter cannot be written (as on a full disk)."""

    peft_config: ClassVar[dict[str, None]] = {"default": None}

    def save_pretrained(self, *args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")


def _trainer_run(run_dir: Path, observer: _Observer) -> Any:
    from reprotune.integrations._writer import TrainerRun

    record = start_record("20261202-000000-abcdef12", ExperimentConfig(), {"root": 0})
    record.update(status="running", error=None, attempts=[{"started_at": "now", "resumed": False}])
    return TrainerRun.new(
        run_dir,
        record,
        patch=b"",
        manifest=None,
        init_weights_sha256="0" * 64,
        trackers=lambda: TrackerSet([observer]),
    )


def test_a_trainer_record_the_schema_refuses_leaves_the_directory_free(tmp_path: Path) -> None:
    """An invalid first record is refused before the directory is claimed: nothing written,
    no lock held."""
    from reprotune.integrations._writer import TrainerRun

    record = start_record("20261202-000000-abcdef12", ExperimentConfig(), {"root": 0})
    record["status"] = "exploded"
    with pytest.raises(ValueError, match="invalid run record: status"):
        TrainerRun.new(
            tmp_path / "run",
            record,
            patch=b"",
            manifest=None,
            init_weights_sha256="0" * 64,
            trackers=lambda: TrackerSet([]),
        )
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
    lock_run_dir(tmp_path / "run", report=print).release()  # free: no InputError


@pytest.mark.parametrize("existed", [False, True], ids=["new-dir", "empty-dir"])
def test_a_trainer_run_that_cannot_write_its_first_record_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existed: bool
) -> None:
    """The patch is written, then the first record fails (a full disk): the patch is removed, a
    directory made for the run removed, an empty one left empty, and the lock free (before, the
    patch stayed and a retry found the directory not empty)."""
    from reprotune.integrations._writer import TrainerRun

    run_dir = tmp_path / "runs" / "run"
    if existed:
        run_dir.mkdir(parents=True)

    def full_disk(self: LiveRecord, path: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(LiveRecord, "write", full_disk)
    record = start_record("20261202-000000-abcdef12", ExperimentConfig(), {"root": 0})
    record.update(status="running", error=None, attempts=[{"started_at": "now", "resumed": False}])
    with pytest.raises(OSError, match="No space left"):
        TrainerRun.new(
            run_dir,
            record,
            patch=b"diff --git a/x b/x\n",
            manifest=None,
            init_weights_sha256="0" * 64,
            trackers=lambda: TrackerSet([]),
        )
    assert run_dir.exists() is existed and (not existed or not any(run_dir.iterdir()))
    lock_run_dir(run_dir, report=print).release()  # free: no InputError


def test_a_trainer_run_whose_ledger_cannot_be_closed_is_recorded_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing the ledger syncs it: on a full disk that fails, and the run is recorded failed,
    its trackers told so, the directory unlocked."""
    observer = _Observer()
    run = _trainer_run(tmp_path / "run", observer)

    def full_disk() -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run.ledger, "close", full_disk)
    with pytest.raises(OSError, match="No space left"):
        run.end("completed")
    written = json.loads(run.paths.record.read_text(encoding="utf-8"))
    assert written["status"] == "failed" and "No space left" in written["error"]["message"]
    assert ("finish", "failed") in observer.events
    lock_run_dir(tmp_path / "run", report=print).release()


def test_a_trainer_run_whose_adapter_cannot_be_saved_is_recorded_failed(tmp_path: Path) -> None:
    """The Trainer callback's runs end in the same writer: a save that fails leaves the record
    failed (with the error) and the directory unlocked, not a run that seems to go on."""
    observer = _Observer()
    run = _trainer_run(tmp_path / "run", observer)
    with pytest.raises(OSError, match="No space left"):
        run.end("completed", model=_UnsavableAdapter())
    written = json.loads(run.paths.record.read_text(encoding="utf-8"))
    assert written["status"] == "failed" and written["error"]["type"] == "OSError"
    assert ("finish", "failed") in observer.events and ("finish", "completed") not in observer.events
    lock_run_dir(tmp_path / "run", report=print).release()  # free again: no InputError
    run.end("failed")  # once ended, never again
    assert json.loads(run.paths.record.read_text(encoding="utf-8")) == written


def test_the_live_record_changes_only_through_its_operations(tmp_path: Path) -> None:
    """What a reader gets is a copy: editing it changes nothing; each named operation changes
    what it says, and the record written is what the operations made."""
    record = LiveRecord.start("20261202-000000-abcdef12", ExperimentConfig(), {"root": 0})
    record.begin_attempt(resumed=False)
    record.set_section("data", {"source": "rows.jsonl", "n_rows": 4})
    record["data"]["n_rows"] = 99  # a copy
    record["attempts"].append({"forged": True})  # a copy
    assert record["data"]["n_rows"] == 4 and len(record["attempts"]) == 1
    record.set_manifest_sha256("cd" * 32)
    record.note_drift(["data.n_rows: 4 -> 5"])
    record.note_drift(["model.dtype: float32 -> bfloat16"])
    record.note_attempt(from_step=2, rng_restored=True)
    record.set_section("distributed", {"world_size": 2})
    record.add_world_size_change({"from": 2, "to": 1, "at_step": 2, "attempt": 1})
    record.end("failed", OSError(28, "No space left on device"))
    record.add_timings({"steps_done": 2})
    with pytest.raises(ValueError, match="'outputs' is not a section"):
        record.set_section("outputs", {})  # type: ignore[arg-type]
    record.write(tmp_path / "record.json")
    written = json.loads((tmp_path / "record.json").read_text(encoding="utf-8"))
    assert written == {**record.document(), "schema": "reprotune/record", "schema_version": 1}
    assert written["data"] == {"source": "rows.jsonl", "n_rows": 4, "manifest_sha256": "cd" * 32}
    attempt = written["attempts"][-1]
    assert attempt["drift"] == ["data.n_rows: 4 -> 5", "model.dtype: float32 -> bfloat16"]
    assert (attempt["from_step"], attempt["rng_restored"]) == (2, True)
    assert attempt["world_size_change"] == written["distributed"]["world_size_changes"][0]
    assert written["status"] == "failed" and written["error"]["type"] == "OSError"
    assert written["timings"]["steps_done"] == 2 and "started_at" in written["timings"]


def test_a_live_record_is_typed_and_refuses_an_invalid_change_where_it_is_made() -> None:
    """Every operation is checked against the schema when it is made: a change the schema refuses
    fails there, naming the operation, and leaves the record as it was; the typed view follows."""
    record = LiveRecord.start("20261202-000000-abcdef12", ExperimentConfig(), {"root": 0})
    record.begin_attempt(resumed=False)
    record.set_section("data", {"source": "rows.jsonl", "n_rows": 4})
    assert record.typed.status == "running" and record.typed.data is not None
    assert record.typed.data.n_rows == 4
    before = record.document()
    with pytest.raises(ValueError, match=r"end would make an invalid run record: status"):
        record.end("exploded")  # type: ignore[arg-type]
    invalid = "would make an invalid run record"
    with pytest.raises(ValueError, match=rf"set_section\('data'\) {invalid}: data\.n_rows"):
        record.set_section("data", {"n_rows": "many"})
    with pytest.raises(ValueError, match=rf"add_timings {invalid}: timings\.steps_done"):
        record.add_timings({"steps_done": "two"})
    with pytest.raises(ValueError, match=rf"note_attempt {invalid}: attempts\[0\]\.from_step"):
        record.note_attempt(from_step="two")
    assert record.document() == before and record.typed.status == "running"
    record.note_attempt(from_step=2, rng_restored=True)
    assert (record.typed.attempts[-1].from_step, record.typed.attempts[-1].rng_restored) == (2, True)
    record.end("completed")
    assert record.typed.status == "completed" and record["status"] == "completed"
    with pytest.raises(ValidationError):  # frozen
        record.typed.status = "failed"  # type: ignore[misc]
    with pytest.raises(ValueError, match=f"a record {invalid}: run_id"):
        LiveRecord({"attempts": [{}]})


def test_a_live_record_without_an_attempt_refuses_attempt_notes() -> None:
    record = LiveRecord.start("20261202-000000-abcdef12", ExperimentConfig(), {"root": 0})
    with pytest.raises(RuntimeError, match="no attempt yet"):
        record.note_attempt(from_step=1)
