"""Tests for reprotune._data.manifest: canonical bytes, round trips, sidecar, validation, atomicity."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reprotune._data import manifest as _manifest
from reprotune._data.index_render import render_index_list
from reprotune._data.loaders import table_from_columns
from reprotune._data.manifest import copy_manifest, load_manifest, manifest_bytes, write_manifest
from reprotune._data.split import split_table
from reprotune._errors import InputError, SchemaVersionError
from reprotune._jsonio import canonical_dumps, sha256_file


def make_manifest(n: int, seed: int = 4) -> _manifest.Manifest:
    table = table_from_columns({"label": np.arange(n, dtype=np.int64) % 5})
    return split_table(table, seed=seed, stratify_by="label")


@pytest.mark.parametrize("level", [1, 2])
def test_render_index_list_is_json_dumps(level: int) -> None:
    """The vectorised list writer gives json.dumps(indent=1) bytes for every digit count."""
    values = np.array([0, 7, 9, 10, 99, 100, 4321, 99999, 123456, 10**10 + 3], dtype=np.int64)
    nested: Any = values.tolist()
    for _ in range(level):
        nested = {"k": nested}
    expected = json.dumps(nested, indent=1)
    assert f'"k": {render_index_list(values, level).decode()}' in expected
    assert render_index_list(np.zeros(0, dtype=np.int64), level) == b"[]"


@pytest.mark.parametrize("n", [30, 25_000], ids=["small", "large-path"])
def test_manifest_bytes_are_canonical_json(n: int) -> None:
    """The file is exactly canonical_dumps of the manifest object, on both writer paths."""
    m = make_manifest(n)
    assert manifest_bytes(m) == canonical_dumps(m.to_json_obj()).encode("utf-8")


def test_write_load_round_trip_same_bytes(tmp_path: Path) -> None:
    """Loading a manifest and writing it again gives the same bytes and the same fields."""
    m = make_manifest(200)
    digest = write_manifest(m, tmp_path / "a.json")
    assert digest == sha256_file(tmp_path / "a.json")
    loaded = load_manifest(tmp_path / "a.json")
    assert loaded.indices == m.indices and loaded.seed == 4 and loaded.n_rows == 200
    assert loaded.dataset_sha256 == m.dataset_sha256 and loaded.classes == m.classes
    assert loaded.row_hashes.hex_list() == m.row_hashes.hex_list()
    write_manifest(loaded, tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    obj = json.loads((tmp_path / "a.json").read_text())
    assert set(obj) >= {"train", "validation", "test", "dropped", "seed", "ratios", "strategy", "classes"}


def test_large_manifest_uses_sidecar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above the inline limit, row hashes go to a sidecar named in the manifest with its sha256."""
    monkeypatch.setattr(_manifest, "INLINE_ROW_HASH_LIMIT", 50)
    m = make_manifest(120)
    write_manifest(m, tmp_path / "s.json")
    info = json.loads((tmp_path / "s.json").read_text())["row_hashes"]
    side = tmp_path / f"s.json.{info['file_sha256'][:16]}.rowhashes"  # named by its content
    assert info == {"algorithm": "sha256", "file": side.name, "file_sha256": sha256_file(side), "n_rows": 120}
    assert load_manifest(tmp_path / "s.json").row_hashes.hex_list() == m.row_hashes.hex_list()
    copy_manifest(tmp_path / "s.json", tmp_path / "run" / "split.json")
    assert (tmp_path / "run" / side.name).read_bytes() == side.read_bytes()
    assert load_manifest(tmp_path / "run" / "split.json").indices == m.indices
    side.write_bytes(side.read_bytes()[:-1] + b"\x00")
    with pytest.raises(InputError, match=rf"row-hash sidecar '{re.escape(side.name)}' has sha256"):
        load_manifest(tmp_path / "s.json")
    side.unlink()
    with pytest.raises(InputError, match="does not exist"):
        load_manifest(tmp_path / "s.json")


