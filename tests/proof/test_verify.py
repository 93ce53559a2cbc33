"""``reprotune verify``: a reproducible config passes; the controls prove the check can fail."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from reprotune._config.loading import config_from_dict
from reprotune._config.schema import ExperimentConfig
from reprotune._proof import verify as _verify
from reprotune._proof.compare import compare_runs
from reprotune._proof.verification import NO_DROPOUT_INCONCLUSIVE
from reprotune._run.ledger import read_ledger
from tinyrun import BASE_CONFIG, TinyProject, merge
from warm import fork_legs_here


def _legs(out: Path) -> dict[str, tuple[str, bool | None]]:
    record = json.loads((out / "verification.json").read_text())
    return {leg["name"]: (leg["verdict"], leg["passed"]) for leg in record["legs"]}


def _train_steps(run_dir: Path) -> int:
    return len(read_ledger(run_dir / "ledger.jsonl").train)


def test_verify_passes_on_reproducible_config(tiny_project: TinyProject, tmp_path: Path) -> None:
    """Fast mode: the rerun stopped at the checkpoint and resumed is IDENTICAL over the whole run;
    both controls DIVERGE and stop as soon as they have (confirmed one step later): exit 0."""
    config = tiny_project.config("verify.yaml")
    out = tmp_path / "verification"
    done = tiny_project.run_cli("verify", str(config), "--out", str(out))
    assert "verify: PASS  (fast" in done.stdout
    record = json.loads((out / "verification.json").read_text())
    assert record["schema"] == "reprotune/verification" and record["verdict"] == "PASS"
    assert (record["schema_version"], record["mode"]) == (5, "fast")
    assert _legs(out) == {
        "rerun-resume": ("IDENTICAL", True),
        "control-seed": ("DIVERGED", True),
        "control-resume": ("DIVERGED", True),
    }
    rerun = next(leg for leg in record["legs"] if leg["name"] == "rerun-resume")
    assert rerun["evidence"]["steps"] == 8 and len(rerun["evidence"]["adapter_sha256"]) == 64
    assert all(leg["wall_s"] > 0 for leg in record["legs"]) and record["cost"] > 0
    # The controls ran beside the rerun's processes, training in turns: the verification took
    # less than its legs added up, and the cost is what the user waited for. Every process's log
    # is whole, in the order they started; no part log or lock file is left.
    assert record["wall_s"] < record["legs_s"]
    assert record["cost"] == round(record["wall_s"] / record["reference_s"], 3)
    commands = [line for line in (out / "verify.log").read_text().splitlines() if line.startswith("$ ")]
    assert f"--run-dir {out / 'rerun-resume'} " in commands[-4] and "--stop-after-step 4" in commands[-4]
    assert f"--run-dir {out / 'control-seed'} " in commands[-3]
    assert f"resume {out / 'rerun-resume'} " in commands[-2]
    assert f"resume {out / 'control-resume'} --skip-rng-restore" in commands[-1]
    assert all("--train-lock" in c for c in commands[-4:])
    assert sorted(p.name for p in out.iterdir() if not p.is_dir()) == [
        "config.yaml",
        "verification.json",
        "verify.log",
    ]
    # The controls stopped once they had parted: data order at step 1, the RNG after step 4.
    assert _train_steps(out / "control-seed") == 2
    assert _train_steps(out / "control-resume") == 6
    # Each control's first cause is the thing it changed, never metadata of how the run was made.
    seed = compare_runs(out / "reference", out / "control-seed", prefix=True)
    assert seed.causes[0].startswith("data order differs from step 1: derived seed data_order ")
    skip = compare_runs(out / "reference", out / "control-resume", prefix=True)
    assert skip.where.first_divergence_step == 5  # the resume point is step 4
    assert skip.causes[0] == (
        "numbers differ from step 5 with identical data order: run B was resumed from its step-4 "
        "checkpoint without restoring the RNG states: every random draw after it (dropout) differs"
    )
    assert [r.from_step for r in skip.resumes] == [4] and not skip.resumes[0].rng_restored
    exact = compare_runs(out / "reference", out / "rerun-resume")
    assert [(r.run, r.from_step, r.rng_restored) for r in exact.resumes] == [("B", 4, True)]
    assert not [d for d in exact.differences if d.key.startswith("data.")]  # the resume kept them
    # The report of the verification says on its first screen what was proven, where, at what cost.
    report = tmp_path / "report.html"
    tiny_project.run_cli("report", str(out), "-o", str(report))
    html = report.read_text()
    first_screen = html[: html.index("<h2>Runs</h2>")]
    assert "What was proven" in first_screen and "verify PASS</span> (fast mode" in first_screen
    assert "Machine: host " in first_screen and f"run ({record['cost']:.2f}x)" in first_screen
    # The legs' table (the HTML kit's: escaped cells, seconds right-aligned): one row per leg.
    assert "<th>must be</th>" in first_screen
    for leg in record["legs"]:
        row = f"<td>{leg['name']}</td><td>{leg['verdict']}</td><td>{leg['expected']}</td><td>yes</td>"
        assert row + '<td class="num">' in first_screen
    assert "A (reference)" in html and "(control-resume)" in html
    # Each leg's badge in the report is its verdict in verification.json: the controls, compared
    # over the steps both ran (as verify compared them), are DIVERGED, never INCOMPARABLE.
    assert [leg["prefix"] for leg in record["legs"]] == [False, True, True]
    glance = first_screen[: first_screen.index("What was proven")]
    badges = re.findall(r'vs [A-Z] \((.+?)\): <span class="verdict (\w+)"', glance)
    assert badges == [(leg["name"], leg["verdict"]) for leg in record["legs"]]
    assert "INCOMPARABLE" not in html.replace(".INCOMPARABLE {", "")
    assert html.count("this negative control stops once it parts") == 2


def test_verify_thorough_runs_full_length_legs(tiny_project: TinyProject, tmp_path: Path) -> None:
    """--thorough: rerun, seed control, resume and RNG-skip control, each to the last step."""
    config = tiny_project.config("verify.yaml")
    out = tmp_path / "verification"
    done = tiny_project.run_cli("verify", str(config), "--out", str(out), "--thorough")
    assert "verify: PASS  (thorough" in done.stdout
    assert _legs(out) == {
        "rerun": ("IDENTICAL", True),
        "control-seed": ("DIVERGED", True),
        "resume": ("IDENTICAL", True),
        "control-resume": ("DIVERGED", True),
    }
    assert all(_train_steps(out / name) == 8 for name in ("rerun", "control-seed", "control-resume"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[TinyProject, Path]:
    """A tiny project and one completed run of its config, the reference of the failing verifies."""
    project = TinyProject.create(tmp_path_factory.mktemp("verify-fail"))
    project.config("cfg.yaml")
    project.run_cli("run", "cfg.yaml", "--run-dir", "runs/ref", "--no-progress")
    return project, project.root / "runs" / "ref"


def test_verify_without_dropout_calls_the_rng_control_inconclusive(
    tiny_project: TinyProject, tmp_path: Path
) -> None:
    """With lora.dropout 0 nothing draws from the RNG after the checkpoint: the RNG-skip control
    stays IDENTICAL and is not counted (n/a, said so as it is judged and in the summary), and the
    verification passes on its other legs: exit 0."""
    config = tiny_project.config("nodrop.yaml", lora={"dropout": 0.0})
    out = tmp_path / "v"
    done = tiny_project.run_cli("verify", str(config), "--out", str(out))
    assert "verify: PASS" in done.stdout
    assert _legs(out) == {
        "rerun-resume": ("IDENTICAL", True),
        "control-seed": ("DIVERGED", True),
        "control-resume": ("IDENTICAL", None),
    }
    assert "control-resume: IDENTICAL (must be DIVERGED): inconclusive, not counted" in done.stdout
    assert "[n/a ] control-resume" in done.stdout
    leg = json.loads((out / "verification.json").read_text())["legs"][2]
    assert leg["note"] == NO_DROPOUT_INCONCLUSIVE


@pytest.mark.parametrize(
    ("env", "first", "blamed"),
    [
        ({"REPROTUNE_NOISE_AT_STEP": "2"}, 3, "blames rerun nondeterminism (at or before the resume point)"),
        ({"REPROTUNE_SKIP_RNG_RESTORE": "1"}, 5, "blames the resume"),
    ],
    ids=["nondeterministic-op-before-K", "rng-not-restored-at-resume"],
)
def test_verify_fails_and_blames_the_right_leg(
    reference: tuple[TinyProject, Path], tmp_path: Path, env: dict[str, str], first: int, blamed: str
) -> None:
    """A nondeterministic op before the resume point blames the rerun; a resume that forgets the
    RNG states blames the resume: FAIL, exit 1."""
    project, ref = reference
    out = tmp_path / "v"
    done = project.run_cli(
        "verify", "cfg.yaml", "--reference", str(ref), "--out", str(out), env=env, check=False
    )
    assert done.returncode == 1 and "verify: FAIL" in done.stdout
    record = json.loads((out / "verification.json").read_text())
    leg = next(leg for leg in record["legs"] if leg["name"] == "rerun-resume")
    assert (leg["verdict"], leg["passed"], leg["evidence"]["first_divergence"]) == ("DIVERGED", False, first)
    assert leg["note"] == f"first divergence at step {first}, resume point 4: {blamed}"


def test_verify_fails_when_the_control_changes_nothing(
    reference: tuple[TinyProject, Path], tmp_path: Path
) -> None:
    """A control seed that changes nothing (eval, with every validation row used): the control
    never parts within its bound, the check is blind: FAIL."""
    project, ref = reference
    out = tmp_path / "v"
    done = project.run_cli(
        "verify", "cfg.yaml", "--reference", str(ref), "--out", str(out), "--control-seed", "eval",
        "--no-resume", check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "verify: FAIL" in done.stdout
    leg = next(
        leg
        for leg in json.loads((out / "verification.json").read_text())["legs"]
        if leg["name"] == "control-seed"
    )
    assert (leg["verdict"], leg["passed"]) == ("IDENTICAL", False)
    assert "nothing differed within 5 steps: the check is blind to this seed" in leg["note"]


def _in_this_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[TinyProject, ExperimentConfig]:
    """A tiny project and its config, for a verify run in this process (its legs forked from the
    warm zygote, tests/warm.py)."""
    assert fork_legs_here(monkeypatch) or os.environ.get("REPROTUNE_TESTS_COLD")
    project = TinyProject.create(tmp_path / "project")
    paths = {
        "data": {"path": str(project.root / "data.jsonl")},
        "model": {"name": str(project.root / "tiny-model")},
    }
    return project, config_from_dict(merge(BASE_CONFIG, paths))


def test_verify_fails_when_runs_are_not_reproducible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Data edited between the reference and the rerun: the rerun DIVERGES and verify FAILS (verify
    in this process, its legs forked from the warm zygote, tests/warm.py)."""
    project, config = _in_this_process(tmp_path, monkeypatch)
    real_leg = _verify._reprotune
    legs_run: list[list[str]] = []

    def leg_then_edit_data(args: list[str], log: Path, **options: Any) -> float:
        seconds = real_leg(args, log, **options)
        legs_run.append(list(args))
        if len(legs_run) == 1:  # after the reference: someone edits one row of the data
            data = project.root / "data.jsonl"
            lines = data.read_text().splitlines()
            lines[0] = lines[0].replace('"response":"', '"response":"edited ')
            data.write_text("\n".join(lines) + "\n")
        return seconds

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


