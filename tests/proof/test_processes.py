"""The processes of verify's legs (reprotune._proof.processes): several at once, each logged whole,
in the order given, and a failure that names its command and shows its own output."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprotune._errors import RunFailedError
from reprotune._proof.processes import run_together


def test_processes_side_by_side_log_in_order_and_report_the_failing_one(tmp_path: Path) -> None:
    log = tmp_path / "verify.log"
    log.write_text("earlier leg\n")
    missing = tmp_path / "missing.yaml"
    with pytest.raises(RunFailedError) as caught:
        run_together([["run", str(missing)], ["--version"]], log)
    message = str(caught.value)
    assert f"`reprotune run {missing}` failed with exit code 2" in message
    assert "missing.yaml" in message.split("\n", 1)[1]  # the failing process's own output
    text = log.read_text()
    assert text.startswith("earlier leg\n")  # appended, never overwritten
    run_at, version_at = text.index(f"reprotune run {missing}"), text.index("reprotune --version")
    assert run_at < version_at and "reprotune 0." in text[version_at:]  # whole, in the order given
    assert [p.name for p in tmp_path.iterdir()] == ["verify.log"]  # no per-process log left


def test_processes_side_by_side_give_each_its_own_wall_time(tmp_path: Path) -> None:
    walls = run_together([["--version"], ["--help"]], tmp_path / "verify.log")
    assert len(walls) == 2 and all(wall > 0 for wall in walls)
