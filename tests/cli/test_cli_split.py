"""Tests for `reprotune split` and `reprotune check-split` through reprotune._cli.main."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reprotune._cli import main
from reprotune._jsonio import canonical_dumps

ROWS = [{"prompt": f"p{i}", "response": f"r{i}", "category": "a" if i % 3 else "b"} for i in range(30)]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return path


def test_split_then_check(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """split writes the manifest and a summary; check-split of the same data exits 0."""
    out = tmp_path / "split.json"
    assert main(["split", str(data), "--stratify-by", "category", "--seed", "7", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "stratified split by 'category'" in printed and f"wrote {out}" in printed
    assert json.loads(out.read_text())["seed"] == 7
    assert main(["check-split", str(out), str(data)]) == 0
    assert capsys.readouterr().out.startswith("identical")
    assert main(["check-split", str(data), str(out)]) == 2  # the other way round: said so, with the fix
    err = capsys.readouterr().err
    assert f"{data} is the split manifest" not in err
    assert f"{out} is the split manifest and {data} is not: the arguments are the other way round" in err
    assert f"fix: reprotune check-split {out} {data}" in err


def test_check_split_reports_edit_and_leak(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An edited row exits 1 naming the row; --fail-on-leak exits 1 on leaked text."""
    out = tmp_path / "split.json"
    main(["split", str(data), "--seed", "1", "--out", str(out)])
    rows = [dict(r) for r in ROWS]
    rows[4]["response"] = "edited"
    changed = tmp_path / "changed.jsonl"
    changed.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    capsys.readouterr()
    assert main(["check-split", str(out), str(changed)]) == 1
    assert "edited  row 4" in capsys.readouterr().out
    leaky = tmp_path / "leaky.jsonl"
    leaky.write_text("".join(json.dumps({"t": "Same text!"}) + "\n" for _ in range(20)), encoding="utf-8")
    main(["split", str(leaky), "--out", str(tmp_path / "l.json")])
    assert main(["check-split", str(tmp_path / "l.json"), str(leaky)]) == 0
    assert main(["check-split", str(tmp_path / "l.json"), str(leaky), "--fail-on-leak"]) == 1
    assert main(["check-split", str(tmp_path / "l.json"), str(leaky), "--json"]) == 0
    assert "leakage train/validation: 1 text(s)" in capsys.readouterr().out
    words = tmp_path / "words.jsonl"  # one-word values only (labels): no free text to compare
    words.write_text("".join(json.dumps({"t": f"w{i % 3}"}) + "\n" for i in range(20)), encoding="utf-8")
    main(["split", str(words), "--out", str(tmp_path / "w.json")])
    assert main(["check-split", str(tmp_path / "w.json"), str(words)]) == 0
    assert "leakage: not checked" in capsys.readouterr().out
    assert main(["check-split", str(tmp_path / "w.json"), str(words), "--fail-on-leak"]) == 2
    assert "--fail-on-leak: the data has no column of free text" in capsys.readouterr().err


