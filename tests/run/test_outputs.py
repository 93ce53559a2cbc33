"""``removed_if_refused``: a command refused after it began writing its output leaves nothing of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprotune._errors import InputError, RunFailedError
from reprotune._run.outputs import removed_if_refused


def test_a_refusal_removes_the_directories_it_made(tmp_path: Path) -> None:
    out = tmp_path / "new" / "out"
    with pytest.raises(InputError), removed_if_refused(out):
        out.mkdir(parents=True)
        (out / "verify.log").write_text("the script's output")
        raise InputError("refused", source="--out", fix="-")
    assert list(tmp_path.iterdir()) == []


def test_a_refusal_in_a_directory_that_was_there_removes_only_what_it_added(tmp_path: Path) -> None:
    (tmp_path / "kept.txt").write_text("the user's")
    with pytest.raises(InputError), removed_if_refused(tmp_path):
        (tmp_path / "leg").mkdir()
        (tmp_path / "verify.log").write_text("ours")
        raise InputError("refused", source="--out", fix="-")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.txt"]


def test_a_failure_that_is_not_a_refusal_keeps_what_was_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(RunFailedError), removed_if_refused(out):
        out.mkdir()
        (out / "verify.log").write_text("why it failed")
        raise RunFailedError("the leg failed", source="verify.log", fix="-")
    assert (out / "verify.log").read_text() == "why it failed"
