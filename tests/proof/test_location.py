"""A run's identity does not depend on where the project lives: move a project and run again
(IDENTICAL, same config hash, same bytes in every output file), and rerun a moved run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from reprotune._config.loading import load_config
from reprotune._config.schema import config_sha256
from reprotune._proof.compare import compare_runs
from tinyrun import TinyProject


def _record(run_dir: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((run_dir / "record.json").read_text(encoding="utf-8"))


def test_moved_project_runs_identically(tmp_path: Path) -> None:
    """The same project run from two places: same config sha256, IDENTICAL, byte-identical ledger,
    split manifest and adapter files; the only recorded differences are paths, all inert."""
    project = TinyProject.create(tmp_path / "here" / "project")
    project.config("cfg.yaml", train={"max_steps": 4, "save_every": 2, "eval_every": 2})
    project.run_cli("run", "cfg.yaml", "--run-dir", "runs/first", "--no-progress")
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    shutil.move(str(project.root), moved)
    project = TinyProject(moved)
    project.run_cli("run", "cfg.yaml", "--run-dir", "runs/second", "--no-progress")

    first, second = moved / "runs" / "first", moved / "runs" / "second"
    a, b = _record(first), _record(second)
    assert a["config_sha256"] == b["config_sha256"] == config_sha256(load_config(moved / "cfg.yaml"))
    assert a["config"]["data"]["path"] == "data.jsonl" and a["config"]["model"]["name"] == "tiny-model"
    assert a["config"]["config_dir"] == str((tmp_path / "here" / "project").resolve())
    assert b["config"]["config_dir"] == str(moved.resolve())
    for name in (
        "ledger.jsonl",
        "split.json",
        "adapter/adapter_config.json",
        "adapter/adapter_model.safetensors",
    ):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    result = compare_runs(first, second)
    assert str(result.verdict) == "IDENTICAL"
    assert result.differences and all(d.inert for d in result.differences), [
        d.key for d in result.differences if not d.inert
    ]


def test_rerun_of_a_moved_run_finds_its_data(tmp_path: Path) -> None:
    """A run made in one place, its whole project moved: `rerun` resolves the data in the new place
    and reproduces the run IDENTICAL."""
    project = TinyProject.create(tmp_path / "old")
    project.config("cfg.yaml", train={"max_steps": 3, "save_every": 0, "eval_every": 3})
    project.run_cli("run", "cfg.yaml", "--run-dir", "runs/r", "--no-progress")
    moved = tmp_path / "new"
    shutil.move(str(project.root), moved)
    done = TinyProject(moved).run_cli("rerun", "runs/r", "--no-progress")
    assert "IDENTICAL" in done.stdout
    assert (moved / "runs" / "r-rerun" / "ledger.jsonl").read_bytes() == (
        moved / "runs" / "r" / "ledger.jsonl"
    ).read_bytes()