def test_a_config_only_the_reference_run_refuses_exits_2_leaving_nothing(
    tiny_project: TinyProject, tmp_path: Path
) -> None:
    """LoRA target modules that match no module are found when the reference's run loads the
    model: bad input, exit 2 with the run's message and the fix, and no half-written --out (before:
    exit 1, and config.yaml and verify.log left, which refused the next try as "did not finish")."""
    config = tiny_project.config("verify.yaml")
    out = tmp_path / "v"
    for _ in range(2):  # the second try is refused for the same reason, not for the first's leftovers
        done = tiny_project.run_cli(
            "verify", str(config), "--set", "lora.target_modules=[nope_proj]", "--out", str(out), check=False
        )
        assert done.returncode == 2, done.stderr
        assert "match no module" in done.stderr and "your config (each --set applied), line" in done.stderr
        assert str(out) not in done.stderr, done.stderr  # not the copy it removed
        assert not out.exists()


def test_an_eval_seed_control_runs_to_the_validation_that_can_show_it() -> None:
    """The eval seed shows only in validation: with eval_every 0 (validation at the last step) its
    control runs to the end (before, it stopped after 3 steps and verify called the check blind);
    other seeds show in training and stop after a few steps."""
    bound = _verify._control_bound
    at_end = config_from_dict({"train": {"eval_every": 0}})
    assert (bound(at_end, 6, "eval"), bound(at_end, 6, "data_order"), bound(at_end, 6)) == (6, 3, 3)
    every_four = config_from_dict({"train": {"eval_every": 4}})
    assert (bound(every_four, 8, "eval"), bound(every_four, 8, "dropout")) == (5, 5)


