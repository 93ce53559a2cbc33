"""Tests for reprotune._data.table and reprotune._data.builtin: loading, canonical rows, row hashes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from reprotune._data.loaders import load_table, table_from_columns, table_from_dataset
from reprotune._data.row_hashes import RowHashes
from reprotune._data.table import canonical_row_bytes, factorize, not_text, row_sha256
from reprotune._errors import InputError
from reprotune._jsonio import sha256_file

ROWS = [
    {"prompt": "Hi", "response": "Hello!", "category": "greet"},
    {"prompt": "Bye", "response": "See you", "category": "greet"},
    {"prompt": "2+2?", "response": "4", "category": "math"},
]


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_row_hash_is_sha256_of_sorted_compact_json() -> None:
    """The row hash is the sha256 of compact, sorted-key, UTF-8 JSON, as documented."""
    row = {"b": "é", "a": 1}
    assert canonical_row_bytes(row) == '{"a":1,"b":"é"}'.encode()
    assert row_sha256(row) == hashlib.sha256('{"a":1,"b":"é"}'.encode()).hexdigest()


def test_jsonl_load_columns_hashes_and_file_sha(tmp_path: Path) -> None:
    """A JSONL file loads columnar, its sha256 covers its bytes, row hashes match row_sha256."""
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    table = load_table(str(path))
    assert (table.n_rows, table.columns, table.format) == (3, ["prompt", "response", "category"], "jsonl")
    assert table.file_sha256 == sha256_file(path)
    assert table.row(2) == ROWS[2]
    assert table.row_hashes() == [row_sha256(r) for r in ROWS]


def test_reformatted_jsonl_same_row_hashes_other_file_sha(tmp_path: Path) -> None:
    """Key order and spacing change the file's sha256 but not the row hashes."""
    a = write_jsonl(tmp_path / "a.jsonl", ROWS)
    b = tmp_path / "b.jsonl"
    b.write_text(
        "\n".join(json.dumps(dict(reversed(r.items())), indent=None, separators=(", ", " : ")) for r in ROWS)
        + "\n\n",
        encoding="utf-8",
    )
    ta, tb = load_table(str(a)), load_table(str(b))
    assert ta.file_sha256 != tb.file_sha256
    assert ta.row_hashes() == tb.row_hashes()


