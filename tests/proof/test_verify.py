"""``reprotune verify``: a reproducible config passes; the controls prove the check can fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reprotune._config.loading import config_from_dict
from reprotune._proof import verify as _verify
from reprotune._proof.compare import compare_runs
from tinyrun import BASE_CONFIG, TinyProject, merge


def test_verify_passes_on_reproducible_config(tiny_project: TinyProject, tmp_path: Path) -> None:
    """Rerun IDENTICAL, seed control DIVERGED, resume IDENTICAL, RNG-skip control DIVERGED: exit 0."""
    config = tiny_project.config("verify.yaml")
    out = tmp_path / "verification"
    done = tiny_project.run_cli("verify", str(config), "--out", str(out))
    assert "verify: PASS" in done.stdout
    record = json.loads((out / "verification.json").read_text())
    assert record["schema"] == "reprotune/verification" and record["verdict"] == "PASS"
    verdicts = {leg["name"]: (leg["verdict"], leg["passed"]) for leg in record["legs"]}
    assert verdicts == {
        "rerun": ("IDENTICAL", True),
        "control-seed": ("DIVERGED", True),
        "resume": ("IDENTICAL", True),
        "control-resume": ("DIVERGED", True),
    }
    rerun = next(leg for leg in record["legs"] if leg["name"] == "rerun")
    assert rerun["evidence"]["steps"] == 8
    assert len(rerun["evidence"]["adapter_sha256"]) == 64
    # Each control's first cause is the thing it changed, never metadata of how the run was made.
    seed = compare_runs(out / "reference", out / "control-seed")
    assert seed.causes[0].startswith("data order differs from step 1: derived seed data_order ")
    skip = compare_runs(out / "reference", out / "control-resume")
    assert skip.where.first_divergence_step == 5  # the resume point is step 4
    assert skip.causes[0] == (
        "numbers differ from step 5 with identical data order: run B was resumed from its step-4 "
        "checkpoint without restoring the RNG states: every random draw after it (dropout) differs"
    )
    assert [r.from_step for r in skip.resumes] == [4] and not skip.resumes[0].rng_restored
    exact = compare_runs(out / "reference", out / "resume")
    assert [(r.run, r.from_step, r.rng_restored) for r in exact.resumes] == [("B", 4, True)]
    assert not [d for d in exact.differences if d.key.startswith("data.")]  # the resume kept them


def test_verify_fails_when_runs_are_not_reproducible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Data edited between the reference and the rerun: the rerun DIVERGES and verify FAILS."""
    project = TinyProject.create(tmp_path / "project")
    config = config_from_dict(
        merge(
            BASE_CONFIG,
            {
                "data": {"path": str(project.root / "data.jsonl")},
                "model": {"name": str(project.root / "tiny-model")},
            },
        )
    )
    real_leg = _verify._reprotune
    legs_run: list[list[str]] = []

    def leg_then_edit_data(args: list[str], log: Path) -> None:
        real_leg(args, log)
        legs_run.append(list(args))
        if len(legs_run) == 1:  # after the reference: someone edits one row of the data
            data = project.root / "data.jsonl"
            lines = data.read_text().splitlines()
            lines[0] = lines[0].replace('"response":"', '"response":"edited ')
            data.write_text("\n".join(lines) + "\n")

    monkeypatch.setattr(_verify, "_reprotune", leg_then_edit_data)
    result = _verify.verify_config(config, tmp_path / "verification", resume=False, progress=lambda _: None)
    assert result.verdict == "FAIL"
    rerun = next(leg for leg in result.legs if leg.name == "rerun")
    assert (rerun.verdict, rerun.passed) == ("DIVERGED", False)
    saved = json.loads((tmp_path / "verification" / "verification.json").read_text())
    assert saved["verdict"] == "FAIL"


def test_verify_rejects_bad_control_seed(tiny_project: TinyProject, tmp_path: Path) -> None:
    """An unknown seed consumer for the control is bad input: exit 2, nothing run."""
    config = tiny_project.config("verify.yaml")
    done = tiny_project.run_cli(
        "verify", str(config), "--out", str(tmp_path / "v"), "--control-seed", "dropuot", check=False
    )
    assert done.returncode == 2
    assert "dropuot" in done.stderr and "data_order" in done.stderr


def test_verify_with_existing_reference(tiny_project: TinyProject, tmp_path: Path) -> None:
    """--reference reuses a completed run of the same config; one of another config is refused."""
    config = tiny_project.config("verify-ref.yaml", train={"max_steps": 4, "save_every": 0})
    tiny_project.run_cli("run", str(config), "--run-dir", str(tmp_path / "ref"), "--no-progress")
    done = tiny_project.run_cli(
        "verify", str(config), "--out", str(tmp_path / "v"), "--reference", str(tmp_path / "ref")
    )
    assert "verify: PASS" in done.stdout
    assert not (tmp_path / "v" / "reference").exists()
    other = tiny_project.run_cli(
        "verify",
        str(config),
        "--set",
        "seed.root=9",
        "--out",
        str(tmp_path / "v2"),
        "--reference",
        str(tmp_path / "ref"),
        check=False,
    )
    assert other.returncode == 2
    assert "another config" in other.stderr
    assert not (tmp_path / "v2").exists()
