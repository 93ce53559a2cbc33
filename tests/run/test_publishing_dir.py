"""``publishing_dir``: the one way a directory (adapter, eval, unpacked bundle, a Trainer run's
trainable weights) reaches its place: whole, or not at all, and never at the cost of the old one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reprotune._jsonio import publishing_dir


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_a_new_directory_appears_whole_with_mkdir_permissions(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "adapter"
    with publishing_dir(target, replace=False) as building:
        assert building.parent == target.parent and not target.exists()
        (building / "a.bin").write_bytes(b"a")
    assert _files(target) == {"a.bin": b"a"}
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o777 & ~umask
    assert [p.name for p in target.parent.iterdir()] == ["adapter"]  # nothing left beside it


def test_replace_swaps_the_old_directory_for_the_new(tmp_path: Path) -> None:
    target = tmp_path / "adapter"
    target.mkdir()
    (target / "old.bin").write_bytes(b"old")
    with publishing_dir(target, replace=True) as building:
        (building / "new.bin").write_bytes(b"new")
    assert _files(target) == {"new.bin": b"new"}
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]


def test_an_error_inside_leaves_the_old_directory_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "adapter"
    target.mkdir()
    (target / "old.bin").write_bytes(b"old")
    with pytest.raises(RuntimeError, match="half-way"), publishing_dir(target, replace=True) as building:
        (building / "new.bin").write_bytes(b"partial")
        raise RuntimeError("half-way")
    assert _files(target) == {"old.bin": b"old"}
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]


@pytest.mark.parametrize("empty", [True, False], ids=["empty", "full"])
def test_without_replace_an_existing_target_is_refused_and_kept(tmp_path: Path, empty: bool) -> None:
    target = tmp_path / "eval"
    target.mkdir()
    if not empty:
        (target / "mine.json").write_bytes(b"{}")
    with pytest.raises(FileExistsError), publishing_dir(target, replace=False) as building:
        (building / "new.json").write_bytes(b"[]")
    assert _files(target) == ({} if empty else {"mine.json": b"{}"})
    assert [p.name for p in tmp_path.iterdir()] == ["eval"]


def test_a_failed_rename_puts_the_old_directory_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "adapter"
    target.mkdir()
    (target / "old.bin").write_bytes(b"old")

    def refuse(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        raise OSError(5, "Input/output error")

    with pytest.raises(OSError, match="Input/output"), publishing_dir(target, replace=True) as building:
        (building / "new.bin").write_bytes(b"new")
        monkeypatch.setattr(os, "rename", refuse)
    assert _files(target) == {"old.bin": b"old"}
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]