def test_csv_and_parquet_load(tmp_path: Path) -> None:
    """CSV values are strings; Parquet keeps types; both give the documented row hashes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    csv_path = tmp_path / "d.csv"
    csv_path.write_text('text,label\n"a, b",1\nc,2\n', encoding="utf-8")
    table = load_table(str(csv_path))
    assert table.row(0) == {"text": "a, b", "label": "1"}
    pq_path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["a, b", "c"], "label": [1, 2]}), pq_path)
    ptable = load_table(str(pq_path))
    assert ptable.row(1) == {"text": "c", "label": 2}
    assert ptable.row_hashes() == [
        row_sha256({"text": "a, b", "label": 1}),
        row_sha256({"text": "c", "label": 2}),
    ]
    assert ptable.file_sha256 == sha256_file(pq_path)


def test_factorize_keeps_json_distinct_values_apart() -> None:
    """1, 1.0 and True are one value to Python but three to JSON, so three classes."""
    uniques, codes = factorize([1, 1.0, True, 1, [1], [1]])
    assert len(uniques) == 4
    assert codes.tolist()[0] == codes.tolist()[3] and codes.tolist()[4] == codes.tolist()[5]
    floats, fcodes = factorize(np.array([0.0, -0.0, np.nan, np.nan]))
    assert len(floats) == 3 and fcodes[2] == fcodes[3]


@pytest.mark.parametrize(
    "column",
    [
        np.array([3, 1, 3, 2, 1], dtype=np.int64),
        np.array([3.5, 1.0, 3.5, 2.0, 1.0]),
        ["x", "y", "x", "z", "y"],
    ],
    ids=["int", "float", "str"],
)
def test_one_column_fast_hashes_equal_per_row_definition(column: object) -> None:
    """Hashing distinct values once and gathering gives exactly the per-row hashes."""
    table = table_from_columns({"c": column})  # type: ignore[dict-item]
    expected = [row_sha256({"c": table.row(i)["c"]}) for i in range(table.n_rows)]
    assert table.row_hashes() == expected


def test_multi_column_hashes_and_memory_identity() -> None:
    """Multi-column rows hash by definition; an in-memory table's sha256 is its row-hash encoding's."""
    table = table_from_columns({"a": np.array([1, 1, 2]), "b": ["x", "x", "y"]})
    assert table.row_hashes() == [row_sha256({"a": 1, "b": "x"})] * 2 + [row_sha256({"a": 2, "b": "y"})]
    assert table.file_sha256 == hashlib.sha256(table.row_hash_table().to_bytes()).hexdigest()


def test_row_hash_encoding_round_trip() -> None:
    """The sidecar layout parses back to the same hashes; a truncated file is refused."""
    hashes = RowHashes.from_hex([row_sha256({"i": i % 3}) for i in range(10)])
    data = hashes.to_bytes()
    again = RowHashes.from_bytes(data, source="x")
    assert again.hex_list() == hashes.hex_list()
    with pytest.raises(InputError, match="does not match its header"):
        RowHashes.from_bytes(data[:-1], source="x")


def test_dataset_table_matches_memory_table() -> None:
    """A datasets.Dataset (after select) hashes like the same rows in memory."""
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"a": [1, 2, 3], "b": ["x", "y", "z"]}).select([2, 0])
    table = table_from_dataset(ds)
    assert table.row(0) == {"a": 3, "b": "z"}
    same = table_from_columns({"a": np.array([3, 1]), "b": ["z", "x"]})
    assert table.file_sha256 == same.file_sha256


def test_builtin_chatterbot_rows() -> None:
    """The embedded corpus: 2,026 rows, 21 categories, one with a single row, stable identity."""
    table = load_table("builtin:chatterbot-en")
    assert table.n_rows == 2026 and table.columns == ["prompt", "response", "category"]
    counts: dict[str, int] = {}
    for value in table.column("category"):
        counts[value] = counts.get(value, 0) + 1
    assert len(counts) == 21 and counts["health"] == 1 and counts["tech_support"] == 1050
    assert table.row(0)["category"] == "ai" and table.row(0)["prompt"] == "What is AI?"
    bingo = [table.row(i) for i in range(table.n_rows) if "two little ducks" in table.row(i)["prompt"]]
    assert [r["response"] for r in bingo] == ["22"]
    assert load_table("builtin:chatterbot-en").file_sha256 == table.file_sha256


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ('{"a": 1}\n{"a": 2,\n', r"line 2 is not valid JSON"),
        ('{"a": 1}\n[1, 2]\n', r"line 2 is a JSON list"),
        ('{"a": 1}\n{"a": 2, "a": 3}\n', r"line 2 gives key 'a' twice"),
        ('{"a": 1}\n{"a": {"b": 1, "b": 2}}\n', r"line 2 gives key 'b' twice"),
    ],
    ids=["malformed", "not-object", "repeated-key", "repeated-nested-key"],
)
def test_bad_jsonl_names_line(tmp_path: Path, content: str, match: str) -> None:
    """A bad JSONL line is reported with its number and the file."""
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match=match) as info:
        load_table(str(path))
    assert info.value.source is not None and info.value.source.startswith(f"{path}:2")


def test_a_jsonl_byte_order_mark_is_no_content_and_keys_with_colons_are_kept(tmp_path: Path) -> None:
    """A BOM before line 1 (Notepad's) is read as CSV's is, not refused as bad JSON; the file's
    sha256 still covers it. A value holding '":' and spaced colons are not repeated keys."""
    (tmp_path / "plain.jsonl").write_bytes(b'{"a": "x"}\n{"a": "y"}\n')
    (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"a": "x"}\n{"a": "y"}\n')
    plain, bom = (load_table(str(tmp_path / f"{n}.jsonl")) for n in ("plain", "bom"))
    assert bom.row_hash_table().sha256() == plain.row_hash_table().sha256()
    assert bom.file_sha256 != plain.file_sha256
    (tmp_path / "colons.jsonl").write_text('{"a" : "say \\": hi", "b":{"c" :1}}\n', encoding="utf-8")
    assert load_table(str(tmp_path / "colons.jsonl")).row(0) == {"a": 'say ": hi', "b": {"c": 1}}


def test_bad_sources(tmp_path: Path) -> None:
    """Missing file, unknown extension, unknown format, unknown builtin, ragged CSV: InputError."""
    with pytest.raises(InputError, match="does not exist"):
        load_table(str(tmp_path / "nope.jsonl"))
    (tmp_path / "d.txt").write_text("x", encoding="utf-8")
    with pytest.raises(InputError, match="cannot tell the format"):
        load_table(str(tmp_path / "d.txt"))
    with pytest.raises(InputError, match="unknown data format 'xml'"):
        load_table(str(tmp_path / "d.txt"), format="xml")
    with pytest.raises(InputError, match="unknown builtin"):
        load_table("builtin:nope")
    (tmp_path / "r.csv").write_text("a,b\n1\n", encoding="utf-8")
    with pytest.raises(InputError, match="line 2 has 1 fields"):
        load_table(str(tmp_path / "r.csv"))
    (tmp_path / "blank.csv").write_text("\na,b\n1,2\n", encoding="utf-8")
    with pytest.raises(InputError, match="line 1, the header, is empty"):
        load_table(str(tmp_path / "blank.csv"))
    (tmp_path / "empty.jsonl").write_text("{}\n{}\n", encoding="utf-8")
    with pytest.raises(InputError, match="every one of the 2 rows is an empty object"):
        load_table(str(tmp_path / "empty.jsonl"))


@pytest.mark.parametrize(
    ("value", "said"),
    [(None, "missing"), (3, "a number (3), not text"), (2.5, "a number (2.5), not text"),
     (True, "a boolean (true), not text"), (["p"], "a list, not text"), ({"a": 1}, "an object, not text")],
)  # fmt: skip
def test_not_text_names_the_json_kind(value: object, said: str) -> None:
    """A field that should hold text is described in JSON's words ("a number", never "a int")."""
    assert not_text(value) == said


@pytest.mark.parametrize(("split", "at_end"), [("train", False), ("test", True)])
def test_a_non_text_row_the_run_reads_is_refused_naming_field_row_and_split(split: str, at_end: bool) -> None:
    """The run refuses, before training, a row it will read whose response is not text: a train
    row, and with eval.generate_at_end a test row (the eval at the end failed after training); the
    row is named once (in the location), the split in the message."""
    from reprotune._config.loading import config_from_dict
    from reprotune._data.split import split_table
    from reprotune._train.data import _check_text_fields

    prompts = [f"p{i}" for i in range(20)]
    manifest = split_table(table_from_columns({"prompt": prompts, "response": prompts}), seed=0)
    row = int(manifest.indices[split][0])
    responses: list[object] = [f"r{i}" for i in range(20)]
    responses[row] = 7
    table = table_from_columns({"prompt": prompts, "response": responses})
    if split == "test":  # without the eval at the end, the run never reads a test row
        _check_text_fields(table, manifest, config_from_dict({}))
    with pytest.raises(InputError) as caught:
        _check_text_fields(table, manifest, config_from_dict({"eval": {"generate_at_end": at_end}}))
    assert caught.value.message == f"field 'response' is a number (7), not text (a {split} row)"
    assert caught.value.source == f"memory, row {row}"
