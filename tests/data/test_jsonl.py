"""Tests for reprotune._data.jsonl: a line Python cannot read is refused naming its line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from reprotune._cli import main
from reprotune._data.loaders import load_table


def test_an_integer_too_long_to_read_is_refused_naming_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An integer of more digits than Python converts is bad input, exit 2 naming the line, the
    column and the fix (before, int()'s ValueError escaped: a traceback and exit 1); one of as
    many digits as Python reads still loads."""
    limit = sys.get_int_max_str_digits()
    path, out = tmp_path / "big.jsonl", tmp_path / "split.json"
    path.write_text(
        f'{{"p": "a", "n": {"9" * limit}}}\n{{"p": "b", "n": {{"deep": [-{"7" * (limit + 1)}]}}}}\n',
        encoding="utf-8",
    )
    assert main(["split", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        f"reprotune split: error: {path}:2: line 2, column 'n', holds an integer of more than {limit:,} "
        in err
    )
    assert "\nfix: write the number as a string (in quotes)\n" in err and "Traceback" not in err
    assert not out.exists()
    path.write_text(f'{{"p": "a", "n": {"9" * limit}}}\n', encoding="utf-8")
    assert load_table(str(path)).row(0)["n"] == int("9" * limit)
