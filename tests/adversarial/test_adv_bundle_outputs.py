"""Issue 24, data loss first: a refused ``rerun BUNDLE`` removes only what it created, a rerun never
writes into an existing run directory, and ``pack -o`` never writes over its inputs or into a run
directory. Every refusal leaves the file tree byte for byte as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from adv_support import file_tree

from reprotune._cli import main
from tinyrun import TinyProject


@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> tuple[TinyProject, Path]:
    """A completed tiny run (with a checkpoint) and its bundle without data, packed beside it."""
    project = TinyProject.create(tmp_path_factory.mktemp("bundle-outputs"))
    project.config("cfg.yaml", train={"max_steps": 4, "save_every": 2, "eval_every": 4})
    project.run_cli("run", "cfg.yaml", "--run-dir", "runs/r", "--no-progress", "--no-tracking")
    project.run_cli("pack", "runs/r", "-o", "runs/r.tar.gz")
    return project, project.root / "runs" / "r.tar.gz"


def test_a_refused_rerun_keeps_an_existing_out_directory(
    bundled: tuple[TinyProject, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--out an existing directory with files in it (as `--out .` is): refused, every file kept."""
    _, bundle = bundled
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    before = file_tree(tmp_path)
    assert main(["rerun", str(bundle), "--out", str(mine), "--no-progress"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert file_tree(tmp_path) == before


def test_a_rerun_never_writes_into_the_original_run(
    bundled: tuple[TinyProject, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--out naming the run directory the bundle came from (checkpoints and all): refused before
    anything is read or written; the run keeps every byte."""
    project, bundle = bundled
    run = project.root / "runs" / "r"
    before = file_tree(run)
    assert main(["rerun", str(bundle), "--out", str(run), "--no-progress"]) == 2
    assert "is a run directory" in capsys.readouterr().err
    assert file_tree(run) == before


def test_a_refusal_removes_only_what_this_rerun_created(
    bundled: tuple[TinyProject, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --data for a bundle without data: an empty --out given by the user stays (empty), a new
    one is removed again; nothing else changes."""
    _, bundle = bundled
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["rerun", str(bundle), "--out", str(empty), "--no-progress"]) == 2
    assert "--data PATH" in capsys.readouterr().err
    assert empty.is_dir() and list(empty.iterdir()) == []
    new = tmp_path / "new" / "deeper"
    assert main(["rerun", str(bundle), "--out", str(new), "--no-progress"]) == 2
    assert not new.exists() and not (tmp_path / "new").exists()


def test_the_default_out_never_lands_on_the_original_run(
    bundled: tuple[TinyProject, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`reprotune rerun runs/r.tar.gz` from the project, where runs/r is the run it was packed from:
    the default --out is a new directory beside it, and its refusal (no data) touches nothing."""
    project, _ = bundled
    monkeypatch.chdir(project.root)
    before = file_tree(project.root / "runs")
    assert main(["rerun", "runs/r.tar.gz", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--data PATH" in err
    assert file_tree(project.root / "runs") == before


@pytest.mark.parametrize("target", ["data.jsonl", "runs/other/record.json", "runs/r/adapter/x.tar.gz"])
def test_pack_never_writes_over_its_inputs_or_into_a_run(
    bundled: tuple[TinyProject, Path], target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pack -o` over the data it packs, onto another run's record, or inside the run it packs:
    exit 2, every file as it was."""
    project, _ = bundled
    other = project.root / "runs" / "other"
    if not other.exists():
        project.run_cli("run", "cfg.yaml", "--run-dir", "runs/other", "--no-progress", "--no-tracking")
    before = file_tree(project.root)
    code = main(["pack", str(project.root / "runs" / "r"), "-o", str(project.root / target), "--with-data"])
    assert code == 2
    err = capsys.readouterr().err
    assert "writing it would destroy what it holds" in err or "inside the run directory" in err, err
    assert file_tree(project.root) == before
    assert os.path.isfile(project.root / "data.jsonl")


@pytest.mark.parametrize("target", ["data.jsonl", "cfg.yaml"])
def test_pack_never_replaces_a_file_that_is_not_a_bundle(
    bundled: tuple[TinyProject, Path], target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pack -o data.jsonl` without --with-data (the data is then not an input) or onto the config:
    exit 2, the file keeps every byte; `pack -o` onto the run's earlier bundle replaces it, with
    the same bytes (a run packs deterministically)."""
    project, bundle = bundled
    before = file_tree(project.root)
    assert main(["pack", str(project.root / "runs" / "r"), "-o", str(project.root / target)]) == 2
    assert "exists and is not a reprotune bundle" in capsys.readouterr().err
    assert file_tree(project.root) == before
    packed = bundle.read_bytes()
    assert main(["pack", str(project.root / "runs" / "r"), "-o", str(bundle)]) == 0
    assert bundle.read_bytes() == packed
