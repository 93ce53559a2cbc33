"""open_run_dir: what is a run directory, and how every malformed file is refused."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from reprotune._errors import InputError, SchemaVersionError
from reprotune._run.adapter import load_adapter
from reprotune._run.rundir import open_run_dir
from rundirs import truncate_ledger, write_run_dir


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A complete hand-built run directory."""
    return write_run_dir(tmp_path / "runs" / "r1")


def test_opens_complete_run(run: Path) -> None:
    """A complete run opens with its record, 12 train lines, 3 val lines, manifest and adapter."""
    opened = open_run_dir(run)
    assert opened.status == "completed"
    assert opened.ledger.init is not None
    assert [e.step for e in opened.ledger.train] == list(range(1, 13))
    assert [e.step for e in opened.ledger.val] == [4, 8, 12]
    assert opened.manifest is not None and len(opened.manifest.indices["train"]) == 16
    assert opened.adapter_path == run / "adapter" / "adapter_model.safetensors"


def test_missing_path(tmp_path: Path) -> None:
    """A path that does not exist is named, with the fix."""
    with pytest.raises(InputError, match="no such directory") as info:
        open_run_dir(tmp_path / "nope")
    assert info.value.fix is not None and "record.json" in info.value.fix


def test_file_is_not_run_dir(run: Path) -> None:
    """A file is not a run directory."""
    with pytest.raises(InputError, match="is a file, not a run directory"):
        open_run_dir(run / "record.json")


def test_a_bundle_is_not_a_run_dir_and_the_fix_says_how_to_rerun_it(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar.gz"
    bundle.write_bytes(b"\x1f\x8b")
    with pytest.raises(InputError) as refused:
        open_run_dir(bundle)
    assert "is a file, not a run directory" in str(refused.value)
    assert f"fix: rerun it here with `reprotune rerun {bundle} --out DIR`" in str(refused.value)


def test_a_part_of_a_run_names_the_run(run: Path) -> None:
    """An eval directory or the checkpoints folder of a run, given as a run: the fix names the run
    as the path was given."""
    for part in ("evals/20261203-test-0001", "checkpoints"):
        (run / part).mkdir(parents=True, exist_ok=True)
        with pytest.raises(InputError, match=r"has no record\.json") as info:
            open_run_dir(run / part)
        assert info.value.fix == f"pass the run directory {run}: {part} is a part of that run"


def test_a_part_of_a_run_given_as_dot_names_the_run_relative_to_it(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`.` inside a run's eval directory: the fix names the run as `../..`, a path to type here."""
    (run / "evals" / "e1").mkdir(parents=True)
    monkeypatch.chdir(run / "evals" / "e1")
    with pytest.raises(InputError, match=r"has no record\.json") as info:
        open_run_dir(Path("."))
    assert info.value.fix == "pass the run directory ../..: evals/e1 is a part of that run"


def test_parent_of_runs_suggests_children(run: Path) -> None:
    """Passing runs/ itself suggests the run directories inside it."""
    with pytest.raises(InputError, match=r"has no record\.json") as info:
        open_run_dir(run.parent)
    assert info.value.fix is not None and str(run) in info.value.fix


@pytest.mark.parametrize(
    ("schema", "version", "message", "key"),
    [
        ("reprotune/manifest", 1, "schema is 'reprotune/manifest', expected 'reprotune/record'", "schema"),
        ("reprotune/record", 2, "record schema_version 2 is not supported", "schema_version"),
        (None, None, "schema is None, expected 'reprotune/record'", "schema"),
    ],
    ids=["other-schema", "future-version", "no-schema"],
)
def test_unknown_record_schema(
    run: Path, schema: str | None, version: int | None, message: str, key: str
) -> None:
    """A record of another schema or version raises SchemaVersionError naming the file, the key at
    fault and what it found."""
    path = run / "record.json"
    record = json.loads(path.read_text())
    record["schema"], record["schema_version"] = schema, version
    path.write_text(json.dumps(record))
    with pytest.raises(SchemaVersionError, match=re.escape(message)) as info:
        open_run_dir(run)
    assert info.value.source == f"{path}: key '{key}'"


def test_invalid_record(run: Path) -> None:
    """A record whose fields break the schema is bad input, naming the key."""
    path = run / "record.json"
    record = json.loads(path.read_text())
    record["status"] = "finished"
    path.write_text(json.dumps(record))
    with pytest.raises(InputError, match="status"):
        open_run_dir(run)


def test_record_not_json(run: Path) -> None:
    """A broken record names its line and column."""
    (run / "record.json").write_text('{\n "schema": "reprotune/record",\n oops\n}\n')
    with pytest.raises(InputError) as info:
        open_run_dir(run)
    assert info.value.source == f"{run / 'record.json'}:3:2"


def test_truncated_ledger(run: Path) -> None:
    """A ledger cut mid-line is refused, naming the file and the partial line."""
    n_lines = len((run / "ledger.jsonl").read_text().splitlines())
    truncate_ledger(run, 20)
    with pytest.raises(InputError, match="incomplete") as info:
        open_run_dir(run)
    assert info.value.source == f"{run / 'ledger.jsonl'}:{n_lines}"
    assert info.value.fix is not None and "reprotune rerun" in info.value.fix


def test_an_empty_ledger_of_a_completed_run(run: Path) -> None:
    """A completed run's emptied ledger is refused (it compared IDENTICAL with itself)."""
    (run / "ledger.jsonl").write_bytes(b"")
    with pytest.raises(InputError, match="is empty, yet the run completed") as info:
        open_run_dir(run)
    assert info.value.source == str(run / "ledger.jsonl")


def test_ledger_missing_final_newline(run: Path) -> None:
    """Even a last line that parses is refused without its newline: the append was cut short."""
    truncate_ledger(run, 1)
    with pytest.raises(InputError, match="does not end with a newline"):
        open_run_dir(run)


def _replace_line(run: Path, number: int, text: str) -> None:
    path = run / "ledger.jsonl"
    lines = path.read_text().splitlines()
    lines[number - 1] = text
    path.write_text("\n".join(lines) + "\n")


def _line(run: Path, number: int) -> dict[str, object]:
    return dict(json.loads((run / "ledger.jsonl").read_text().splitlines()[number - 1]))


@pytest.mark.parametrize(
    ("edit", "message", "column"),
    [
        (lambda e: "", "line 3 is blank", None),
        (lambda e: '{"kind": "train", "step": 2,', "line 3 is not valid JSON", 29),
        (lambda e: "[1, 2]", "line 3 is a JSON list, not an object", None),
        (lambda e: json.dumps({**e, "kind": "eval"}), "line 3 has kind 'eval'", None),
        (
            lambda e: json.dumps({k: v for k, v in e.items() if k != "grad_norm"}),
            "has no key 'grad_norm'",
            None,
        ),
        (lambda e: json.dumps({**e, "loss": "0.5"}), "key 'loss' of the 'train' line 3 is '0.5'", None),
        (lambda e: json.dumps({**e, "step": True}), "key 'step' of the 'train' line 3 is True", None),
        (lambda e: json.dumps({**e, "weights_sha256": "abc"}), "not a sha256", None),
        (lambda e: json.dumps({**e, "step": 3}), "train step 3 where step 2 was expected", None),
    ],
    ids=[
        "blank",
        "broken-json",
        "not-object",
        "unknown-kind",
        "missing-key",
        "decimal-loss",
        "bool-step",
        "short-hash",
        "skipped-step",
    ],
)
def test_malformed_ledger_line(run: Path, edit: object, message: str, column: int | None) -> None:
    """Each kind of malformed ledger line is refused, naming file, line (and column for JSON)."""
    assert callable(edit)
    _replace_line(run, 3, edit(_line(run, 3)))
    with pytest.raises(InputError, match=re.escape(message)) as info:
        open_run_dir(run)
    where = f"{run / 'ledger.jsonl'}:3"
    assert info.value.source is not None and info.value.source.startswith(where)
    if column is not None:
        assert info.value.source == f"{where}:{column}"


def test_val_before_its_train_step(run: Path) -> None:
    """A validation line for a step not yet trained is refused."""
    _replace_line(
        run, 2, json.dumps({"kind": "val", "step": 4, "loss": "0x1.0p-1", "n_rows": 1, "n_tokens": 1})
    )
    with pytest.raises(InputError, match="val line for step 4 comes before train step 4"):
        open_run_dir(run)


def test_ledger_without_init(run: Path) -> None:
    """A ledger must start with its init line."""
    path = run / "ledger.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[1:]))
    with pytest.raises(InputError, match="must start with its 'init' line"):
        open_run_dir(run)


def test_missing_ledger(run: Path) -> None:
    """A run directory without ledger.jsonl is refused."""
    (run / "ledger.jsonl").unlink()
    with pytest.raises(InputError, match=r"has no ledger\.jsonl"):
        open_run_dir(run)


def test_bfloat16_adapter_widened_exactly(tmp_path: Path) -> None:
    """A bfloat16 adapter (which numpy lacks) is read as the exact float32 values."""
    values = np.array([1.0, -2.5, 0.15625, 3.0e38], dtype=np.float32)
    bits = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, len(bits)]}}).encode()
    path = tmp_path / "adapter_model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bits)
    tensors = load_adapter(path)
    expected = (values.view(np.uint32) & 0xFFFF0000).view(np.float32).reshape(2, 2)
    assert tensors["w"].dtype == np.float32
    assert np.array_equal(tensors["w"], expected)


