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