def test_builtin_rare_class_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The embedded corpus splits by category; the 1-row class is kept in train with a warning."""
    out = tmp_path / "s.json"
    assert main(["split", "builtin:chatterbot-en", "--stratify-by", "category", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert (
        "warning: 1 class(es) of 'category' too small for every split, kept in train only: 'health' (1 row)"
        in err
    )
    obj = json.loads(out.read_text())
    assert obj["rare_classes"] == [{"decision": "train", "n_rows": 1, "value": "health"}]
    assert obj["dataset"]["n_rows"] == 2026 and len(obj["row_hashes"]["inline"]) == 2026


def bad_jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": \n', encoding="utf-8")
    return path


def empty_jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    return path


def nested_nan_jsonl(tmp_path: Path) -> Path:
    """Rows whose class is a list holding NaN in row 1 (JSONL's NaN extension, as Python writes it)."""
    path = tmp_path / "nan.jsonl"
    path.write_text('{"t":"a","c":[1]}\n{"t":"b","c":[NaN]}\n{"t":"c","c":[1]}\n', encoding="utf-8")
    return path


def duration_parquet(tmp_path: Path) -> Path:
    """A Parquet file with a duration column (timedelta values: no JSON form to hash)."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "dur.parquet"
    took = [datetime.timedelta(seconds=s) for s in (1, 2, 3, 4)]
    pq.write_table(pa.table({"t": ["a", "b", "c", "d"], "took": pa.array(took)}), path)
    return path


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (lambda t, d: [str(t / "missing.jsonl")], ["missing.jsonl' does not exist", "fix:"]),
        (lambda t, d: [str(d), "--format", "csv"], ["format 'csv' was asked for", "says jsonl", "auto"]),
        (lambda t, d: [str(bad_jsonl(t))], ["line 3 is not valid JSON", "bad.jsonl:3:"]),
        (
            lambda t, d: [str(d), "--stratify-by", "label"],
            ["column 'label' (given by --stratify-by) does not exist", "['prompt', 'response', 'category']"],
        ),
        (
            lambda t, d: [str(d), "--group-by", "thread"],
            ["column 'thread' (given by --group-by)", "'prompt'"],
        ),
        (lambda t, d: [str(d), "--ratios", "0.9,0.2,-0.1"], ["test ratio -0.1 is negative", "--ratios"]),
        (lambda t, d: [str(d), "--ratios", "0.8,0.1,0.2"], ["sum to 1.1", "not 1", "--ratios"]),
        (lambda t, d: [str(d), "--ratios", "0.8,x,0.1"], ["ratio 'x'", "not a number"]),
        (lambda t, d: [str(d), "--seed", "-1"], ["seed '-1' is not a non-negative integer", "--seed"]),
        (lambda t, d: [str(d), "--seed", "1.5"], ["seed '1.5' is not a non-negative integer"]),
        (lambda t, d: [str(empty_jsonl(t))], ["the dataset has no rows", "empty.jsonl"]),
        (
            lambda t, d: ["builtin:chatterbot-en", "--format", "parquet"],
            ["format 'parquet' was asked for builtin:chatterbot-en", "leave the format as auto"],
        ),
        (
            lambda t, d: [str(nested_nan_jsonl(t)), "--stratify-by", "c"],
            ["nan.jsonl, column 'c'", "[[nan]] in 1 row(s), first row 1", "give those rows a class"],
        ),
        (
            lambda t, d: [str(duration_parquet(t))],
            ["dur.parquet, column 'took'", "timedelta", "first in row 0", "cast it to text or a number"],
        ),
    ],
    ids=[
        "missing-file",
        "format-not-the-extensions",
        "malformed-jsonl",
        "stratify-missing",
        "group-missing",
        "ratio-negative",
        "ratio-sum",
        "ratio-nan",
        "seed-negative",
        "seed-float",
        "empty",
        "builtin-with-a-format",
        "class-holding-nan",
        "parquet-duration",
    ],
)
def test_split_bad_input_exits_2(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str], args: object, expected: list[str]
) -> None:
    """Each bad input exits 2 with one message naming value, source and fix; no manifest is left."""
    out = tmp_path / "out" / "split.json"
    argv = ["split", *args(tmp_path, data), "--out", str(out)]  # type: ignore[operator]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("reprotune split: error:")
    for text in expected:
        assert text in err
    assert "fix:" in err and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("column", "written"),
    [
        ("day", ["2020-01-01", "2021-06-30"]),
        ("blob", [{"$bytes": "eA=="}, {"$bytes": "eQ=="}]),
        ("price", ["1.50", "2.25"]),
    ],
    ids=["date", "binary", "decimal"],
)
def test_parquet_classes_outside_json_are_written_as_their_canonical_form(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], column: str, written: list[object]
) -> None:
    """A Parquet date, binary or Decimal column stratified by: the manifest holds each class as the
    row hashes see it (ISO text, base64, the decimal's text), and loads again (before: a TypeError,
    exit 1, "not JSON serializable")."""
    import datetime
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "typed.parquet"
    values = {
        "day": [datetime.date(2020, 1, 1), datetime.date(2021, 6, 30)],
        "blob": [b"x", b"y"],
        "price": [decimal.Decimal("1.50"), decimal.Decimal("2.25")],
    }[column]
    rows = 20
    pq.write_table(
        pa.table({"t": [f"r{i}" for i in range(rows)], column: [values[i % 2] for i in range(rows)]}), data
    )
    out = tmp_path / "split.json"
    assert main(["split", str(data), "--stratify-by", column, "--out", str(out)]) == 0, (
        capsys.readouterr().err
    )
    classes = json.loads(out.read_text())["classes"]
    assert [c["value"] for c in classes] == written and [c["n_rows"] for c in classes] == [10, 10]
    assert main(["check-split", str(out), str(data)]) == 0


def test_a_negative_zero_ratio_is_recorded_as_zero(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--ratios -0,1,0`: the manifest and the summary say 0, not -0 (a negative share)."""
    out = tmp_path / "split.json"
    assert main(["split", str(data), "--ratios=-0,1,0", "--out", str(out)]) == 0
    assert "ratios 0/1/0" in capsys.readouterr().out
    assert '"train": 0.0' in out.read_text()
    assert json.loads(out.read_text())["ratios"] == {"train": 0.0, "validation": 1.0, "test": 0.0}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", ["manifest is not valid JSON", "(line 1, column 2)"]),
        (None, ["schema_version 7 is not supported", "schema_version"]),
    ],
    ids=["not-json", "unknown-version"],
)
def test_check_split_bad_manifest_exits_2(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str], content: str | None, expected: list[str]
) -> None:
    """A manifest that is not JSON, or of an unknown schema version, exits 2 with the fix."""
    manifest = tmp_path / "m.json"
    main(["split", str(data), "--out", str(manifest)])
    if content is None:
        obj = json.loads(manifest.read_text())
        obj["schema_version"] = 7
        content = canonical_dumps(obj)
    manifest.write_text(content, encoding="utf-8")
    capsys.readouterr()
    assert main(["check-split", str(manifest), str(data)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reprotune check-split: error:") and "fix:" in err
    for text in expected:
        assert text in err


def test_split_does_not_import_torch(tmp_path: Path, data: Path) -> None:
    """`python -m reprotune split` and check-split never import torch (checked with -X importtime)."""
    out = tmp_path / "s.json"
    for argv in (["split", str(data), "--out", str(out)], ["check-split", str(out), str(data)]):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "reprotune", *argv],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        modules = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line]
        assert "numpy" in modules  # the log is real
        assert not [m for m in modules if m == "torch" or m.startswith("torch.")]


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path, data: Path) -> None:
    """stdout closed before the command writes (`reprotune check-split ... | true`): exit 141 as a
    shell's SIGPIPE, no traceback and no 'internal error' (it was a traceback and exit 1, the
    code of a real finding)."""
    out = tmp_path / "s.json"
    assert main(["split", str(data), "--out", str(out)]) == 0
    command = [sys.executable, "-m", "reprotune", "check-split", str(out), str(data)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the command starts writing
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141
    assert "Traceback" not in err and "internal error" not in err


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        # it listed one row and '... and 3 more' of 2 changes
        ("--max-rows", "-1", "--max-rows must be 0 or more (got -1)"),
        # it fell back to every text column, as if not given
        ("--leak-columns", " , ", "--leak-columns ' , ' names no column"),
    ],
    ids=["negative-max-rows", "no-leak-column"],
)
def test_check_split_refuses_an_option_value_that_means_nothing(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, expected: str
) -> None:
    """--max-rows -1, --leak-columns "" (or ","): exit 2 naming the value, with the fix."""
    manifest = tmp_path / "m.json"
    assert main(["split", str(data), "--out", str(manifest)]) == 0
    capsys.readouterr()
    assert main(["check-split", str(manifest), str(data), option, value]) == 2
    err = capsys.readouterr().err
    assert expected in err and "fix:" in err


