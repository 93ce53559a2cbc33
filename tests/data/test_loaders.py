"""Tests for reprotune._data.loaders: CSV lines counted at \\n only, as editors count them."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprotune._cli import main
from reprotune._data.loaders import MAX_CSV_FIELD, load_table
from reprotune._errors import InputError


def test_a_bare_carriage_return_inside_a_quoted_field_is_kept(tmp_path: Path) -> None:
    """A ``\\r`` inside quotes is part of the value, as Python's csv reads it (before, the csv
    module's line count took it for a line end, and the file was refused: "the quote opened on
    line 4 is never closed", in a file of three lines)."""
    path = tmp_path / "crbug.csv"
    path.write_bytes(b'text,label\n"Hello\rWorld",a\n"ends with newline\n",b\n')
    table = load_table(str(path))
    assert [table.row(i) for i in range(table.n_rows)] == [
        {"text": "Hello\rWorld", "label": "a"},
        {"text": "ends with newline\n", "label": "b"},
    ]


@pytest.mark.parametrize(
    ("content", "line", "message"),
    [
        (b'a,b\n"x\ry",2\n4,5\n6\n', 4, "line 4 has 1 fields; the header has 2"),
        (b'a,b\n"x\ry",2\n4,"5\n6\n', 3, "the quote opened on line 3 is never closed"),
        (
            b'a,b\n"x\ry",2\n4,' + b"5" * (MAX_CSV_FIELD + 1) + b"\n",
            3,
            f"line 3 has a field over {MAX_CSV_FIELD}",
        ),
    ],
    ids=["fields", "unclosed-quote", "field-limit"],
)
def test_an_error_names_the_line_counted_at_newlines(
    tmp_path: Path, content: bytes, line: int, message: str
) -> None:
    """After a quoted ``\\r``, an error names the line an editor shows (before, one line later)."""
    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    with pytest.raises(InputError) as info:
        load_table(str(path))
    assert info.value.source == f"{path}:{line}" and message in info.value.message


def test_old_mac_line_ends_still_read(tmp_path: Path) -> None:
    """A file whose lines end with a bare ``\\r`` (old Mac exports) is rows, as before."""
    path = tmp_path / "mac.csv"
    path.write_bytes(b"a,b\r1,2\r3,4\r")
    table = load_table(str(path))
    assert [table.row(i) for i in range(table.n_rows)] == [{"a": "1", "b": "2"}, {"a": "3", "b": "4"}]


def test_the_cli_refuses_naming_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``reprotune split`` exits 2 naming file:line and writes nothing."""
    path, out = tmp_path / "bad.csv", tmp_path / "x.json"
    path.write_bytes(b'a,b\n"x\ry",2\n4,5\n6\n')
    assert main(["split", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: {path}:4: line 4 has 1 fields; the header has 2\nfix: quote fields" in err
    assert not out.exists()
