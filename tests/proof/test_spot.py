"""``reprotune verify RUN_DIR --spot`` (issue 27): sampled checkpoint intervals replayed bit for bit.

The reference: the tiny model, 20 steps, a checkpoint every 4 (all kept), mirrored to MLflow on a
SQLite store: states 0, 4, 8, 12, 16 and the end, so 5 intervals of 4 steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from reprotune._jsonio import sha256_file, write_json_atomic
from reprotune._proof.intervals import Interval, plan_intervals
from reprotune._run import checkpoint as checkpoint_module
from tinyrun import TinyProject
from warm import run_reprotune

pytestmark = pytest.mark.slow


def test_the_plan_always_holds_the_first_and_the_last_and_draws_within_the_budget() -> None:
    """First and last always (even past the budget); the others drawn by the seed while they fit."""
    states = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110]
    plan = plan_intervals(states, 120, budget=0.2, seed=7)
    assert plan[0] == Interval(0, 10, "first") and plan[-1] == Interval(110, 120, "last")
    assert sum(i.steps for i in plan) == 20  # 0.2 x 120 = 24: one more interval of 10 would pass it
    wider = plan_intervals(states, 120, budget=0.5, seed=7)
    assert len(wider) == 6 and [i.why for i in wider].count("drawn") == 4
    assert plan_intervals(states, 120, budget=0.5, seed=7) == wider  # the seed decides
    draws = {tuple(plan_intervals(states, 120, budget=0.5, seed=s)) for s in range(10)}
    assert len(draws) > 1
    assert plan_intervals([], 30, budget=0.2, seed=0) == [Interval(0, 30, "first and last")]
    # States at or past the end are not cut points.
    assert plan_intervals([10, 30], 30, budget=1.0, seed=0) == [
        Interval(0, 10, "first"),
        Interval(10, 30, "last"),
    ]


@pytest.fixture(scope="module")
def reference(tiny_project: TinyProject) -> Path:
    config = tiny_project.config(
        "spot.yaml",
        train={"max_steps": 20, "save_every": 4, "keep_checkpoints": 10, "eval_every": 8},
        tracking={"mlflow": True, "experiment": "spot"},
    )
    tiny_project.run_cli("run", str(config), "--run-dir", "runs/spot-ref", "--no-progress")
    return tiny_project.root / "runs" / "spot-ref"


def _verification(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "verification.json").read_text())
    return data


def _legs(out: Path) -> dict[str, dict[str, Any]]:
    return {leg["name"]: leg for leg in _verification(out)["legs"]}


def test_an_honest_run_passes_and_the_verdict_reaches_mlflow(
    tiny_project: TinyProject, reference: Path
) -> None:
    """PASS with the first, the last and one drawn interval (budget 0.6 = 12 of 20 steps), each
    IDENTICAL up to its end state; both controls DIVERGED; the intervals, seed and coverage in
    verification.json; the reference's MLflow run tagged, verification.json attached."""
    done = tiny_project.run_cli(
        "verify", str(reference), "--spot", "--budget", "0.6", "--seed", "1", "--out", "spot-ok"
    )
    out = tiny_project.root / "spot-ok"
    record = _verification(out)
    assert (record["schema_version"], record["mode"], record["verdict"]) == (5, "spot", "PASS")
    spot = record["spot"]
    assert (spot["seed"], spot["budget"], spot["total_steps"]) == (1, 0.6, 20)
    assert spot["states"] == [0, 4, 8, 12, 16] and spot["intervals_available"] == 5
    intervals = [(i["start"], i["end"], i["why"]) for i in spot["intervals"]]
    assert intervals[0] == (0, 4, "first") and intervals[-1] == (16, 20, "last")
    assert len(intervals) == 3 and intervals[1][2] == "drawn" and spot["steps_replayed"] == 12
    assert "3/5 = 60%" in spot["proves"] and "covered: 3 of 5 intervals, 12 of 20 steps" in done.stdout
    legs = _legs(out)
    for start, end, _ in intervals:
        leg = legs[f"steps {start + 1}-{end}"]
        assert (leg["verdict"], leg["passed"]) == ("IDENTICAL", True)
        expected_end = "adapter sha256 identical" if end == 20 else f"checkpoint {end}: weights, optimizer"
        assert leg["evidence"]["end_state"].startswith(expected_end)
    assert (legs["control-seed"]["verdict"], legs["control-resume"]["verdict"]) == ("DIVERGED", "DIVERGED")
    assert legs["control-seed"]["evidence"]["steps"] <= 3  # cut short once it parted
    # The report of the spot check badges each leg with the verdict verify gave it (an interval
    # replay holds the steps up to its end: it read INCOMPARABLE) and says what a spot check proves.
    from reprotune._proof.report import write_report

    html = write_report([out], tiny_project.root / "spot-ok.html").read_text(encoding="utf-8")
    glance = html[: html.index("What was proven")]
    badges = re.findall(r'vs [A-Z] \((.+?)\): <span class="verdict (\w+)"', glance)
    assert [verdict for _, verdict in badges] == [leg["verdict"] for leg in record["legs"]]
    assert [name for name, _ in badges] == [Path(leg["run_dir"]).name for leg in record["legs"]]
    assert "The recorded run reproduces where it was sampled: 3 of 5 intervals (12 of 20 steps)" in html
    # The verdict where the user looks: the reference run's MLflow run, read back with MLflow.
    from mlflow.tracking import MlflowClient

    mirrored = json.loads((reference / "record.json").read_text())["trackers"]["mlflow"]
    client = MlflowClient(tracking_uri=mirrored["tracking_uri"])
    tags = client.get_run(mirrored["mlflow_run_id"]).data.tags
    assert tags["reprotune.verify.verdict"] == "PASS" and tags["reprotune.verify.mode"] == "spot"
    assert tags["reprotune.verify.steps_covered"] == "12/20"
    assert tags["reprotune.verify.sha256"] == sha256_file(out / "verification.json")
    artifacts = [a.path for a in client.list_artifacts(mirrored["mlflow_run_id"], "reprotune")]
    assert artifacts == ["reprotune/verification.json"]