def test_broken_adapter(tmp_path: Path) -> None:
    """A file that is not safetensors is bad input naming the file."""
    path = tmp_path / "adapter_model.safetensors"
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(InputError) as info:
        load_adapter(path)
    assert info.value.source == str(path)


def test_fast_and_line_by_line_checks_agree(run: Path) -> None:
    """The one-pass check and the line-by-line check read a valid ledger to the same entries."""
    from reprotune._run.ledger import _parse_entries, parse_entry

    path = run / "ledger.jsonl"
    lines = path.read_bytes().split(b"\n")[:-1]
    fast = _parse_entries(path, lines)
    slow = [parse_entry(path, number, raw) for number, raw in enumerate(lines, start=1)]
    assert fast == slow
    assert len(fast) == 1 + 12 + 3


def test_value_with_newline_is_refused(run: Path) -> None:
    """A hash holding an escaped newline (two valid hashes) is refused, not split in two."""
    entry = _line(run, 3)
    entry["batch_sha256"] = "a" * 64 + "\n" + "b" * 64
    _replace_line(run, 3, json.dumps(entry))
    with pytest.raises(InputError, match="not a sha256"):
        open_run_dir(run)


def test_broken_manifest(run: Path) -> None:
    """A split.json of an unknown schema version is refused by the manifest loader."""
    path = run / "split.json"
    manifest = json.loads(path.read_text())
    manifest["schema_version"] = 7
    path.write_text(json.dumps(manifest))
    with pytest.raises(SchemaVersionError, match="manifest schema_version 7 is not supported"):
        open_run_dir(run)
