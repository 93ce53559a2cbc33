"""``reprotune verify --command`` on examples/hf_trainer.py (tiny model): rerun IDENTICAL, the
data-seed control DIVERGED, the Trainer's own resume judged; another seed DIVERGED naming it;
bad usage exits 2 before anything runs."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from trainer_scripts import OFFLINE_ENV, ScriptProject

from mlflowstore import seed_mlflow_store
from reprotune._cli import main
from reprotune._proof.compare import compare_runs
from reprotune._run.ledger import read_ledger
from reprotune._run.record import load_record
from warm import run_reprotune

pytestmark = pytest.mark.slow  # several trainings in fresh processes


Verified = tuple[ScriptProject, subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> Verified:
    """One verification of the Trainer example with a resume leg at step 3 (of 6)."""
    project = ScriptProject.create(tmp_path_factory.mktemp("verify-command"))
    command = shlex.join(project.argv("hf_trainer.py"))
    args = ["verify", "--out", "ver", "--command", command, "--resume-at", "3"]
    done = run_reprotune(args, cwd=project.root, env={**os.environ, **OFFLINE_ENV}, timeout=3000)
    return project, done


def test_verify_command_passes_and_reports_the_resume_leg(
    verified: Verified,
) -> None:
    """PASS (exit 0): rerun IDENTICAL, control DIVERGED by the data-order seed, and the resume
    leg's verdict on the Trainer's own resume_from_checkpoint, all in verification.json."""
    project, done = verified
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "verify: PASS" in done.stdout
    report = json.loads((project.root / "ver" / "verification.json").read_text(encoding="utf-8"))
    assert report["schema"] == "reprotune/command-verification" and report["verdict"] == "PASS"
    # What a config's verification holds too (schema 3): the reference, its duration, the machine, the cost.
    command = shlex.join(project.argv("hf_trainer.py"))
    assert (report["schema_version"], report["mode"], report["command"]) == (3, "command", command)
    assert report["reference"] == str((project.root / "ver" / "reference").resolve())
    assert report["config_sha256"] == load_record(project.root / "ver" / "reference")["config_sha256"]
    assert report["reference_s"] > 0 and report["wall_s"] > 0 and report["machine"]["host"]
    assert report["cost"] == round(report["wall_s"] / report["reference_s"], 3)
    legs = {leg["name"]: leg for leg in report["legs"]}
    assert legs["rerun"]["verdict"] == "IDENTICAL"
    assert legs["control-data-seed"]["verdict"] == "DIVERGED"
    assert "derived seed data_order" in legs["control-data-seed"]["note"]
    resume = legs["resume"]
    assert resume["verdict"] in ("IDENTICAL", "DIVERGED") and resume["evidence"]["resumed_at"] == 3
    assert f"resume            {resume['verdict']}" in done.stdout
    for leg in legs.values():  # each leg's processes' wall time, and its steps' time from its record
        assert leg["wall_s"] > 0 and 0 < leg["train_s"] < leg["wall_s"], leg

    record = load_record(project.root / "ver" / "resume")
    attempts = record["attempts"]
    assert [a["resumed"] for a in attempts] == [False, True] and attempts[1]["from_step"] == 3
    assert attempts[1]["from_checkpoint"].endswith("trainer-output/checkpoint-3")
    assert len(read_ledger(project.root / "ver" / "resume" / "ledger.jsonl").train) == 6


def test_the_report_of_a_command_verification_says_what_the_command_proved(
    verified: Verified, tmp_path: Path
) -> None:
    """``reprotune report`` of the verification directory opens with what the command proved: the
    command, the rerun, the Trainer's own resume and the data-order control, the machine and the
    cost; not a config's mode or config sha256."""
    project, done = verified
    assert done.returncode == 0, done.stderr[-3000:]
    page = tmp_path / "report.html"
    assert main(["report", str(project.root / "ver"), "-o", str(page)]) == 0
    html = page.read_text(encoding="utf-8")
    first = html[html.index("What was proven") : html.index("</table>")]
    assert "verify PASS" in first and "The command reproduces" in first
    assert "hf_trainer.py" in first and "stopped after step 3 and resumed" in first
    assert "config sha256" not in first and "None mode" not in first and "command mode" not in first
    assert "Machine:" in first and " s of legs for a " in first
    for leg in ("rerun", "control-data-seed", "resume"):
        assert f"<td>{leg}</td>" in first