@pytest.mark.parametrize(
    ("option", "value", "choices"),
    [
        ("--format", "xml", "'auto', 'jsonl', 'csv', 'parquet'"),
        ("--rare-class-policy", "Train", "'train', 'drop', 'error'"),
    ],
)
def test_split_names_the_choices_of_a_closed_option(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, choices: str
) -> None:
    """A value outside a closed option's choices is a usage error (exit 2) naming the option as the
    user typed it and every choice (it named the internal key 'rare_class_policy')."""
    out = tmp_path / "m.json"
    assert main(["split", str(data), "--out", str(out), option, value]) == 2
    err = capsys.readouterr().err
    assert f"argument {option}: invalid choice: '{value}' (choose from {choices})" in err
    assert not out.exists()


def test_the_cli_choices_are_the_data_modules_own() -> None:
    """The CLI spells the formats and policies without importing NumPy; they must stay the same."""
    from reprotune._cli._options import DATA_FORMATS, RARE_CLASS_POLICIES
    from reprotune._data.loaders import FORMATS
    from reprotune._data.split_options import RARE_POLICIES

    assert (DATA_FORMATS, RARE_CLASS_POLICIES) == (FORMATS, RARE_POLICIES)


def test_an_out_that_is_a_link_or_a_pipe_is_refused_and_left_as_it_was(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The manifest is written beside ``--out`` and renamed over it: a symbolic link was replaced
    by a file (its target, the manifest meant, left as it was, exit 0), and a pipe or a device
    node by a plain file (``/dev/null`` as root). Each is refused now, naming what it is."""
    import os
    import stat

    shared = tmp_path / "shared.json"
    assert main(["split", str(data), "--seed", "1", "--out", str(shared)]) == 0
    before = shared.read_bytes()
    link = tmp_path / "link.json"
    link.symlink_to(shared)
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    capsys.readouterr()

    assert main(["split", str(data), "--seed", "2", "--out", str(link)]) == 2
    err = capsys.readouterr().err
    assert f"--out {str(link)!r} is a symbolic link (to {shared})" in err
    assert f"fix: give --out the file itself ({shared}) or a new path" in err
    assert link.is_symlink() and shared.read_bytes() == before

    assert main(["split", str(data), "--seed", "2", "--out", str(pipe)]) == 2
    assert f"--out {str(pipe)!r} is a pipe, not a file" in capsys.readouterr().err
    assert stat.S_ISFIFO(pipe.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "link.json", "pipe", "shared.json"]
