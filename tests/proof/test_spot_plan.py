"""A spot check's plan (``plan.json``): written by ``verify --spot``, read back typed by its replay
process, and refused with every problem named when it is not a plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reprotune._errors import InputError
from reprotune._proof.spot_plan import PlannedInterval, ResumeControl, SeedControl, SpotPlan
from reprotune._run.layout import SPOT_PLAN


def _plan() -> SpotPlan:
    return SpotPlan(
        reference="runs/a",
        total_steps=20,
        intervals=[
            PlannedInterval(start=0, end=10, why="first", run_dir="spot/steps-1-10"),
            PlannedInterval(start=10, end=20, why="last", run_dir="spot/steps-11-20"),
        ],
        controls=[
            SeedControl(run_dir="spot/control-seed", overrides={"data_order": 8}, bound=3),
            ResumeControl(run_dir="spot/control-resume", start=10, bound=13),
        ],
        code_dir="/code",
        allow_code_drift=False,
    )


def test_a_plan_reads_back_as_it_was_written(tmp_path: Path) -> None:
    """Each control reads back as its own kind (told apart by its name); no data means none."""
    _plan().write(tmp_path)
    written = json.loads((tmp_path / SPOT_PLAN).read_text(encoding="utf-8"))
    assert [c["name"] for c in written["controls"]] == ["control-seed", "control-resume"]
    assert "data" not in written
    back = SpotPlan.read(tmp_path)
    assert back == _plan()
    assert [type(c) for c in back.controls] == [SeedControl, ResumeControl]


def test_a_bad_plan_is_refused_naming_every_problem(tmp_path: Path) -> None:
    written = _plan().model_dump()
    written["total_steps"] = "20"
    del written["controls"][1]["start"]
    written["controls"][0]["name"] = "control-other"
    (tmp_path / SPOT_PLAN).write_text(json.dumps(written), encoding="utf-8")
    with pytest.raises(InputError) as caught:
        SpotPlan.read(tmp_path)
    message = str(caught.value)
    assert "total_steps: input should be a valid integer (got '20')" in message
    assert "controls[1].control-resume.start: field required" in message
    assert "controls[0]" in message and "control-other" in message
    assert str(tmp_path / SPOT_PLAN) in message


def test_a_seed_control_of_the_largest_seed_wraps_to_a_seed(tmp_path: Path) -> None:
    """The seed controls of verify and verify --spot perturb a derived seed by one: for a run whose
    seed is 2**63 - 1 (an override may say so) that was 2**63, no seed, and the control leg's
    config was refused, failing the leg. It wraps to 0."""
    from reprotune._config.loading import config_from_dict
    from reprotune._proof import spot, verify
    from reprotune._proof.intervals import Interval
    from reprotune._run.layout import VerifyLayout
    from tinyrun import BASE_CONFIG, merge

    largest = 2**63 - 1
    cfg = config_from_dict(merge(BASE_CONFIG, {"seed": {"overrides": {"data_order": largest}}}))
    context = verify._Context(cfg, VerifyLayout(tmp_path), tmp_path / "reference", print)
    assert verify._seed_control(context, "data_order", bound=None).note == "seed.overrides.data_order=0"

    record = {"seeds": {"data_order": largest}, "config": {"seed": {"overrides": {"data_order": largest}}}}
    plan = spot._plan(
        tmp_path / "ref", tmp_path / "out", [Interval(0, 4, "first")], 4, record, None, tmp_path, False
    )
    (control, *_) = plan.controls
    assert isinstance(control, SeedControl) and control.overrides == {"data_order": 0}