def _copy(reference: Path, name: str) -> Path:
    copy = reference.parent / name
    shutil.copytree(reference, copy)
    return copy


def _edit_optimizer(checkpoint: Path) -> None:
    """Nudge one AdamW moment in the checkpoint and rewrite its hashes, so the checkpoint still
    verifies (a forged or buggy checkpoint, not a damaged one)."""
    states = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    moments = states["optimizer"]["state"][0]["exp_avg"]
    moments.view(-1)[0] += 1e-3
    torch.save(states, checkpoint / "optimizer.pt")
    state = json.loads((checkpoint / "state.json").read_text())
    state["files"]["optimizer.pt"] = sha256_file(checkpoint / "optimizer.pt")
    state["state_sha256"] = checkpoint_module._state_sha256(state)
    write_json_atomic(checkpoint / "state.json", state)
    assert checkpoint_module.verify_checkpoint(checkpoint) is None


def test_an_edited_optimizer_state_fails_the_intervals_that_touch_it(
    tiny_project: TinyProject, reference: Path
) -> None:
    """Checkpoint 8's optimizer state edited (hashes rewritten): every interval replayed (budget
    1), the one ending there differs in its end state (optimizer.pt) and the one starting there
    from step 9 on: FAIL. With the default budget it is not drawn: PASS, covering 2 of 5."""
    run = _copy(reference, "spot-edited-optimizer")
    _edit_optimizer(run / "checkpoints" / "step-00000008")
    failed = tiny_project.run_cli(
        "verify", str(run), "--spot", "--budget", "1", "--out", "spot-opt", check=False
    )
    assert failed.returncode == 1 and "verify: FAIL  (spot" in failed.stdout
    legs = _legs(tiny_project.root / "spot-opt")
    assert legs["steps 5-8"]["verdict"] == "DIVERGED"
    assert legs["steps 5-8"]["evidence"]["end_state"] == "checkpoint 8 differs: optimizer.pt"
    assert "first_divergence" not in legs["steps 5-8"]["evidence"]  # its ledger lines are right
    after = legs["steps 9-12"]
    assert after["verdict"] == "DIVERGED" and after["evidence"]["first_divergence"] == 9
    assert "train weights_sha256" in after["evidence"]["differing"]
    assert "reprotune trace" in after["note"]
    for name in ("steps 1-4", "steps 13-16", "steps 17-20"):
        assert legs[name]["verdict"] == "IDENTICAL", name
    lucky = tiny_project.run_cli("verify", str(run), "--spot", "--out", "spot-opt-default")
    spot = _verification(tiny_project.root / "spot-opt-default")["spot"]
    assert [(i["start"], i["end"]) for i in spot["intervals"]] == [(0, 4), (16, 20)]
    assert "covered: 2 of 5 intervals, 8 of 20 steps" in lucky.stdout


