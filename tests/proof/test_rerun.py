"""``reprotune rerun``: reproduce a recorded run from its record alone, refusing code drift."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from reprotune._errors import InputError
from reprotune._proof.rerun import refuse_another_launch
from tinyrun import TinyProject


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[TinyProject, Path]:
    """A tiny project inside its own git repository, with one completed run recorded."""
    project = TinyProject.create(tmp_path_factory.mktemp("rerun"))
    project.config("cfg.yaml", train={"max_steps": 6, "save_every": 0})
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=project.root, check=True)
    (project.root / ".gitignore").write_text("runs/\n")
    subprocess.run([*git, "add", "-A"], cwd=project.root, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=project.root, check=True)
    project.run_cli("run", "cfg.yaml", "--run-dir", "runs/original", "--no-progress")
    return project, project.root / "runs" / "original"


def test_rerun_reproduces_identically(recorded: tuple[TinyProject, Path]) -> None:
    """From the record alone (config, manifest, seeds) the rerun is IDENTICAL, exit 0; on the same
    machine it reports no environment difference (the determinism flags and thread counts the
    rerun sets itself are not read before it sets them)."""
    project, original = recorded
    done = project.run_cli("rerun", str(original), "--run-dir", "runs/again", "--no-progress")
    assert "IDENTICAL" in done.stdout
    assert "environment differs" not in done.stdout, done.stdout
    a = json.loads((original / "record.json").read_text())
    b = json.loads((project.root / "runs" / "again" / "record.json").read_text())
    assert a["outputs"]["adapter_sha256"] == b["outputs"]["adapter_sha256"]
    assert (original / "split.json").read_bytes() == (
        project.root / "runs" / "again" / "split.json"
    ).read_bytes()


def test_rerun_refuses_code_drift(recorded: tuple[TinyProject, Path]) -> None:
    """An uncommitted change since the run: refused with exit 2 unless --allow-code-drift."""
    project, original = recorded
    script = project.root / "train_helper.py"
    script.write_text("# a change made after the run\n")
    try:
        done = project.run_cli("rerun", str(original), "--run-dir", "runs/drift", check=False)
        assert done.returncode == 2
        assert "code differs" in done.stderr and "--allow-code-drift" in done.stderr
        assert not (project.root / "runs" / "drift").exists()
        allowed = project.run_cli(
            "rerun", str(original), "--run-dir", "runs/drift", "--allow-code-drift", "--no-progress"
        )
        assert "allowed by --allow-code-drift" in allowed.stdout + allowed.stderr
        assert "IDENTICAL" in allowed.stdout
    finally:
        script.unlink()


def test_rerun_refuses_changed_data(recorded: tuple[TinyProject, Path], tmp_path: Path) -> None:
    """Data edited since the run: the rerun is refused (exit 1) naming the changed row."""
    project, original = recorded
    data = project.root / "data.jsonl"
    backup = tmp_path / "data.jsonl"
    shutil.copyfile(data, backup)
    try:
        lines = data.read_text().splitlines()
        lines[3] = lines[3].replace('"response":"', '"response":"changed ')
        data.write_text("\n".join(lines) + "\n")
        done = project.run_cli("rerun", str(original), "--run-dir", "runs/changed", check=False)
        assert done.returncode == 1
        assert "not the data the run was made from" in done.stderr
        assert "row 3" in done.stderr
    finally:
        shutil.copyfile(backup, data)


def test_rerun_of_a_non_run_directory(tiny_project: TinyProject, tmp_path: Path) -> None:
    """A directory without record.json: exit 2 with the fix."""
    done = tiny_project.run_cli("rerun", str(tmp_path), check=False)
    assert done.returncode == 2
    assert "not a run directory" in done.stderr


def test_resume_refuses_code_drift(recorded: tuple[TinyProject, Path]) -> None:
    """A run stopped, then the code changed: resume exits 2; with the code restored it completes."""
    project, _ = recorded
    project.run_cli("run", "cfg.yaml", "--run-dir", "runs/stopped", "--no-progress", "--stop-after-step", "2")
    script = project.root / "train_helper.py"
    script.write_text("# a change made while the run was stopped\n")
    try:
        refused = project.run_cli("resume", "runs/stopped", "--no-progress", check=False)
        assert refused.returncode == 2
        assert "code differs from the code the run was made with" in refused.stderr
        assert "before resuming" in refused.stderr
    finally:
        script.unlink()
    project.run_cli("resume", "runs/stopped", "--no-progress")
    assert (
        json.loads((project.root / "runs" / "stopped" / "record.json").read_text())["status"] == "completed"
    )


def test_a_run_whose_world_size_changed_reruns_only_within_a_tolerance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run started at world size 2 and resumed at 1 trained at both: no launch reruns it bit for
    bit, so a rerun at 2, as it started, is refused before it trains, naming the change and a
    comparison within a tolerance (before: it trained the whole run to print DIVERGED). With a
    tolerance it goes on; a world-size invariant run reruns at any world size."""
    launch = {"TORCHELASTIC_RUN_ID": "rerun-test", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    for name, value in launch.items():
        monkeypatch.setenv(name, value)
    change = {"from": 2, "to": 1, "at_step": 4, "attempt": 2}
    record = {
        "config": {"train": {}},
        "distributed": {"world_size": 2, "nodes": 1, "world_size_changes": [change]},
    }
    with pytest.raises(InputError) as refused:
        refuse_another_launch(record, rerun_args="runs/a", source="runs/a/record.json")
    assert str(refused.value) == (
        "runs/a/record.json (key distributed.world_size_changes): the run changed its world size when "
        "it resumed (2 -> 1 at step 4): its gradients were summed in the order of each world size in "
        "turn, so a rerun at any one world size would train the whole run to report a difference that "
        "is no change\nfix: compare within a tolerance instead: `torchrun --standalone --nproc_per_node 2 "
        "-m reprotune rerun runs/a --tolerance 1e-6` (it reruns at the world size the run started at), or "
        "`reprotune compare RUN_A RUN_B --tolerance 1e-6` with a run of your own (docs/distributed.md)"
    )
    refuse_another_launch(record, rerun_args="runs/a", source="runs/a/record.json", tolerance=1e-6)
    invariant = {**record, "config": {"train": {"world_size_invariant": True}}}
    refuse_another_launch(invariant, rerun_args="runs/a", source="runs/a/record.json")


@pytest.mark.distributed
@pytest.mark.slow
def test_a_run_made_under_torchrun_reruns_under_the_command_its_refusal_names(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A run made under torchrun (world size 2): a plain rerun is refused before training, naming
    `torchrun --standalone --nproc_per_node 2 -m reprotune rerun RUN_DIR`; that command, and its
    bundle's (`... rerun BUNDLE --out DIR`), rerun it IDENTICAL, rank 0 alone comparing and writing
    (before: the plain rerun trained the whole run in one process to a false DIVERGED)."""
    from torchruns import TRAIN, completed, launch

    project = TinyProject.create(tmp_path_factory.mktemp("dist-rerun"))
    project.config(
        "ddp.yaml", train={**TRAIN, "max_steps": 4}, distributed={"strategy": "ddp", "timeout_s": 120}
    )
    completed(launch(project, 2, "run", "ddp.yaml", "--run-dir", "runs/d", "--no-progress", "--no-tracking"))
    refused = project.run_cli("rerun", "runs/d", "--no-progress", check=False)
    assert refused.returncode == 2, refused.stderr
    assert "`torchrun --standalone --nproc_per_node 2 -m reprotune rerun runs/d`" in refused.stderr
    assert sorted(p.name for p in (project.root / "runs").iterdir()) == ["d"]
    again = completed(launch(project, 2, "rerun", "runs/d", "--run-dir", "runs/again", "--no-progress"))
    assert again.output.count("IDENTICAL") == 1, again.output[-3000:]
    project.run_cli("pack", "runs/d", "-o", "d.tar.gz", "--with-data")
    bundled = completed(launch(project, 2, "rerun", "d.tar.gz", "--out", "out", "--no-progress"))
    assert bundled.output.count("IDENTICAL") == 1, bundled.output[-3000:]
    assert json.loads((project.root / "out" / "rerun.json").read_text())["verdict"] == "IDENTICAL"
    assert sorted(p.name for p in (project.root / "out").iterdir()) == ["recorded", "rerun", "rerun.json"]
