"""The processes of verify's legs (reprotune._proof.processes): side by side, each logged whole
in the order started, a failure named with its own output; one at a time, nothing runs after a
failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprotune._errors import RunFailedError
from reprotune._proof.processes import LegProcesses


def test_side_by_side_logs_in_order_and_reports_the_failing_one(tmp_path: Path) -> None:
    log = tmp_path / "verify.log"
    log.write_text("earlier leg\n")
    missing = tmp_path / "missing.yaml"
    # Neither command trains, so neither takes a turn; --train-lock is still accepted.
    with pytest.raises(RunFailedError) as caught, LegProcesses(log, together=True) as processes:
        failing = processes.start(["run", str(missing)])
        processes.start(["run", str(tmp_path / "other.yaml")])
        processes.wait(failing)
    message = str(caught.value)
    assert f"`reprotune run {missing}` failed with exit code 2" in message
    assert "missing.yaml" in message.split("\n", 1)[1]  # the failing process's own output
    text = log.read_text()
    assert text.startswith("earlier leg\n")  # appended, never overwritten
    assert text.index(f"reprotune run {missing}") < text.index("other.yaml")  # whole, in order
    assert [p.name for p in tmp_path.iterdir()] == ["verify.log"]  # no part log, no lock left


def test_a_failure_not_waited_for_still_raises(tmp_path: Path) -> None:
    log = tmp_path / "verify.log"
    with (
        pytest.raises(RunFailedError, match=r"never-waited\.yaml"),
        LegProcesses(log, together=True) as processes,
    ):
        processes.start(["--version"])
        processes.start(["run", str(tmp_path / "never-waited.yaml")])
    assert "reprotune 0." in log.read_text()


def test_one_at_a_time_runs_nothing_after_a_failure(tmp_path: Path) -> None:
    log = tmp_path / "verify.log"
    missing = tmp_path / "missing.yaml"
    with pytest.raises(RunFailedError, match="missing"), LegProcesses(log, together=False) as processes:
        processes.start(["run", str(missing)])
        processes.start(["--version"])
    text = log.read_text()
    assert f"reprotune run {missing}" in text and "--version" not in text
    assert [p.name for p in tmp_path.iterdir()] == ["verify.log"]