def _edit_loss(run: Path, step: int) -> None:
    """Add 1e-6 to the train loss of ``step`` in the run's ledger, as a hand would (the record's
    ``outputs.ledger_sha256`` left as it was)."""
    ledger = run / "ledger.jsonl"
    lines = ledger.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if '"kind":"train"' in line and f'"step":{step},' in line)
    entry = json.loads(lines[index])
    entry["loss"] = float.fromhex(entry["loss"]).__add__(1e-6).hex()
    lines[index] = json.dumps(entry, separators=(",", ":"), sort_keys=True)
    ledger.write_text("\n".join(lines) + "\n")


def test_an_edited_ledger_line_fails_naming_the_step(tiny_project: TinyProject, reference: Path) -> None:
    """The loss of step 18 edited in the ledger (the last interval is always replayed): FAIL, the
    last interval DIVERGED from step 18 in its train loss."""
    run = _copy(reference, "spot-edited-ledger")
    _edit_loss(run, 18)
    failed = tiny_project.run_cli("verify", str(run), "--spot", "--out", "spot-ledger", check=False)
    assert failed.returncode == 1
    last = _legs(tiny_project.root / "spot-ledger")["steps 17-20"]
    assert last["verdict"] == "DIVERGED" and last["evidence"]["first_divergence"] == 18
    assert last["evidence"]["differing"] == ["train loss"]
    assert last["evidence"]["end_state"] == "adapter sha256 identical"


def test_an_edited_ledger_line_outside_the_intervals_drawn_fails(
    tiny_project: TinyProject, reference: Path
) -> None:
    """The loss of step 10 edited (the default budget replays steps 1-4 and 17-20 only): FAIL, the
    ledger a failed leg of its own naming both sha256, every replay IDENTICAL (before: PASS)."""
    run = _copy(reference, "spot-edited-unreplayed")
    recorded = sha256_file(run / "ledger.jsonl")
    _edit_loss(run, 10)
    edited = sha256_file(run / "ledger.jsonl")
    failed = tiny_project.run_cli("verify", str(run), "--spot", "--out", "spot-unreplayed", check=False)
    assert failed.returncode == 1 and "verify: FAIL  (spot" in failed.stdout
    problem = (
        f"is not the file the run wrote: its sha256 is {edited}, the record's outputs.ledger_sha256 "
        f"is {recorded}"
    )
    assert f"warning: {(run / 'ledger.jsonl').resolve()} {problem}\n" in failed.stdout
    legs = _legs(tiny_project.root / "spot-unreplayed")
    leg = legs["run file ledger.jsonl"]
    assert (leg["verdict"], leg["passed"]) == (None, False)
    assert leg["note"] == f"ledger.jsonl {problem}: the run does not hold what its record says it made"
    assert [legs[name]["verdict"] for name in ("steps 1-4", "steps 17-20")] == ["IDENTICAL", "IDENTICAL"]


def test_a_changed_adapter_fails_though_every_replay_matches(
    tiny_project: TinyProject, reference: Path
) -> None:
    """One byte of the run's adapter weights flipped: FAIL, the file a failed leg of its own naming
    both sha256, and the last interval's end state the replay's adapter against the run's file
    (before: PASS, "adapter sha256 identical": the two records' claims compared, not the file)."""
    run = _copy(reference, "spot-changed-adapter")
    weights = run / "adapter" / "adapter_model.safetensors"
    recorded = sha256_file(weights)
    data = bytearray(weights.read_bytes())
    data[-5] ^= 1
    weights.write_bytes(bytes(data))
    changed = sha256_file(weights)
    failed = tiny_project.run_cli("verify", str(run), "--spot", "--out", "spot-adapter", check=False)
    assert failed.returncode == 1 and "verify: FAIL  (spot" in failed.stdout
    legs = _legs(tiny_project.root / "spot-adapter")
    leg = legs["run file adapter/adapter_model.safetensors"]
    assert (leg["verdict"], leg["passed"]) == (None, False)
    assert leg["note"] == (
        f"adapter/adapter_model.safetensors is not the file the run wrote: its sha256 is {changed}, the "
        f"record's outputs.adapter_files['adapter_model.safetensors'] is {recorded}: the run does not "
        "hold what its record says it made"
    )
    last = legs["steps 17-20"]
    assert (last["verdict"], last["passed"]) == ("DIVERGED", False) and "first_divergence" not in last[
        "evidence"
    ]
    assert last["evidence"]["end_state"] == f"adapter sha256 {recorded} vs {changed}"


