"""An error about a config value names the config key, the file, its line and column, and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reprotune._cli import main


def test_wrong_stratify_column_in_the_file_is_located(
    tiny_project: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """split.stratify_by set in the config to a column the data lacks: exit 2, the message names
    the key, the config file with line and column, the columns there are; not a CLI option."""
    config = tmp_path / "cfg.yaml"
    config.write_text(
        f"data:\n  path: {tiny_project.root / 'data.jsonl'}\n"
        f"model:\n  name: {tiny_project.root / 'tiny-model'}\n"
        "split:\n  stratify_by: categroy\ntracking:\n  mlflow: false\n"
    )
    assert main(["run", str(config), "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{config}, line 6, column 16 (key split.stratify_by): " in err
    assert "split.stratify_by names column 'categroy' (did you mean 'category'?)" in err
    assert "fix: set split.stratify_by to one of ['category', 'prompt', 'response']" in err
    assert "--stratify-by" not in err


def test_default_value_is_said_to_be_the_default(
    tiny_project: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key the file does not set (data.response_field's default 'response') is named as such."""
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "p", "answer": "a", "category": "c"}\n' * 12)
    config = tmp_path / "cfg.yaml"
    config.write_text(
        f"data:\n  path: data.jsonl\nmodel:\n  name: {tiny_project.root / 'tiny-model'}\n"
        "tracking:\n  mlflow: false\n"
    )
    assert main(["run", str(config), "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{config} (key data.response_field, not set there: its default applies): " in err
    assert "data.response_field names column 'response'" in err


def test_doctor_refuses_a_model_folder_run_refuses(
    tiny_project: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """doctor said OK where run exits 2: a model.name folder without config.json (in the file,
    relative to it, located by line and column), and a missing absolute path given by --set
    without a config. Both exit 2 now, naming the value."""
    (tmp_path / "emptymodel").mkdir()
    config = tmp_path / "cfg.yaml"
    config.write_text(f"data:\n  path: {tiny_project.root / 'data.jsonl'}\nmodel:\n  name: emptymodel\n")
    assert main(["doctor", str(config), "--no-probe"]) == 2
    err = capsys.readouterr().err
    assert "model.name: a directory without config.json, not a Hugging Face model directory" in err
    assert "[line 4, column 9]" in err
    assert main(["doctor", "--no-probe", "--set", f"model.name={tmp_path / 'nowhere'}"]) == 2
    assert "model.name: local model directory not found" in capsys.readouterr().err


def test_doctor_locates_a_key_error_in_its_config_file(tmp_path: Path) -> None:
    """doctor's CONFIG argument is text, not a Path: a later error about a key is still located
    at its line and column (it was the bare message)."""
    import argparse

    from reprotune._cli._options import locate_config_source
    from reprotune._errors import InputError

    config = tmp_path / "cfg.yaml"
    config.write_text("train:\n  max_steps: 5\ndeterminism:\n  cpu_isa: avx2\n")
    error = InputError("avx2 cannot be put in force here", source="determinism.cpu_isa", fix="use native")
    locate_config_source(error, argparse.Namespace(config=str(config), overrides=[]))
    assert error.source == f"{config}, line 4, column 12 (key determinism.cpu_isa)"
