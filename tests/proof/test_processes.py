"""The processes of verify's legs (reprotune._proof.processes): side by side or one at a time,
each logged whole in the order started, and a failure that names its command and shows its own
output."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprotune._errors import RunFailedError
from reprotune._proof.processes import LegProcesses


@pytest.mark.parametrize("together", [True, False], ids=["side-by-side", "one-at-a-time"])
def test_leg_processes_log_in_order_and_report_the_failing_one(tmp_path: Path, together: bool) -> None:
    log = tmp_path / "verify.log"
    log.write_text("earlier leg\n")
    missing = tmp_path / "missing.yaml"
    # Neither command trains, so neither takes a turn; --train-lock is still accepted.
    first, second = ["run", str(missing)], ["run", str(tmp_path / "other.yaml")]
    with pytest.raises(RunFailedError) as caught, LegProcesses(log, together=together) as processes:
        failing, other = processes.start(first), processes.start(second)
        processes.wait(failing)
    message = str(caught.value)
    assert f"`reprotune run {missing}` failed with exit code 2" in message
    assert "missing.yaml" in message.split("\n", 1)[1]  # the failing process's own output
    text = log.read_text()
    assert text.startswith("earlier leg\n")  # appended, never overwritten
    assert text.index(f"reprotune run {missing}") < text.index("other.yaml")  # whole, in order
    assert [p.name for p in tmp_path.iterdir()] == ["verify.log"]  # no part log, no lock left
    assert other == failing + 1


def test_a_failure_not_waited_for_still_raises(tmp_path: Path) -> None:
    log = tmp_path / "verify.log"
    with (
        pytest.raises(RunFailedError, match=r"never-waited\.yaml"),
        LegProcesses(log, together=True) as processes,
    ):
        processes.start(["--version"])
        processes.start(["run", str(tmp_path / "never-waited.yaml")])
    assert "reprotune 0." in log.read_text()