def test_a_damaged_checkpoint_fails_and_bad_input_is_refused_before_any_replay(
    tiny_project: TinyProject, reference: Path
) -> None:
    """A checkpoint whose weights no longer match their hash cannot be replayed from or checked
    against: it is said, and the spot check FAILs naming it (it passed with "100%" coverage). A
    truncated ledger, and a config given for a run, are refused with exit 2 before anything is
    replayed, leaving no directory behind."""
    run = _copy(reference, "spot-damaged-checkpoint")
    weights = run / "checkpoints" / "step-00000008" / "trainable.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 1
    weights.write_bytes(bytes(data))
    failed = tiny_project.run_cli(
        "verify", str(run), "--spot", "--budget", "1", "--out", "spot-damaged", check=False
    )
    assert failed.returncode == 1 and "verify: FAIL  (spot" in failed.stdout
    assert (
        "step-00000008 is refused: trainable.safetensors does not match its recorded sha256" in failed.stdout
    )
    leg = _legs(tiny_project.root / "spot-damaged")["checkpoint step-00000008"]
    assert (leg["verdict"], leg["passed"]) == (None, False)
    assert leg["note"].startswith("refused: trainable.safetensors does not match its recorded sha256")
    truncated = _copy(reference, "spot-truncated-ledger")
    ledger = truncated / "ledger.jsonl"
    ledger.write_bytes(ledger.read_bytes()[:-40])
    refused = tiny_project.run_cli("verify", str(truncated), "--spot", "--out", "spot-trunc", check=False)
    assert refused.returncode == 2 and "ledger.jsonl:" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tiny_project.root / "spot-trunc").exists()
    config = tiny_project.run_cli("verify", "spot.yaml", "--spot", "--out", "spot-config", check=False)
    assert (
        config.returncode == 2 and "spot.yaml is a config; --spot checks a run that exists" in config.stderr
    )
    assert not (tiny_project.root / "spot-config").exists()
    inside = tiny_project.run_cli(
        "verify", str(reference), "--spot", "--out", str(reference / "sub"), check=False
    )
    assert inside.returncode == 2 and f"is inside {reference}, which this command reads" in inside.stderr
    assert not (reference / "sub").exists()
    # A run made outside git, spot-checked from inside a git checkout: no commit to check out.
    repo = tiny_project.root / "elsewhere-in-git"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "x"]
    subprocess.run(git, cwd=repo, check=True)
    drift = run_reprotune(["verify", str(reference), "--spot"], cwd=repo, env=dict(os.environ), timeout=600)
    assert drift.returncode == 2 and "code.commit: recorded None" in drift.stderr
    assert "the run was made outside a git checkout (no commit to check out)" in drift.stderr
    assert "check out commit None" not in drift.stderr and not (repo / "runs").exists()