def test_trainer_runs_in_two_processes_are_identical(
    verified: Verified,
) -> None:
    """The reference and the rerun: byte-identical ledgers and adapters."""
    project, done = verified
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = project.root / "ver" / "reference", project.root / "ver" / "rerun"
    assert compare_runs(a, b).verdict.value == "IDENTICAL"
    assert (a / "ledger.jsonl").read_bytes() == (b / "ledger.jsonl").read_bytes()
    weights = "adapter/adapter_model.safetensors"
    assert (a / weights).read_bytes() == (b / weights).read_bytes()


def test_another_seed_diverges_and_the_cause_names_it(
    verified: Verified,
) -> None:
    """The same script with --seed 43: DIVERGED from step 0 (LoRA init) and the first cause is
    the root seed, 42 vs 43."""
    project, done = verified
    assert done.returncode == 0, done.stderr[-3000:]
    project.run("hf_trainer.py", "seed43", "--seed", "43")
    comparison = compare_runs(project.root / "ver" / "reference", project.root / "seed43")
    assert comparison.verdict.value == "DIVERGED"
    assert comparison.where.first_divergence_step == 0
    assert "root seed 42 vs 43" in comparison.causes[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["verify", "--resume-at", "3"], "--resume-at needs --command"),
        (["verify", "cfg.yaml", "--command", "python train.py"], "cannot go with it"),
        (["verify", "--command", "python train.py", "--thorough"], "cannot go with it"),
        (["verify", "--command", "  "], "the command is empty"),
        (["verify", "--command", "python 'unclosed"], "cannot split the command"),
        (["verify", "--command", "python train.py", "--resume-at", "0"], "is not a step >= 1"),
        (["verify"], "verify needs a config, or --command"),
        (["verify", "--command", "python train.py", "--control-seed", "root"], "cannot go with it"),
        (["verify", "--command", "python train.py", "--seed", "3"], "--seed goes with --spot"),
        (["verify", "--command", "python train.py", "--allow-code-drift"], "--allow-code-drift goes with"),
        (["verify", "cfg.yaml", "--budget", "0.5"], "--budget goes with --spot"),
        (["verify", "run", "--spot", "--control-seed", "root"], "none of --command"),
    ],
    ids=[
        "resume-without-command",
        "config-and-command",
        "thorough-and-command",
        "empty",
        "unclosed-quote",
        "resume-at-0",
        "nothing",
        "control-seed-and-command",
        "seed-without-spot",
        "code-drift-without-spot",
        "budget-without-spot",
        "control-seed-and-spot",
    ],
)
def test_bad_usage_exits_2_before_running(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """Each misuse names the option and the fix, and writes nothing."""
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--out", str(tmp_path / "ver")]) == 2
    err = capsys.readouterr().err
    assert message in err and "fix:" in err
    assert not (tmp_path / "ver").exists()


@pytest.mark.parametrize("spot", [[], ["--spot"]], ids=["command", "command-spot"])
def test_an_out_inside_a_run_directory_is_refused_before_running(
    spot: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """``--out`` inside a run directory (a verification would write into a run): exit 2 before the
    command runs, with and without ``--spot``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "record.json").write_text("{}")
    assert main(["verify", "--command", "python train.py", *spot, "--out", "run/ver"]) == 2
    assert "is inside" in capsys.readouterr().err
    assert not (tmp_path / "run" / "ver").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["verify", "--command", "python train.py"],
        ["verify", "--command", "python train.py", "--spot"],
        ["verify", "runs/x", "--spot"],
    ],
    ids=["command", "command-spot", "spot"],
)
def test_verify_command_or_spot_under_torchrun_is_refused(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """Under torchrun every rank would run the command or the replays and write one --out (before,
    each rank did): exit 2 on every rank, naming the form and the fix, nothing written."""
    monkeypatch.chdir(tmp_path)
    for rank in ("0", "1"):
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "verify-under-torchrun")
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert main([*argv, "--out", str(tmp_path / "ver")]) == 2
        err = capsys.readouterr().err
        assert "runs under torchrun here: every rank would run it and write the same --out" in err
        assert "run verify itself without torchrun" in err
    assert not (tmp_path / "ver").exists()


def test_a_command_without_the_callback_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """A command that trains nothing reprotune can see: exit 2 (a script to fix, not a FAIL),
    saying the callback is missing."""
    monkeypatch.chdir(tmp_path)
    command = shlex.join([sys.executable, "-c", "print('trained, unrecorded')"])
    assert main(["verify", "--command", command, "--out", "ver"]) == 2
    err = capsys.readouterr().err
    assert "wrote no run directory" in err and "ReprotuneCallback" in err
    assert not (tmp_path / "ver").exists()  # refused: nothing left behind, so --out can be used again


def test_verify_command_itself_needs_no_torch() -> None:
    """The orchestration (and the W&B tracker module) import neither torch nor wandb: the user's
    script does the training, in its own processes."""
    code = (
        "import sys, reprotune._proof.verify_command, reprotune._trackers.wandb; "
        "print(sorted(m for m in ('torch', 'wandb', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_resume_step_past_the_end_is_refused_after_the_reference_alone(tmp_path: Path) -> None:
    """``--resume-at`` at or after the last step: exit 2 once the reference has shown the run's
    length, before the rerun and control legs spend their training; the refusal leaves no --out
    behind, so the same --out can be given again."""
    project = ScriptProject.create(tmp_path)
    command = shlex.join(project.argv("hf_trainer.py"))
    done = run_reprotune(
        ["verify", "--out", "ver", "--command", command, "--resume-at", "6"],
        cwd=project.root,
        env={**os.environ, **OFFLINE_ENV},
        timeout=3000,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "--resume-at 6 is not before the run's last step (6)" in done.stderr
    assert "choose a step from 1 to 5" in done.stderr
    assert "verify: reference ..." in done.stdout and "verify: rerun" not in done.stdout
    assert not (project.root / "ver").exists()


def test_verify_command_spot_replays_intervals_between_the_trainers_checkpoints(tmp_path: Path) -> None:
    """``--command --spot`` on the Trainer example saving a checkpoint every 2 of 6 steps, budget 1:
    the reference, then every interval (steps 1-2 from the start, 3-4 and 5-6 resumed from the
    Trainer's own checkpoints through resume_from_checkpoint), each IDENTICAL in its ledger lines
    and its end state (the Trainer checkpoint's weights, optimizer, scheduler and RNG files, or the
    adapter), and the data-seed control DIVERGED: PASS."""
    project = ScriptProject.create(tmp_path)
    command = shlex.join(project.argv("hf_trainer.py", "--save-steps", "2"))
    done = run_reprotune(
        ["verify", "--out", "ver", "--command", command, "--spot", "--budget", "1"],
        cwd=project.root,
        env={**os.environ, **OFFLINE_ENV},
        timeout=3000,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    report = json.loads((project.root / "ver" / "verification.json").read_text(encoding="utf-8"))
    assert (report["schema_version"], report["verdict"], report["mode"]) == (3, "PASS", "command")
    assert [(i["start"], i["end"]) for i in report["spot"]["intervals"]] == [(0, 2), (2, 4), (4, 6)]
    legs = {leg["name"]: leg for leg in report["legs"]}
    for name in ("steps 1-2", "steps 3-4", "steps 5-6"):
        assert legs[name]["verdict"] == "IDENTICAL", legs[name]
    assert legs["steps 3-4"]["evidence"]["end_state"].startswith("Trainer checkpoint-4: ")
    assert "optimizer.pt" in legs["steps 3-4"]["evidence"]["end_state"]
    assert "rng_state.pth" in legs["steps 3-4"]["evidence"]["end_state"]
    assert legs["steps 5-6"]["evidence"]["end_state"] == "adapter sha256 identical"
    assert "Trainer checkpoint-4" in legs["steps 5-6"]["note"]
    assert all(leg["wall_s"] > 0 for leg in legs.values()), legs
    assert legs["control-data-seed"]["verdict"] == "DIVERGED"
    assert "covered: 3 of 3 intervals, 6 of 6 steps" in done.stdout


def test_the_trainers_own_mlflow_run_gets_reprotunes_tags_and_artifacts(tmp_path: Path) -> None:
    """The Trainer example with report_to="mlflow" (the Trainer's MLflowCallback makes the run):
    that same run, the experiment's only one, holds the Trainer's metrics and reprotune's tags
    (config, data, manifest and model hashes, git commit and dirty flag, run directory) and the
    record, ledger, adapter and manifest as artifacts; the record names it; read back with
    MLflow's client."""
    from mlflow.tracking import MlflowClient

    project = ScriptProject.create(tmp_path)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"MLFLOW_TRACKING_URI": store, "MLFLOW_EXPERIMENT_NAME": "trainer"}
    with pytest.MonkeyPatch.context() as patch:
        # MLflow's reader resolves a run's artifacts through the default tracking URI and the
        # current directory on older versions (the floor stack): both the script's here.
        patch.chdir(project.root)
        for key, value in env.items():
            patch.setenv(key, value)
        project.run("hf_trainer.py", "runs/mlflow", "--report-to", "mlflow")
        record = load_record(project.root / "runs" / "mlflow")
        linked = record["trackers"]["mlflow"]
        assert linked["ok"] and linked["linked"] == "the Trainer's run"
        client = MlflowClient(tracking_uri=store)
        experiment = client.get_experiment_by_name("trainer")
        runs = client.search_runs([experiment.experiment_id])
        assert [r.info.run_id for r in runs] == [linked["mlflow_run_id"]]  # the same run, not a second
        run = runs[0]
        assert "train_loss" in run.data.metrics or "loss" in run.data.metrics  # the Trainer's own logging
        tags = run.data.tags
        assert (
            tags["config.sha256"] == record["config_sha256"] and tags["reprotune.run_id"] == record["run_id"]
        )
        assert tags["data.manifest_sha256"] == str(record["data"]["manifest_sha256"])
        assert tags["model.weights_sha256"] == str(record["model"]["weights_sha256"])
        assert {"git.commit", "git.dirty"} <= set(tags) and tags["reprotune.status"] == "completed"
        assert tags["reprotune.run_dir"] == str((project.root / "runs" / "mlflow").resolve())
        listed = {a.path for a in client.list_artifacts(run.info.run_id, "reprotune")}
        assert {"reprotune/record.json", "reprotune/ledger", "reprotune/adapter", "reprotune/split"} <= listed


def test_mlflow_true_starts_the_run_when_the_trainer_reports_nowhere(tmp_path: Path) -> None:
    """``ReprotuneCallback(mlflow=True)`` with report_to="none": the run is mirrored as ``reprotune
    run`` mirrors one (its MLflow tracker: the tracking URI and experiment in force), one MLflow run
    with every step's train_loss, reprotune's tags and artifacts, ended FINISHED; the record names it."""
    from mlflow.tracking import MlflowClient

    project = ScriptProject.create(tmp_path)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project.root)
        patch.setenv("MLFLOW_TRACKING_URI", store)
        patch.setenv("MLFLOW_EXPERIMENT_NAME", "own")
        done = project.run("hf_trainer.py", "runs/own", "--mlflow")
        record = load_record(project.root / "runs" / "own")
        mirrored = record["trackers"]["mlflow"]
        assert mirrored["ok"] and mirrored["experiment"] == "own" and mirrored["metrics_logged"] > 0
        assert "no MLflow run is active: the run is mirrored to a new one at sqlite:///" in done.stderr
        client = MlflowClient(tracking_uri=store)
        runs = client.search_runs([client.get_experiment_by_name("own").experiment_id])
        assert [r.info.run_id for r in runs] == [mirrored["mlflow_run_id"]]
        run = runs[0]
        assert run.info.status == "FINISHED" and run.data.tags["config.sha256"] == record["config_sha256"]
        assert run.data.tags["reprotune.run_dir"] == str((project.root / "runs" / "own").resolve())
        history = client.get_metric_history(run.info.run_id, "train_loss")
        ledger = read_ledger(project.root / "runs" / "own" / "ledger.jsonl")
        assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [
            (e.fields["step"], float.fromhex(e.fields["loss"])) for e in ledger.train
        ]
        listed = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"record.json", "ledger", "adapter"} <= listed


def _reference_only_script(tmp_path: Path, otherwise: str) -> Path:
    """A script whose reference leg copies the run directory given as its argument, and whose
    other legs do ``otherwise`` (Python lines, indented once)."""
    script = tmp_path / "script.py"
    script.write_text(
        "import os, shutil, sys, time\n"
        "target = os.environ['REPROTUNE_RUN_DIR']\n"
        "if target.endswith('reference'):\n"
        "    shutil.copytree(sys.argv[1], target)\n"
        "else:\n" + otherwise
    )
    return script


def test_a_leg_past_its_time_fails_the_verification_and_the_rest_are_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference finishes; the rerun hangs past its bound (1 s here, for the test): verify
    still ends with a verdict, FAIL, and writes verification.json; the rerun leg is FAILED saying
    it ran past its time, and the legs after it are not run (n/a), each of which would have
    waited as long. Before, verify raised with no verification.json."""
    from reprotune._proof import command_legs, verify_command
    from rundirs import RunSpec, write_run_dir

    made = write_run_dir(tmp_path / "made", RunSpec())
    script = _reference_only_script(tmp_path, "    time.sleep(600)\n")
    monkeypatch.setattr(command_legs, "MIN_LEG_TIMEOUT_S", 1.0)
    monkeypatch.setattr(command_legs, "LEG_TIMEOUT_FACTOR", 0.0)
    command = shlex.join([sys.executable, str(script), str(made)])
    result = verify_command.verify_command(
        command, tmp_path / "ver", resume_at=3, cwd=tmp_path, progress=lambda _: None
    )
    assert result.verdict == "FAIL"
    report = json.loads((tmp_path / "ver" / "verification.json").read_text(encoding="utf-8"))
    legs = {leg["name"]: leg for leg in report["legs"]}
    assert report["verdict"] == "FAIL" and list(legs) == ["rerun", "control-data-seed", "resume"]
    assert (legs["rerun"]["verdict"], legs["rerun"]["passed"]) == ("FAILED", False)
    assert "the rerun leg did not finish within 1 s" in legs["rerun"]["note"]
    for name in ("control-data-seed", "resume"):
        assert (legs[name]["verdict"], legs[name]["passed"]) == (None, None)
        assert legs[name]["note"] == "not run: the rerun leg ran past its time"
    assert legs["resume"]["evidence"] == {"resumed_at": 3}
    shown = result.format()
    assert "[FAIL] rerun" in shown and "[n/a ] control-data-seed" in shown


def test_a_leg_whose_command_fails_after_the_reference_is_a_failed_leg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference finishes; every later leg's command exits 3: verify still ends with FAIL and
    verification.json, each leg FAILED with the exit code and the script's last lines (the resume
    leg at its first command), and the failed legs' run directories absolute as a run leg's are."""
    from reprotune._proof import verify_command
    from rundirs import RunSpec, write_run_dir

    made = write_run_dir(tmp_path / "made", RunSpec())
    script = _reference_only_script(
        tmp_path, "    print('boom: out of memory', file=sys.stderr)\n    sys.exit(3)\n"
    )
    monkeypatch.chdir(tmp_path)
    command = shlex.join([sys.executable, str(script), str(made)])
    result = verify_command.verify_command(command, Path("ver"), resume_at=3, progress=lambda _: None)
    assert result.verdict == "FAIL"
    report = json.loads((tmp_path / "ver" / "verification.json").read_text(encoding="utf-8"))
    legs = {leg["name"]: leg for leg in report["legs"]}
    assert list(legs) == ["rerun", "control-data-seed", "resume"]
    for name, leg in legs.items():
        assert (leg["verdict"], leg["passed"]) == ("FAILED", False), leg
        assert f"the {name} leg's command failed with exit code 3" in leg["note"]
        assert "boom: out of memory" in leg["note"]
        assert leg["run_dir"] == str(tmp_path / "ver" / name)
    assert legs["resume"]["evidence"] == {"resumed_at": 3}


def test_a_leg_that_writes_no_run_directory_after_the_reference_is_a_failed_leg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference writes its run; the later legs exit 0 without one: FAILED legs, FAIL (exit 1),
    verification.json written and the reference kept. Such a leg was a refusal that removed the
    whole verification directory, the finished reference with it."""
    from rundirs import RunSpec, write_run_dir

    made = write_run_dir(tmp_path / "made", RunSpec())
    script = _reference_only_script(tmp_path, "    pass\n")
    monkeypatch.chdir(tmp_path)
    command = shlex.join([sys.executable, str(script), str(made)])
    assert main(["verify", "--command", command, "--out", "ver"]) == 1
    report = json.loads((tmp_path / "ver" / "verification.json").read_text(encoding="utf-8"))
    legs = {leg["name"]: leg for leg in report["legs"]}
    assert list(legs) == ["rerun", "control-data-seed"]
    for name, leg in legs.items():
        assert (leg["verdict"], leg["passed"]) == ("FAILED", False), leg
        assert f"the {name} leg's command wrote no run directory" in leg["note"]
    assert load_record(tmp_path / "ver" / "reference")["status"] == "completed"


def test_a_command_verification_puts_its_verdict_on_the_reference_runs_mlflow_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``verify --command`` ends as ``verify`` of a config does: the verdict, mode ``command`` and
    ``verification.json`` land on the MLflow run the reference leg's record names (the Trainer's
    own run, or the callback's), read back with MLflow's client. Here every leg copies one made run
    whose record names a run in a SQLite store, so the control does not part: FAIL, exit 1."""
    from mlflow.tracking import MlflowClient

    from reprotune._run.record import write_record
    from rundirs import RunSpec, write_run_dir

    store = seed_mlflow_store(tmp_path / "mlflow.db")
    client = MlflowClient(tracking_uri=store)
    experiment = client.create_experiment("trainer", artifact_location=str(tmp_path / "artifacts"))
    mlflow_run = client.create_run(experiment).info.run_id
    made = write_run_dir(tmp_path / "made", RunSpec())
    record = load_record(made)
    write_record(made / "record.json", {**record, "trackers": {"mlflow": _linked(store, mlflow_run)}})
    script = _reference_only_script(tmp_path, "    shutil.copytree(sys.argv[1], target)\n")
    monkeypatch.chdir(tmp_path)
    # Older MLflow (the floor stack) resolves a run's artifacts through the default tracking URI.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    command = shlex.join([sys.executable, str(script), str(made)])
    assert main(["verify", "--command", command, "--out", "ver"]) == 1
    tags = client.get_run(mlflow_run).data.tags
    assert (tags["reprotune.verify.verdict"], tags["reprotune.verify.mode"]) == ("FAIL", "command")
    assert tags["reprotune.verify.directory"] == str((tmp_path / "ver").resolve())
    listed = {a.path for a in client.list_artifacts(mlflow_run, "reprotune")}
    assert listed == {"reprotune/verification.json"}


def _linked(store: str, run_id: str) -> dict[str, Any]:
    """A record's ``trackers.mlflow`` of a Trainer's run the callback linked."""
    return {"ok": True, "tracking_uri": store, "mlflow_run_id": run_id, "linked": "the Trainer's run"}


@pytest.mark.parametrize(
    "argv",
    [["verify", "cfg.yaml"], ["rerun", "runs/x"]],
    ids=["verify", "rerun"],
)
def test_a_stale_torchelastic_run_id_is_bad_input_for_verify_and_rerun(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """TORCHELASTIC_RUN_ID left in a shell: verify and rerun exit 2 naming the variables the launch
    lacks (before: verify launched its legs as torchrun launches, rerun counted world size 1 or
    crashed on WORLD_SIZE=x), as run, resume and doctor do."""
    from rundirs import write_run_dir

    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.yaml").write_text("seed:\n  root: 1\n")
    write_run_dir(tmp_path / "runs" / "x")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "leftover")
    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "x")
    assert main(argv) == 2
    assert (
        "TORCHELASTIC_RUN_ID is set, as under torchrun, but the launch's variables are not"
        in capsys.readouterr().err
    )


def test_verify_over_several_nodes_is_refused_on_every_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """verify's legs are torchrun launches on rank 0's node: a verify launched over two nodes (two
    processes each) is refused on every rank, naming both sizes and the one-node launch, before
    any config is read (before, rank 0 launched all four processes on its own node)."""
    monkeypatch.chdir(tmp_path)
    for rank in ("0", "1", "2", "3"):
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "verify-over-nodes")
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "4")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        assert main(["verify", "missing.yaml", "--out", str(tmp_path / "ver")]) == 2
        err = capsys.readouterr().err
        assert "over several nodes here (LOCAL_WORLD_SIZE=2, WORLD_SIZE=4)" in err
        assert "torchrun --standalone --nproc_per_node N -m reprotune verify" in err
    assert not (tmp_path / "ver").exists()


def test_verify_spot_names_an_out_it_cannot_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """verify RUN --spot --out under a file: exit 2 naming --out, as verify's other forms do (the
    message named no option), before the run is read."""
    (tmp_path / "file").write_text("mine")
    out = tmp_path / "file" / "ver"
    assert main(["verify", str(tmp_path / "run"), "--spot", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {str(out)!r} cannot be written" in err and "is a file, not a directory" in err
