"""``publishing_dir`` and ``publishing_file``: the one way a directory (adapter, eval, checkpoint,
unpacked bundle, a Trainer run's trainable weights) or a file (every JSON document, a truncated
ledger, a bundle) reaches its place: whole, or not at all, and never at the cost of the old one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reprotune._jsonio import publishing_dir, publishing_file


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


# --- publishing_file: the same for one file ---------------------------------------------------


def test_a_published_file_replaces_the_old_whole_with_open_permissions(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "ledger.jsonl"
    target.parent.mkdir()
    target.write_bytes(b"old\n")
    with publishing_file(target) as handle:
        handle.write(b"new ")
        assert target.read_bytes() == b"old\n"  # a reader sees the old file until the block ends
        handle.write(b"bytes\n")
    assert target.read_bytes() == b"new bytes\n"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in target.parent.iterdir()] == ["ledger.jsonl"]


def test_an_error_while_writing_a_file_keeps_the_old_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "bundle.tar.gz"
    target.write_bytes(b"old")
    with pytest.raises(OSError, match="source gone"), publishing_file(target) as handle:
        handle.write(b"partial")
        raise FileNotFoundError(2, "source gone")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["bundle.tar.gz"]