def test_a_bundle_with_checkpoints_is_spot_checked_elsewhere(
    tiny_project: TinyProject, reference: Path, tmp_path: Path
) -> None:
    """pack --checkpoints --with-data, the bundle alone in another directory (the run and its data
    moved away): verify BUNDLE --spot PASSes there; the reference's MLflow run is not touched from
    a bundle. A bundle without checkpoints is refused, saying how to pack one."""
    bundle = tmp_path / "elsewhere" / "run.tar.gz"
    bundle.parent.mkdir()
    packed = tiny_project.run_cli("pack", str(reference), "-o", str(bundle), "--checkpoints", "--with-data")
    saved = sorted(path.name for path in (reference / "checkpoints").iterdir())
    assert f"checkpoints     {len(saved)} ({', '.join(saved)})" in packed.stdout, packed.stdout
    bare = tmp_path / "elsewhere" / "bare.tar.gz"
    packed = tiny_project.run_cli("pack", str(reference), "-o", str(bare), "--with-data")
    assert "  checkpoints  " not in packed.stdout and "spot-check it" not in packed.stdout
    hidden = [tiny_project.root / "data.jsonl", reference]
    for path in hidden:
        path.rename(path.with_name(path.name + ".away"))
    try:
        env = {"MLFLOW_DISABLE_TELEMETRY": "true"}
        done = run_reprotune(
            ["verify", "run.tar.gz", "--spot", "--budget", "0.6", "--out", "spot"],
            cwd=bundle.parent,
            env={**os.environ, **env},
            timeout=600,
        )
        refused = run_reprotune(
            ["verify", "bare.tar.gz", "--spot", "--out", "spot-bare"],
            cwd=bundle.parent,
            env={**os.environ, **env},
            timeout=600,
        )
    finally:
        for path in hidden:
            path.with_name(path.name + ".away").rename(path)
    assert done.returncode == 0, done.stdout + done.stderr
    record = _verification(bundle.parent / "spot")
    assert record["verdict"] == "PASS" and record["spot"]["bundle"] == "run.tar.gz"
    assert "verdict tagged" not in done.stdout
    assert refused.returncode == 2 and "holds no checkpoints" in refused.stderr
    assert "--checkpoints" in refused.stderr
    assert not (bundle.parent / "spot-bare").exists()  # nothing unpacked is left behind


@contextlib.contextmanager
def _model_away(project: TinyProject) -> Iterator[None]:
    """The project's tiny-model moved away for the block, as on a machine the run was not made on."""
    model = project.root / "tiny-model"
    model.rename(model.with_name("tiny-model.away"))
    try:
        yield
    finally:
        model.with_name("tiny-model.away").rename(model)


def test_a_bundle_whose_base_model_is_not_here_is_refused_before_anything_is_written(
    tiny_project: TinyProject, reference: Path, tmp_path: Path
) -> None:
    """verify BUNDLE --spot where the run's base model is not: exit 2 naming the model, the bundle's
    record and where the run loaded it, and no --out left (before: exit 1 with the replay's
    traceback, "fix the run itself first", and plan.json, verify.log and recorded/ left)."""
    bundle = tmp_path / "run.tar.gz"
    tiny_project.run_cli("pack", str(reference), "-o", str(bundle), "--checkpoints", "--with-data")
    model = json.loads((reference / "record.json").read_text())["model"]
    with _model_away(tiny_project):
        refused = tiny_project.run_cli(
            "verify", str(bundle), "--spot", "--out", str(tmp_path / "spot"), check=False
        )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert (
        f"reprotune verify: error: {bundle}: run/record.json (key config.model.name): the run's base model "
        "is not here: model 'tiny-model' is neither a local directory nor in the local Hugging Face cache"
    ) in refused.stderr
    assert (
        f"fix: copy the base model the run was made from (the record's model.weights_sha256 is "
        f"{model['weights_sha256']}) to {model['resolved_path']}, where the run loaded it\n"
    ) in refused.stderr
    assert "Traceback" not in refused.stderr and "fix the run itself" not in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.tar.gz"]