def test_rewriting_keeps_a_neighbours_sidecar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewriting s.json removes its replaced sidecar only: s.json.v1's, whose name starts with
    "s.json.", stays (before, it was removed and s.json.v1 no longer loaded)."""
    monkeypatch.setattr(_manifest, "INLINE_ROW_HASH_LIMIT", 50)
    write_manifest(make_manifest(120, seed=1), tmp_path / "s.json.v1")
    write_manifest(make_manifest(120, seed=2), tmp_path / "s.json")
    write_manifest(make_manifest(130, seed=3), tmp_path / "s.json")
    assert load_manifest(tmp_path / "s.json.v1").indices == make_manifest(120, seed=1).indices
    named = {json.loads((tmp_path / m).read_text())["row_hashes"]["file"] for m in ("s.json", "s.json.v1")}
    assert {p.name for p in tmp_path.glob("*.rowhashes")} == named  # s.json's replaced one is gone
    assert load_manifest(tmp_path / "s.json").n_rows == 130


def test_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the manifest cannot be written, the new sidecar is removed and no manifest exists."""
    monkeypatch.setattr(_manifest, "INLINE_ROW_HASH_LIMIT", 50)
    real = _manifest.write_bytes_atomic

    def failing(path: Any, data: bytes) -> Path:
        if str(path).endswith(".json"):
            raise OSError("disk full")
        return real(path, data)

    monkeypatch.setattr(_manifest, "write_bytes_atomic", failing)
    with pytest.raises(OSError, match="disk full"):
        write_manifest(make_manifest(120), tmp_path / "s.json")
    assert list(tmp_path.iterdir()) == []


def test_unknown_schema_version(tmp_path: Path) -> None:
    """A manifest of another schema version is refused with SchemaVersionError."""
    obj = make_manifest(50).to_json_obj()
    obj["schema_version"] = 99
    (tmp_path / "m.json").write_text(canonical_dumps(obj))
    with pytest.raises(SchemaVersionError, match="schema_version 99 is not supported"):
        load_manifest(tmp_path / "m.json")


def test_not_json_names_line_and_column(tmp_path: Path) -> None:
    """A manifest that is not JSON is refused naming the line and column."""
    (tmp_path / "m.json").write_text('{\n "schema": oops\n}')
    with pytest.raises(InputError, match=r"not valid JSON: .*\(line 2, column 12\)") as info:
        load_manifest(tmp_path / "m.json")
    assert info.value.source == f"{tmp_path / 'm.json'}:2:12"


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda o: o.update(test=sorted([*o["test"], o["train"][0]])), "more than one list"),
        (lambda o: o["train"].pop(), "in no list"),
        (lambda o: o["train"].append(10**6), "outside 0..49"),
        (lambda o: o.update(seed="x"), r"seed: input should be a valid integer \(got 'x'\)"),
        (lambda o: o.update(seed=True), r"seed: input should be a valid integer \(got True\)"),
        (lambda o: o["validation"].__setitem__(0, 1.5), "other than integers"),
        (lambda o: o.pop("dataset"), "dataset: field required"),
        (lambda o: o["dataset"].pop("sha256"), "dataset.sha256: field required"),
        (
            lambda o: o.update(strategy="shuffled"),
            r"strategy: input should be 'random', 'stratified' or 'grouped'",
        ),
        (lambda o: o["ratios"].pop("test"), "ratios.test: field required"),
        (
            lambda o: o["classes"][1].update(decision="keep"),
            r"classes\[1\].decision: input should be 'split', 'train' or 'drop' \(got 'keep'\)",
        ),
        (lambda o: o.update(seed=-5), r"seed: input should be greater than or equal to 0"),
        (lambda o: o["dataset"].update(sha256="abc"), r"dataset.sha256: string should match pattern"),
        (lambda o: o["sizes"].update(train=3), r"sizes.train is 3, but 'train' lists \d+ rows"),
        (
            lambda o: o.update(stratify_by=None),
            r"strategy 'stratified' without its column \(stratify_by is null\)",
        ),
        (
            lambda o: o["ratios"].update(train=0.5),
            r"ratios \[0.5, 0.1, 0.1\] are not fractions that sum to 1",
        ),
    ],
    ids=[
        "overlap",
        "missing-row",
        "range",
        "seed-type",
        "seed-bool",
        "float-index",
        "no-dataset",
        "no-sha256",
        "strategy",
        "ratios",
        "class-decision",
        "seed-negative",
        "sha256-not-hex",
        "sizes",
        "strategy-without-column",
        "ratios-sum",
    ],
)
def test_invalid_manifest_refused(tmp_path: Path, edit: Any, match: str) -> None:
    """Hand-edited or damaged manifests are refused with the problem named."""
    obj = make_manifest(50).to_json_obj()
    edit(obj)
    (tmp_path / "m.json").write_text(json.dumps(obj))
    with pytest.raises(InputError, match=match):
        load_manifest(tmp_path / "m.json")


