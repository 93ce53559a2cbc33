"""The W&B tracker: a real offline W&B run, read back with wandb's own reader, no network touched;
a W&B that fails is switched off; without wandb installed, the config key names the extra."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reprotune._cli import main
from reprotune._config.schema import ExperimentConfig
from reprotune._errors import InputError
from reprotune._run.ledger import read_ledger
from reprotune._run.record import load_record
from reprotune._trackers.base import RunDescription, TrackerSet
from reprotune._trackers.wandb import WandbTracker
from reprotune._train.run import RunOptions, build_trackers
from tinyrun import TinyProject


def _leet(path: Path, *options: str) -> str:
    """wandb's own reader of an offline run (``WANDB_MODE=offline``: it looks nothing up)."""
    env = {**os.environ, "WANDB_MODE": "offline"}
    command = [sys.executable, "-m", "wandb", "leet", "inspect", *options, str(path)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=True).stdout


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to watch for network connections")
def test_run_mirrors_to_wandb_offline_without_network(tmp_path: Path) -> None:
    """`reprotune run` with tracking.wandb writes an offline W&B run whose summary holds the final
    train and validation losses bit for bit, with the config, tags and run artifact; the process
    (and the wandb-core service it starts) opens no internet socket."""
    project = TinyProject.create(tmp_path, n_rows=40)
    cfg = project.config(
        tracking={"mlflow": False, "wandb": True},
        train={"max_steps": 4, "eval_every": 2, "save_every": 2},
    )
    trace = tmp_path / "connect.trace"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    command = ["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=connect", "-o", str(trace)]
    command += [sys.executable, "-m", "reprotune", "run", str(cfg), "--run-dir", "run"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]

    connects = trace.read_text(encoding="utf-8").splitlines()
    assert any("AF_UNIX" in line for line in connects)  # the trace works: wandb-core's local socket
    assert [line for line in connects if "AF_INET" in line] == []

    record = load_record(tmp_path / "run")
    wandb_info = record["trackers"]["wandb"]
    assert wandb_info["ok"] and wandb_info["mode"] == "offline"
    run_dir = Path(wandb_info["run_dir"])
    assert run_dir.parent == tmp_path / "run" / "wandb"
    summary = json.loads(_leet(run_dir, "--summary", "--json"))
    ledger = read_ledger(tmp_path / "run" / "ledger.jsonl")
    assert summary["state"] == "finished"
    assert summary["summary"]["train_loss"] == ledger.train[-1].number("loss")
    assert summary["summary"]["val_loss"] == ledger.val[-1].number("loss")
    assert summary["summary"]["status"] == "completed"
    assert summary["config"]["train.max_steps"] == "4"
    assert summary["config"]["tags.config.sha256"] == record["config_sha256"]
    assert summary["config"]["tags.reprotune.run_dir"] == str((tmp_path / "run").resolve())
    records = [json.loads(line) for line in _leet(run_dir, "--json").splitlines() if line.strip()]
    history = {r["history"]["step"]["num"]: r["history"]["item"] for r in records if r["type"] == "history"}
    assert sorted(history) == [1, 2, 3, 4]
    artifacts = [r["artifact"] for r in records if r["type"] == "artifact"]
    assert [a["type"] for a in artifacts] == ["reprotune-run"]


@pytest.mark.parametrize(
    ("experiment", "project"),
    [("/Users/me@example.com/reprotune", "Users-me@example.com-reprotune"), ("team/llm", "team-llm")],
)
def test_an_mlflow_experiment_path_is_a_w_and_b_project_it_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, experiment: str, project: str
) -> None:
    """An experiment named as Databricks requires, or with a slash: W&B refused it as a project
    and was switched off for the whole run; its characters W&B refuses are dashes now."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    tracker = WandbTracker(experiment, directory=tmp_path)
    trackers = TrackerSet([tracker])
    trackers.start(RunDescription(run_id="r1", run_dir=tmp_path, params={}, tags={}))
    trackers.log_metrics(1, {"train_loss": 0.5})
    summary = trackers.finish("completed")["wandb"]
    assert summary["ok"] and summary["project"] == project, summary


def test_a_failing_wandb_is_switched_off_once(tmp_path: Path) -> None:
    """A W&B run that cannot start (an unknown mode) is reported once and dropped; the others go on."""
    lines: list[str] = []
    trackers = TrackerSet([WandbTracker("reprotune", mode="no-such-mode")], report=lines.append)
    run = RunDescription("20260101-000000-abcdef12", tmp_path, {"a": "1"}, {"b": "2"})
    trackers.start(run)
    trackers.log_metrics(1, {"train_loss": 1.0})
    summary: dict[str, Any] = trackers.finish("completed")
    assert trackers.trackers == []
    assert len(lines) == 1 and "tracker 'wandb' failed during start" in lines[0]
    assert summary["wandb"]["ok"] is False


def test_tracking_wandb_without_the_package_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """tracking.wandb: true where wandb cannot be imported: exit 2 naming the key and the extra,
    before anything is written."""
    monkeypatch.setitem(sys.modules, "wandb", None)
    cfg = ExperimentConfig.model_validate({"tracking": {"mlflow": False, "wandb": True}})
    with pytest.raises(InputError, match=r"pip install 'reprotune\[wandb\]'") as info:
        build_trackers(cfg, RunOptions(), print)
    assert info.value.source == "tracking.wandb"

    project = TinyProject.create(tmp_path / "p", n_rows=20)
    config = project.config(tracking={"mlflow": False, "wandb": True})
    assert main(["run", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()


def test_a_resumed_run_does_not_log_again_the_steps_its_w_and_b_run_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted after step 5, resumed from the checkpoint at step 3: the second attempt
    continues the W&B run and logs steps 6 and 7 alone, as MLflow does, not 4-5 again (before, it
    logged them twice: W&B's metrics_logged 8 where MLflow's was 4). The record's ``last_step``
    says how far the W&B run goes; offline, W&B cannot tell it (each attempt writes its own
    folder)."""
    from dataclasses import replace

    monkeypatch.setenv("WANDB_MODE", "offline")
    run = RunDescription(run_id="r1", run_dir=tmp_path, params={}, tags={})
    first = TrackerSet([WandbTracker("resumed", directory=tmp_path / "first")])
    first.start(run)
    for step in range(1, 6):
        first.log_metrics(step, {"train_loss": float(step), "lr": 0.1})
    before = first.finish("interrupted")
    assert before["wandb"]["metrics_logged"] == 10, before
    second = TrackerSet([WandbTracker("resumed", directory=tmp_path / "second")])
    second.start(replace(run, continues=before))
    for step in range(4, 8):
        second.log_metrics(step, {"train_loss": float(step), "lr": 0.1})
    after = second.finish("completed")["wandb"]
    assert after["wandb_run_id"] == before["wandb"]["wandb_run_id"], (before, after)
    assert after["metrics_logged"] == 4, after
    assert (before["wandb"]["last_step"], after["last_step"]) == (5, 7), (before, after)
    records = [
        json.loads(line) for line in _leet(Path(after["run_dir"]), "--json").splitlines() if line.strip()
    ]
    assert sorted(r["history"]["step"]["num"] for r in records if r["type"] == "history") == [6, 7]