def test_bad_input_only_the_replay_meets_is_refused_as_bad_input(
    tiny_project: TinyProject,
    reference: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Bad input that only the replay process meets (its model, with the check before it switched
    off): its error and fix as they are, exit 2, and --out removed (before: exit 1, the replay's
    traceback, "fix the run itself first", plan.json and verify.log left)."""
    from reprotune._cli import main
    from reprotune._proof import spot

    monkeypatch.setattr(spot, "check_base_model", lambda *args: None)
    monkeypatch.chdir(tmp_path)  # outside git, as the run was made
    with _model_away(tiny_project):
        code = main(["verify", str(reference), "--spot", "--out", "spot"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert (
        "reprotune verify: error: model.name: model 'tiny-model' is neither a local directory nor in "
        "the local Hugging Face cache"
    ) in err
    assert "fix: download it once where there is network (`hf download tiny-model --local-dir DIR`)" in err
    assert "Traceback" not in err and "fix the run itself" not in err and not (tmp_path / "spot").exists()


def test_a_missing_run_or_bundle_is_said_to_be_neither(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify nope.tar.gz --spot, where nothing is: exit 2, "neither a run directory nor a bundle
    file", both named in the fix (before: "RUN_DIR: no such directory", a run directory's fix)."""
    from reprotune._cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["verify", "nope.tar.gz", "--spot", "--out", "spot"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "reprotune verify: error: --spot: nope.tar.gz is neither a run directory nor a bundle file: "
        "nothing is there\nfix: give the directory `reprotune run` wrote (runs/<run-id>/, which holds "
        "record.json), or a bundle of it: `reprotune pack RUN_DIR -o run.tar.gz --checkpoints --with-data`"
    ), err
    assert list(tmp_path.iterdir()) == []


def test_a_run_made_in_a_portable_mode_is_spot_checked_in_that_mode(tiny_project: TinyProject) -> None:
    """A run in determinism.cpu_isa avx2-compatible: its replays run in the mode its record says
    (before, the replay process put no mode in force and refused itself: "'avx2-compatible' is
    not in force in this process")."""
    config = tiny_project.config(
        "spot-portable.yaml",
        train={"max_steps": 8, "save_every": 4, "keep_checkpoints": 10, "eval_every": 8},
        determinism={"cpu_isa": "avx2-compatible"},
    )
    tiny_project.run_cli("run", str(config), "--run-dir", "runs/portable", "--no-progress", cold=True)
    done = tiny_project.run_cli(
        "verify", "runs/portable", "--spot", "--budget", "1", "--out", "spot-portable"
    )
    record = _verification(tiny_project.root / "spot-portable")
    assert record["verdict"] == "PASS", done.stdout
    replayed = [leg for leg in record["legs"] if leg["name"].startswith("steps ")]
    assert [leg["verdict"] for leg in replayed] == ["IDENTICAL", "IDENTICAL"]
    for leg in replayed:
        kernels = json.loads((Path(leg["run_dir"]) / "record.json").read_text())["environment"]["kernels"]
        assert kernels["portable"]["cpu_isa"] == "avx2-compatible"


def test_code_that_differs_from_the_runs_is_refused_unless_allowed(tmp_path: Path) -> None:
    """A run made in a git repository, then a commit: --spot refuses before replaying anything
    (exit 2, naming the commits and the option); with --allow-code-drift it replays, says so,
    and PASSes here (the change touched no code that runs)."""
    project = TinyProject.create(tmp_path / "repo")
    config = project.config("drift.yaml", train={"max_steps": 8, "save_every": 4, "keep_checkpoints": 4})

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=project.root, check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "start")
    project.run_cli("run", str(config), "--run-dir", "runs/drift", "--no-progress")
    (project.root / "notes.txt").write_text("a change\n")
    git("add", "notes.txt")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "change")
    refused = project.run_cli("verify", "runs/drift", "--spot", "--out", "spot-drift", check=False)
    assert refused.returncode == 2 and "the code differs" in refused.stderr
    assert "--allow-code-drift" in refused.stderr and not (project.root / "spot-drift").exists()
    assert "check out commit " in refused.stderr
    allowed = project.run_cli("verify", "runs/drift", "--spot", "--out", "spot-drift", "--allow-code-drift")
    assert "allowed by --allow-code-drift" in allowed.stdout and "verify: PASS  (spot" in allowed.stdout