def test_every_problem_of_a_manifest_is_named_at_once(tmp_path: Path) -> None:
    """Three keys wrong: one error names all three, each with its key."""
    obj = make_manifest(50).to_json_obj()
    obj.update(seed="x", strategy="shuffled")
    obj["dataset"]["n_rows"] = -1
    (tmp_path / "m.json").write_text(json.dumps(obj))
    with pytest.raises(InputError, match=r"invalid manifest \(3 problem\(s\)\)") as info:
        load_manifest(tmp_path / "m.json")
    for key in ("dataset.n_rows: ", "seed: ", "strategy: "):
        assert key in str(info.value)


def _refusal(tmp_path: Path, obj: dict[str, Any]) -> InputError:
    """The error loading the manifest ``obj`` (written to m.json) raises."""
    (tmp_path / "m.json").write_text(json.dumps(obj))
    with pytest.raises(InputError) as info:
        load_manifest(tmp_path / "m.json")
    return info.value


@pytest.mark.parametrize(("row", "value"), [(0, False), (1, True)], ids=["false", "true"])
def test_true_or_false_is_no_row_index(tmp_path: Path, row: int, value: bool) -> None:
    """JSON's true and false are no integers (the docs say so), also among integers, where NumPy
    reads them as 1 and 0 (before, a list holding false for row 0 loaded)."""
    obj = make_manifest(50).to_json_obj()
    name = next(name for name in _manifest.LISTS if row in obj[name])
    position = obj[name].index(row)
    obj[name][position] = value
    said = f"{name}[{position}] is {json.dumps(value)}, not a row index (an integer)"
    assert _refusal(tmp_path, obj).message == f"invalid manifest (1 problem(s)): {said}"


def test_the_keys_and_the_index_lists_are_named_in_one_error(tmp_path: Path) -> None:
    """A key of the wrong type and a row in no list are named together (before, the index lists
    were checked only once every key was valid: the missing row was named on the next try)."""
    obj = make_manifest(50).to_json_obj()
    obj.update(seed="x")
    obj["classes"][0]["decision"] = "keep"
    missing = obj["train"].pop(0)
    refused = _refusal(tmp_path, obj)
    assert refused.message == (
        "invalid manifest (4 problem(s)): seed: input should be a valid integer (got 'x'); "
        "classes[0].decision: input should be 'split', 'train' or 'drop' (got 'keep'); "
        f"row {missing} is in no list (train, validation, test, dropped); "
        f"sizes.train is {len(obj['train']) + 1}, but 'train' lists {len(obj['train'])} rows"
    )
    assert refused.source == str(tmp_path / "m.json")


def test_the_index_lists_are_checked_when_the_row_count_is_unreadable(tmp_path: Path) -> None:
    """Without a readable dataset.n_rows the lists' own problems are still named, with it."""
    obj = make_manifest(50).to_json_obj()
    obj["dataset"]["n_rows"] = "50"
    obj["validation"][0] = 1.5
    assert _refusal(tmp_path, obj).message == (
        "invalid manifest (2 problem(s)): dataset.n_rows: input should be a valid integer (got '50'); "
        "key 'validation' holds something other than integers"
    )


def test_missing_manifest(tmp_path: Path) -> None:
    """A manifest path that does not exist is an InputError."""
    with pytest.raises(InputError, match="does not exist"):
        load_manifest(tmp_path / "none.json")