def test_verify_with_existing_reference(tiny_project: TinyProject, tmp_path: Path) -> None:
    """--reference reuses a completed run of the same config (whatever its tracking settings); one
    of another config is refused."""
    config = tiny_project.config("verify-ref.yaml", train={"max_steps": 4, "save_every": 0})
    tiny_project.run_cli("run", str(config), "--run-dir", str(tmp_path / "ref"), "--no-progress")
    done = tiny_project.run_cli(
        "verify", str(config), "--out", str(tmp_path / "v"), "--reference", str(tmp_path / "ref")
    )
    assert "verify: PASS" in done.stdout
    assert not (tmp_path / "v" / "reference").exists()
    # Another tracking setting cannot change the numbers: still a reference of this config.
    tracked = tiny_project.run_cli(
        "verify", str(config), "--set", "tracking.experiment=elsewhere", "--out", str(tmp_path / "vt"),
        "--reference", str(tmp_path / "ref"),
    )  # fmt: skip
    assert "verify: PASS" in tracked.stdout
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


def test_verify_judges_the_evals_when_the_config_evaluates(tiny_project: TinyProject, tmp_path: Path) -> None:
    """With eval.generate_at_end, verify's eval leg compares the reference's eval with the
    rerun-resume leg's (made by its resumed process) row by row: IDENTICAL. A --reference whose
    only eval is one made by hand of its first 2 rows is evaluated first, in a fresh process, like
    the rerun's (before, verify saw an eval there, made none, and failed the leg: "no evals made
    with the same settings")."""
    config = tiny_project.config(
        "verify-eval.yaml",
        train={"max_steps": 4, "save_every": 2},
        eval={"batch_size": 8, "max_new_tokens": 4, "generate_at_end": True},
    )
    ref = tmp_path / "ref"
    tiny_project.run_cli("run", str(config), "--run-dir", str(ref), "--no-progress", "--no-tracking")
    shutil.rmtree(ref / "evals")
    tiny_project.run_cli("eval", str(ref), "--max-rows", "2", "--no-progress")
    out = tmp_path / "v"
    done = tiny_project.run_cli("verify", str(config), "--out", str(out), "--reference", str(ref))
    assert "verify: PASS" in done.stdout
    assert _legs(out)["eval"] == ("IDENTICAL", True)
    (evidence,) = json.loads((out / "verification.json").read_text())["legs"][-1]["evidence"].values()
    assert evidence["rows"] > 0 and evidence["rows_differing"] == 0
    # The leg's line shows that evidence as words, not a Python dict.
    assert f"rows {evidence['rows']}, rows_differing 0)" in done.stdout and "{'a':" not in done.stdout
    assert len(list((ref / "evals").iterdir())) == 2  # the hand-made one and verify's
    assert len(list((out / "rerun-resume" / "evals").iterdir())) == 1