def test_the_verdict_reaches_the_references_wandb_run(tiny_project: TinyProject) -> None:
    """A reference mirrored to W&B (offline): after verify --spot, the same W&B run (resumed by its
    id: a second offline run directory, which `wandb sync` merges) holds the verdict in its summary
    and a reprotune-verify-PASS tag, read back with wandb's own reader."""
    config = tiny_project.config(
        "spot-wandb.yaml",
        train={"max_steps": 8, "save_every": 4, "keep_checkpoints": 4},
        tracking={"mlflow": False, "wandb": True},
    )
    env = {"WANDB_MODE": "offline"}
    tiny_project.run_cli("run", str(config), "--run-dir", "runs/spot-wandb", "--no-progress", env=env)
    done = tiny_project.run_cli("verify", "runs/spot-wandb", "--spot", "--out", "spot-wandb-v", env=env)
    mirrored = json.loads((tiny_project.root / "runs" / "spot-wandb" / "record.json").read_text())["trackers"]
    run_id = mirrored["wandb"]["wandb_run_id"]
    assert f"verdict put on W&B run {run_id} (offline)" in done.stdout
    offline = sorted(Path(mirrored["wandb"]["run_dir"]).parent.glob(f"offline-run-*-{run_id}*"))
    assert len(offline) == 2  # the run's own, and the verdict's resume of it
    inspect = [sys.executable, "-m", "wandb", "leet", "inspect", "--summary", "--json", str(offline[-1])]
    shown = subprocess.run(inspect, capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
    summary = json.loads(shown.stdout)
    assert summary["run_id"] == run_id and "reprotune-verify-PASS" in summary["tags"]
    assert summary["summary"]["reprotune.verify.verdict"] == "PASS"
    assert summary["summary"]["reprotune.verify.mode"] == "spot"
    assert summary["summary"]["reprotune.verify.sha256"] == sha256_file(
        tiny_project.root / "spot-wandb-v" / "verification.json"
    )


def test_a_tracker_that_fails_never_changes_the_verdict(tiny_project: TinyProject, reference: Path) -> None:
    """The reference's MLflow store is broken (its SQLite file holds garbage): the spot check still
    PASSes with exit 0, and says in one warning line that the verdict could not be tagged."""
    run = _copy(reference, "spot-broken-store")
    broken = tiny_project.root / "broken.db"
    broken.write_text("not a database\n")
    record = json.loads((run / "record.json").read_text())
    record["trackers"]["mlflow"]["tracking_uri"] = f"sqlite:///{broken}"
    write_json_atomic(run / "record.json", record)
    done = tiny_project.run_cli("verify", str(run), "--spot", "--out", "spot-broken")
    assert "verify: PASS  (spot" in done.stdout
    warnings = [line for line in done.stdout.splitlines() if "could not put the verdict on MLflow" in line]
    assert len(warnings) == 1 and str(broken) in warnings[0]


def test_a_reference_whose_sqlite_store_is_not_here_is_not_tagged(tmp_path: Path) -> None:
    """The reference's store is a SQLite file this machine lacks (the run was copied here): one
    warning, and no empty store made where the record says it was."""
    from reprotune._proof.verdict_tags import _tag_mlflow
    from reprotune._run.record_sections import TrackerSummary

    store = tmp_path / "elsewhere" / "mlflow.db"
    mirrored = TrackerSummary(ok=True, tracking_uri=f"sqlite:///{store}", mlflow_run_id="abc")
    lines: list[str] = []
    result: Any = None  # not read: the store is looked for first
    assert _tag_mlflow(mirrored, result, tmp_path / "verification.json", lines.append) is False
    uri = f"sqlite:///{store}"
    assert lines == [f"warning: the verdict was not put on MLflow run abc: its store {uri} is not here"]
    assert not (tmp_path / "elsewhere").exists()


def test_a_replay_that_left_no_checkpoint_at_its_end_is_a_differing_end_state(tmp_path: Path) -> None:
    """An interval's replay whose end checkpoint is missing (or damaged) is judged, not a crash:
    its end state differs, saying why."""
    from reprotune._proof.spot import _end_state

    said, matched = _end_state(tmp_path / "reference", tmp_path / "replay", 5, 10)
    assert not matched and said.startswith("checkpoint 5 of the replay is refused: state.json unreadable")


def test_a_trainer_made_run_is_refused_for_what_it_is_before_its_mode_is_weighed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Trainer script's run recorded in a mode this reprotune cannot put in force: --spot says it
    replays no Trainer run and how to spot-check the script (before: a refusal of the mode, whose
    advice to replay it on another CPU could never help)."""
    from reprotune._cli import main
    from rundirs import RunSpec, write_run_dir

    spec = RunSpec(
        config={"trainer": {"class": "transformers.Trainer", "args": {}}},
        environment={"kernels": {"version": 1, "portable": {"cpu_isa": "avx9"}}},
    )
    run = write_run_dir(tmp_path / "trainer-run", spec)
    assert main(["verify", str(run), "--spot", "--out", str(tmp_path / "spot")]) == 2
    err = capsys.readouterr().err
    assert "was made by a Trainer script" in err and 'verify --command "python train.py ..." --spot' in err
    assert "avx9" not in err and not (tmp_path / "spot").exists()
