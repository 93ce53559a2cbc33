"""Seed studies of the tiny model, end to end: study.json, resume after SIGKILL, --jobs, the verdicts.

Every study here trains the tiny model: 3 seeds x 6 steps (the kill, --jobs, real-effect and
disjoint-seeds tests compare with one reference study), a ``--vary each`` study of 2 seeds x 3
steps, and a study of 2 seeds x 2 steps with MLflow on.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from mlflowstore import seed_mlflow_store
from reprotune._cli import main
from reprotune._config.loading import load_config
from reprotune._determinism.seeds import derive_seeds
from reprotune._errors import InputError
from reprotune._run.record import load_record
from reprotune._studies.significance import significance
from reprotune._studies.study import StudyOptions, StudyResult, run_study
from reprotune._studies.studyfile import load_study
from tinyrun import TinyProject
from warm import fork_legs_here

pytestmark = pytest.mark.slow

N = 3
TRAIN = {"batch_size": 4, "max_steps": 6, "eval_every": 3, "save_every": 3, "learning_rate": 1.0e-2}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> TinyProject:
    project = TinyProject.create(tmp_path_factory.mktemp("study-project"))
    project.config("cfg.yaml", train=TRAIN)
    return project


def _study(project: TinyProject, out: Path, *sets: str, vary: str = "all", n: int = N) -> StudyResult:
    cfg = load_config(project.root / "cfg.yaml", list(sets))
    return run_study(cfg, n=n, vary=vary, options=StudyOptions(out=out, tracking=False, name="cfg"))


@pytest.fixture(scope="module")
def reference(project: TinyProject) -> StudyResult:
    """The study of the tiny config: 3 runs, every seed moving, uninterrupted, in this process."""
    return _study(project, project.root / "reference")


def test_study_json(project: TinyProject, reference: StudyResult) -> None:
    """Three completed ordinary run directories whose seeds follow the rule, their exact final
    validation losses, the summary, and the report."""
    study = load_study(reference.directory)
    assert study["status"] == "completed" and reference.actions == {f"all-{k:03d}": "ran" for k in range(N)}
    values = []
    for run in study["runs"]:
        record = load_record(reference.directory / run["dir"] / "record.json")
        assert record["status"] == "completed" and run["seeds"] == record["seeds"]
        assert record["seeds"] == derive_seeds(run["seed"])  # a new root, no overrides
        assert run["metrics"] == {"final_val_loss": float.fromhex(record["outputs"]["final_val_loss"])}
        assert run["adapter_sha256"] == record["outputs"]["adapter_sha256"]
        values.append(run["metrics"]["final_val_loss"])
        assert study["data"] == {"file_sha256": record["data"]["file_sha256"], "runs_agree": True}
    summary = study["summary"]["all"]["final_val_loss"]
    assert summary["values"] == values and summary["ci_low"] <= summary["mean"] <= summary["ci_high"]
    html = (reference.directory / "report.html").read_text(encoding="utf-8")
    assert html.count("<circle") == N and "<script" not in html


def test_rerun_keeps_verified_runs_and_refuses_changed_ones(reference: StudyResult, tmp_path: Path) -> None:
    """The same study again trains nothing and rewrites the same bytes; a completed run whose
    adapter changed since is refused, naming it and how to redo it."""
    copy = tmp_path / "copy"
    shutil.copytree(reference.directory, copy)
    cfg = load_config(copy / "config.yaml")
    again = run_study(cfg, n=N, vary="all", options=StudyOptions(out=copy, tracking=False, name="cfg"))
    assert set(again.actions.values()) == {"kept"}
    assert (copy / "study.json").read_bytes() == (reference.directory / "study.json").read_bytes()
    adapter = copy / "runs" / "all-001" / "adapter" / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:-1] + b"\x00")
    with pytest.raises(InputError, match="the completed run all-001 no longer matches its record") as info:
        run_study(cfg, n=N, vary="all", options=StudyOptions(out=copy, tracking=False, name="cfg"))
    assert "remove" in str(info.value) and "all-001" in str(info.value)
    # The refusal leaves the completed study.json as it was (it was set back to running, with
    # its runs planned again).
    assert (copy / "study.json").read_bytes() == (reference.directory / "study.json").read_bytes()


def test_a_damaged_study_json_is_rebuilt_from_its_runs(reference: StudyResult, tmp_path: Path) -> None:
    """study.json edited by hand: refused with a fix that works (its old fix, "run the same command
    again", gave the same refusal); removing it as told, the same command keeps every run and
    writes the same study.json bytes (before, the directory was "not a study directory"). A number
    edited within the schema is no refusal: the same command writes study.json anew from the runs
    (as docs/seed-studies.md says; it said such a file "is refused")."""
    copy = tmp_path / "copy"
    shutil.copytree(reference.directory, copy)
    cfg = load_config(copy / "config.yaml")
    options = StudyOptions(out=copy, tracking=False, name="cfg")
    study = json.loads((copy / "study.json").read_text(encoding="utf-8"))
    study["runs"][0]["metrics"]["final_val_loss"] = 1.0
    (copy / "study.json").write_text(json.dumps(study), encoding="utf-8")
    assert set(run_study(cfg, n=N, vary="all", options=options).actions.values()) == {"kept"}
    assert (copy / "study.json").read_bytes() == (reference.directory / "study.json").read_bytes()
    del study["runs"]
    (copy / "study.json").write_text(json.dumps(study), encoding="utf-8")
    with pytest.raises(InputError) as info:
        run_study(cfg, n=N, vary="all", options=options)
    assert info.value.fix is not None and info.value.fix.startswith(f"remove {copy / 'study.json'} and run")
    (copy / "study.json").unlink()
    again = run_study(cfg, n=N, vary="all", options=options)
    assert set(again.actions.values()) == {"kept"}
    assert (copy / "study.json").read_bytes() == (reference.directory / "study.json").read_bytes()
    (copy / "study.json").unlink()
    (copy / "runs" / "stranger").mkdir()  # not a run of this plan: not taken for this study's
    with pytest.raises(InputError, match="is not a study directory"):
        run_study(cfg, n=N, vary="all", options=options)


def test_sigkill_then_continue_gives_the_same_study(
    project: TinyProject, reference: StudyResult, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """A study killed (SIGKILL) in its second run's 4th step continues: the first run is kept, the
    second resumed from its step-3 checkpoint, the third run; study.json is byte-identical."""
    out = project.root / "killed"
    done = project.run_cli(
        "seeds",
        "cfg.yaml",
        "--n",
        str(N),
        "--out",
        str(out),
        env={"REPROTUNE_KILL_AT": "step-end:10"},
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    partial = load_study(out)
    assert partial["status"] == "running"
    assert [r["status"] for r in partial["runs"]] == ["completed", "planned", "planned"]
    monkeypatch.chdir(project.root)
    assert main(["seeds", "cfg.yaml", "--n", str(N), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert re.search(r"all-000 \(root seed \d+\): verified and kept", err), err
    assert re.search(r"all-001 \(root seed \d+\): resumed in", err), err
    assert re.search(r"all-002 \(root seed \d+\): ran in", err), err
    assert (out / "study.json").read_bytes() == (reference.directory / "study.json").read_bytes()


def test_jobs_give_the_same_study(
    project: TinyProject, reference: StudyResult, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """--jobs 2 (each run in its own process, forked from the tests' warm zygote) ends with the
    same study.json, byte for byte."""
    assert fork_legs_here(monkeypatch) or os.environ.get("REPROTUNE_TESTS_COLD")
    out = project.root / "jobs"
    monkeypatch.chdir(project.root)
    assert main(["seeds", "cfg.yaml", "--n", str(N), "--jobs", "2", "--out", str(out)]) == 0
    assert "ran 3" in capsys.readouterr().out
    assert sorted(p.name for p in (out / "logs").iterdir()) == [f"all-{k:03d}.log" for k in range(N)]
    assert (out / "study.json").read_bytes() == (reference.directory / "study.json").read_bytes()


def test_a_killed_study_leaves_no_run_training_as_an_orphan(project: TinyProject) -> None:
    """--jobs 2, the study SIGKILLed while its runs train: each run's process ends too (SIGTERM from
    the kernel) and records itself interrupted, for the same command to resume; before, the runs
    trained on as orphans into the study directory."""
    project.config("long.yaml", train={**TRAIN, "max_steps": 5000, "save_every": 0, "eval_every": 5000})
    out = project.root / "orphans"
    study = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reprotune",
            "seeds",
            "long.yaml",
            "--n",
            "2",
            "--jobs",
            "2",
            "--out",
            str(out),
        ],
        cwd=project.root,
        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300  # until both runs have made their run directories: they train
    while len(list(out.rglob("record.json"))) < 2 and time.monotonic() < deadline:
        assert study.poll() is None, "the study ended before its runs trained"
        time.sleep(0.2)
    runs = [p for p in psutil.Process(study.pid).children() if "reprotune" in " ".join(p.cmdline())]
    assert len(runs) == 2, runs
    os.kill(study.pid, signal.SIGKILL)
    study.wait()
    _, alive = psutil.wait_procs(runs, timeout=120)
    for run in alive:
        run.kill()
    assert not alive, "a run trained on after its study was killed"
    statuses = [json.loads(r.read_text())["status"] for r in out.rglob("record.json")]
    assert statuses == ["interrupted", "interrupted"], statuses


def test_a_study_refused_at_its_first_run_leaves_nothing(project: TinyProject, tmp_path: Path) -> None:
    """A config refused when its first run starts (a stratify column the data lacks): the study
    directory it made is removed, so the fixed command is not refused as "another config"; one
    such directory left by an older reprotune (every run still planned) is taken by the next."""
    out = tmp_path / "refused"
    with pytest.raises(InputError, match="nosuchcol"):
        _study(project, out, "split.stratify_by=nosuchcol", n=2)
    assert not out.exists()
    from reprotune._studies.directory import new_study
    from reprotune._studies.plan import plan_study
    from reprotune._studies.studyfile import write_study

    bad = load_config(project.root / "cfg.yaml", ["split.stratify_by=nosuchcol"])
    out.mkdir()
    write_study(out / "study.json", new_study(plan_study(bad, n=2, vary="all", name="cfg")))
    (out / "mlflow.json").write_text('{"run_id": "the other config\'s parent run"}')
    before = (out / "study.json").read_bytes()
    with pytest.raises(InputError, match="othercol"):  # its own refusal, not "another config"
        _study(project, out, "split.stratify_by=othercol", n=2)
    assert (out / "study.json").read_bytes() == before  # refused: as it was
    assert (out / "mlflow.json").is_file()  # refused: the other's parent kept (test_study_dir.py)


def test_learning_rate_ten_times_off_is_detected(project: TinyProject, reference: StudyResult) -> None:
    """The same config with a learning rate 10x too small, 3 seeds each: beyond seed noise, higher."""
    slow = _study(project, project.root / "lr-off", "train.learning_rate=1.0e-3")
    result = significance(reference.directory, slow.directory)
    assert result.test.beyond_noise, result.format()
    assert result.verdict.startswith("B is higher than A by ")
    assert [d["key"] for d in result.differences] == ["train.learning_rate"]


def test_disjoint_seeds_are_within_noise(project: TinyProject, reference: StudyResult) -> None:
    """The same config under another root seed (so disjoint seeds): within seed noise."""
    other = _study(project, project.root / "root-2", "seed.root=2")
    assert not {r["seed"] for r in other.study["runs"]} & {r["seed"] for r in reference.study["runs"]}
    result = significance(reference.directory, other.directory)
    assert not result.test.beyond_noise, result.format()
    assert [d["key"] for d in result.differences] == ["seed.root"]


def test_each_shares_the_variance(project: TinyProject, tmp_path: Path) -> None:
    """--vary each: 2 runs per source of randomness, each moving only its seed; shares sum to 1."""
    short = ["train.max_steps=3", "train.eval_every=3", "train.save_every=0"]
    cfg = load_config(project.root / "cfg.yaml", short)
    result = run_study(cfg, n=2, vary="each", options=StudyOptions(out=tmp_path / "each", tracking=False))
    study = result.study
    assert study["groups"] == ["split", "data_order", "lora_init", "dropout"] and len(study["runs"]) == 8
    base = derive_seeds(1)
    for run in study["runs"]:
        assert {k for k, v in run["seeds"].items() if v != base[k]} == {run["varied"]}
    shares = study["variance"]["final_val_loss"]
    assert set(shares) == set(study["groups"])
    assert sum(s["share"] for s in shares.values()) == pytest.approx(1.0, abs=1e-12)
    assert "Share of the variance: " in (result.directory / "report.html").read_text(encoding="utf-8")


def test_mlflow_parent_and_children(
    project: TinyProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow holds the study as a parent run (config, summaries, study.json) with every run as its
    child, tagged with the study id, the seed that moved and its value."""
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    seed_mlflow_store(tmp_path / "mlflow.db")
    sets = ["train.max_steps=2", "train.eval_every=2", "train.save_every=0", "tracking.mlflow=true"]
    cfg = load_config(project.root / "cfg.yaml", sets)
    result = run_study(cfg, n=2, vary="lora_init", options=StudyOptions(out=tmp_path / "tracked", name="cfg"))
    assert result.tracking is not None and result.tracking["ok"], result.tracking
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent = client.get_run(result.tracking["parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["reprotune.study_id"] == result.study["study_id"]
    summary = result.study["summary"]["lora_init"]["final_val_loss"]
    assert parent.data.metrics["final_val_loss.mean"] == summary["mean"]
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} == {"study.json", "report.html"}
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    tags = sorted(
        tuple(c.data.tags[f"reprotune.{key}"] for key in ("study_id", "study.varied", "study.seed"))
        for c in children
    )
    study = result.study
    assert tags == sorted((study["study_id"], r["varied"], str(r["seed"])) for r in study["runs"])


def test_eval_metrics_reach_the_study_in_this_process(tmp_path: Path) -> None:
    """With eval.generate_at_end, a study run in this process (``--jobs 1``) evaluates each run on
    its test split, as ``reprotune run`` would, and the study holds each eval's scores."""
    project = TinyProject.create(tmp_path, n_rows=40)
    cfg_path = project.config(
        "cfg.yaml",
        train={"batch_size": 4, "max_steps": 2, "eval_every": 0, "save_every": 0},
        eval={"batch_size": 8, "max_new_tokens": 4, "generate_at_end": True},
    )
    result = run_study(
        load_config(cfg_path),
        n=2,
        vary="all",
        options=StudyOptions(out=tmp_path / "s", tracking=False, name="cfg"),
    )
    study = load_study(result.directory)
    for run in study["runs"]:
        (eval_dir,) = (result.directory / run["dir"] / "evals").iterdir()
        scores = json.loads((eval_dir / "eval.json").read_text(encoding="utf-8"))["metrics"]
        assert scores and all(run["metrics"][f"test/{name}"] == value for name, value in scores.items())
    assert "test/exact_match" in study["summary"]["all"]


def _record(**sections: dict[str, Any]) -> Any:
    """A run's record with ``sections`` (``data``, ``model``), as a study reads it."""
    from reprotune._run.record import new_record, typed_record

    return typed_record({**new_record("r", {}, "0" * 64, {}), **sections})


def test_runs_on_other_data_are_said_in_the_study() -> None:
    """A study continued after its data file was edited holds runs on two data files: study.json's
    data says they disagree, with a note (before, nothing was said)."""
    from reprotune._studies.sources import data_identity as _data

    def on(data_sha256: str) -> Any:
        return _record(data={"file_sha256": data_sha256})

    same, notes = _data([on("a" * 64)] * 3)
    assert same == {"file_sha256": "a" * 64, "runs_agree": True} and notes == []
    mixed, notes = _data([on("a" * 64), on("b" * 64)])
    assert mixed == {"file_sha256": "a" * 64, "runs_agree": False}
    assert (
        len(notes) == 1
        and "the runs did not all train on the same data (2 data.file_sha256 values" in notes[0]
    )


def test_runs_from_other_model_files_are_said_in_the_study() -> None:
    """A study whose runs started from different model files (the model replaced while it was
    made): base_model says they disagree (runs_agree false, which significance refuses), with a
    note; the model found at another path is the same model (before, only a note, and
    significance compared the first run's model alone)."""
    from reprotune._studies.sources import base_model

    def on(source: str, weights: str) -> Any:
        return _record(model={"source": source, "weights_sha256": weights, "tokenizer_sha256": "t" * 64})

    model = {"source": "m", "weights_sha256": "a" * 64, "tokenizer_sha256": "t" * 64}
    moved, notes = base_model([on("m", "a" * 64), on("./m", "a" * 64)])
    assert moved == {**model, "runs_agree": True}
    assert notes == ["the runs found the base model at different sources; base_model is the first run's"]
    mixed, notes = base_model([on("m", "a" * 64), on("m", "b" * 64), on("m", "b" * 64)])
    assert mixed == {**model, "runs_agree": False}
    assert len(notes) == 1 and notes[0].startswith(
        "the runs did not all start from the same base model files (2 weights and tokenizer sha256 pairs"
    )


@pytest.mark.parametrize("jobs", [1, 2], ids=["jobs1", "jobs2"])
@pytest.mark.parametrize("given", ["new", "empty"], ids=["new-out", "empty-out"])
def test_a_config_refused_at_its_first_run_is_refused_alike_and_leaves_out_as_it_was(
    jobs: int,
    given: str,
    project: TinyProject,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--set split.stratify_by=nosuchcol: exit 2 naming the --set, with --jobs 2 as with --jobs 1
    (before, --jobs 2 exited 1, "2 runs failed", pointing at the study's copy of the config and
    telling to run the same command again, and left the study directory); --out as it was: no
    directory when it was new, an empty one when it was given empty (before, config.yaml and
    study.json were left in it)."""
    assert jobs == 1 or fork_legs_here(monkeypatch) or os.environ.get("REPROTUNE_TESTS_COLD")
    out = tmp_path / "out"
    if given == "empty":
        out.mkdir()
    args = ["--n", "2", "--jobs", str(jobs), "--out", str(out), "--no-tracking"]
    code = main(["seeds", str(project.root / "cfg.yaml"), *args, "--set", "split.stratify_by=nosuchcol"])
    columns = ["category", "prompt", "response"]
    assert (code, capsys.readouterr().err) == (
        2,
        "reprotune seeds: error: --set split.stratify_by=nosuchcol: split.stratify_by names column "
        f"'nosuchcol': no such column in {project.root / 'data.jsonl'}; its columns are {columns}\n"
        f"fix: set split.stratify_by to one of {columns}\n",
    )
    assert (sorted(out.iterdir()) if out.exists() else None) == ([] if given == "empty" else None)


def test_a_metric_evaluated_otherwise_in_some_runs_is_left_out_and_said() -> None:
    """Run 0 evaluated on its test split's first 3 rows, runs 1-2 on all of it: test/bleu is not
    one sample (the study mixed them, and significance tested on them), so it is left out of the
    summary with a note naming both setups; final_val_loss stays."""
    from reprotune._config.loading import config_from_dict
    from reprotune._studies.directory import new_study
    from reprotune._studies.plan import plan_study
    from reprotune._studies.study import summarise_runs

    plan = plan_study(config_from_dict({"seed": {"root": 1}}), n=3, vary="all", name="s")
    runs = [
        {
            **entry,
            "metrics": {"final_val_loss": 1.0 + k, "test/bleu": 2.0 + k},
            "metric_setups": {"test/bleu": "test first 3 rows" if k == 0 else "test all rows"},
        }
        for k, entry in enumerate(new_study(plan)["runs"])
    ]
    summary = summarise_runs(plan, runs, {})
    assert summary["metrics"] == ["final_val_loss"]
    assert summary["metric_notes"] == [
        "test/bleu: the runs' evaluations differ (test all rows vs test first 3 rows), left out of the "
        "summary: evaluate every run alike"
    ]
    for run in runs:
        run["metric_setups"] = {"test/bleu": "test all rows"}
    assert summarise_runs(plan, runs, {})["metrics"] == ["final_val_loss", "test/bleu"]