@pytest.mark.parametrize(("wall_s", "reference_s"), [(4.89656, 4.3897), (8.2344999, 1.0)], ids=str)
def test_cost_is_computed_from_the_times_it_is_written_with(wall_s: float, reference_s: float) -> None:
    """verification.json's cost is its own wall_s over its reference_s, rounded once: a reader
    recomputing it from the file gets the same number, also where the unrounded quotient rounds
    to another last digit (4.89656 s over 4.3897 s: 1.115, but 4.897 s written gives 1.116)."""
    from reprotune._proof.verification import Verification

    body = Verification("PASS", "v", "0" * 64, [], reference_s=reference_s, wall_s=wall_s).to_json()
    assert body["wall_s"] == round(wall_s, 3) and body["reference_s"] == reference_s
    assert body["cost"] == round(body["wall_s"] / body["reference_s"], 3)


def test_a_leg_whose_process_fails_is_a_failed_leg_of_a_verification_that_still_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--thorough, the seed control's process failing (exit code 1): verify still judges the other
    legs, ends FAIL and writes verification.json, the control FAILED with the command's message
    (the legs run one after the other through the one leg engine, ``_proof.legs``)."""
    from reprotune._errors import RunFailedError

    _, config = _in_this_process(tmp_path, monkeypatch)
    real_leg = _verify._reprotune

    def failing_control(args: list[str], log: Path, **options: Any) -> float:
        if "--set" in args:
            raise RunFailedError("`reprotune run ...` failed with exit code 1:\nsimulated", source=str(log))
        return real_leg(args, log, **options)

    monkeypatch.setattr(_verify, "_reprotune", failing_control)
    out = tmp_path / "verification"
    result = _verify.verify_config(config, out, resume=False, thorough=True, progress=lambda _: None)
    assert result.verdict == "FAIL"
    assert _legs(out) == {"rerun": ("IDENTICAL", True), "control-seed": ("FAILED", False)}
    control = next(leg for leg in result.legs if leg.name == "control-seed")
    assert control.note is not None and control.note.endswith("failed with exit code 1:\nsimulated")
    assert control.run_dir == str((out / "control-seed").resolve())


def test_an_eval_that_fails_is_a_failed_leg_not_a_crash(tmp_path: Path) -> None:
    """The eval leg's `reprotune eval` process failing: a FAILED leg with the process's message,
    so the verification still ends and writes verification.json (before, RunFailedError escaped
    verify, which ended without it)."""
    from reprotune._errors import RunFailedError
    from reprotune._proof.verify_eval import eval_leg
    from rundirs import write_run_dir

    reference, rerun = write_run_dir(tmp_path / "reference"), write_run_dir(tmp_path / "rerun")

    def failing(*args: str) -> float:
        raise RunFailedError("`reprotune eval ...` failed with exit code 1:\nout of memory")

    leg = eval_leg(reference, rerun, failing, lambda _: None)
    assert (leg.name, leg.verdict, leg.passed) == ("eval", "FAILED", False)
    assert leg.note is not None and "out of memory" in leg.note


def test_a_damaged_eval_of_the_reference_is_a_failed_leg_naming_it(tmp_path: Path) -> None:
    """A --reference run holding an eval whose eval.json is damaged: the eval leg fails naming the
    file (before, the InputError escaped verify after the other legs had run, leaving no
    verification.json)."""
    from reprotune._proof.verify_eval import eval_leg
    from rundirs import write_run_dir

    reference, rerun = write_run_dir(tmp_path / "reference"), write_run_dir(tmp_path / "rerun")
    damaged = reference / "evals" / "test-0" / "eval.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_text("{broken")

    def never(*args: str) -> float:
        raise AssertionError(f"no eval process should run: {args}")

    leg = eval_leg(reference, rerun, never, lambda _: None)
    assert (leg.name, leg.verdict, leg.passed) == ("eval", "FAILED", False)
    assert leg.note is not None and str(damaged) in leg.note, leg.note
