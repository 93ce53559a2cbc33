"""``eval.generate_at_end``: a completed run is evaluated on its test split, and the metrics reach
the run's MLflow run as ``test/<metric>``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_generate_at_end_evaluates_and_logs_to_mlflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`reprotune run` with eval.generate_at_end writes one complete eval of the test split and
    mirrors its metrics (the same numbers) and files to the run's MLflow run."""
    from mlflow.tracking import MlflowClient

    from tinyrun import TinyProject

    project = TinyProject.create(tmp_path, n_rows=40)
    cfg = project.config(
        train={"batch_size": 4, "max_steps": 2, "eval_every": 0, "save_every": 0},
        eval={"batch_size": 8, "max_new_tokens": 4, "generate_at_end": True},
        tracking={"mlflow": True, "uri": "sqlite:///mlflow.db", "artifact_location": "mlartifacts"},
    )
    done = project.run_cli("run", str(cfg), "--run-dir", "run", "--no-progress")
    run_dir = project.root / "run"
    (eval_dir,) = [p for p in (run_dir / "evals").iterdir()]
    record = json.loads((eval_dir / "eval.json").read_text())
    assert record["split"]["name"] == "test" and record["status"] == "completed"
    assert f"eval {record['eval_id']}" in done.stdout
    mlflow = json.loads((run_dir / "record.json").read_text())["trackers"]["mlflow"]
    client = MlflowClient(tracking_uri=mlflow["tracking_uri"])
    logged = client.get_run(mlflow["mlflow_run_id"]).data.metrics
    assert {k: v for k, v in logged.items() if k.startswith("test/")} == {
        f"test/{name}": value for name, value in record["metrics"].items()
    }
    # MLflow 3.1's list_artifacts(run_id, path) reads the default tracking URI, not the client's
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow["tracking_uri"])
    artifacts = {a.path for a in client.list_artifacts(mlflow["mlflow_run_id"], f"evals/{eval_dir.name}")}
    assert artifacts == {f"evals/{eval_dir.name}/eval.json", f"evals/{eval_dir.name}/predictions.jsonl"}


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"split": {"ratios": [0.8, 0.2, 0.0]}}, "eval.generate_at_end evaluates the test split"),
        ({"model": {"max_length": 500}}, "past the model's 512 positions"),
    ],
    ids=["empty-test-split", "past-the-positions"],
)
def test_what_the_eval_at_the_end_would_refuse_is_refused_before_training(
    tmp_path: Path, changes: dict[str, dict[str, object]], said: str
) -> None:
    """An empty test split, or prompts of model.max_length plus eval.max_new_tokens past the model's
    positions: exit 2 before the first step (before, the run trained to the end, then the eval
    refused it, exit 2 after all that time)."""
    from tinyrun import TinyProject

    project = TinyProject.create(tmp_path, n_rows=40)
    cfg = project.config(
        train={"batch_size": 4, "max_steps": 2, "eval_every": 0, "save_every": 0},
        eval={"batch_size": 8, "max_new_tokens": 64, "generate_at_end": True},
        **changes,
    )
    done = project.run_cli("run", str(cfg), "--run-dir", "run", "--no-progress", "--no-tracking", check=False)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "completed" not in done.stderr + done.stdout
    ledger = project.root / "run" / "ledger.jsonl"
    assert not ledger.exists() or '"kind":"train"' not in ledger.read_text()


def test_an_eval_at_the_end_lost_after_the_run_completed_is_made_by_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run completed, then its end-of-run eval was interrupted (Ctrl-C) or killed: the CLI
    said "interrupted (resumable: `reprotune resume run`)" and resume refused the completed run,
    so the eval and its MLflow metrics were lost for good. Interrupted, the CLI says the run
    completed and resume makes the eval; resume makes it (the same predictions as the eval that
    was lost, its metrics mirrored to MLflow), and a second resume has nothing left to do."""
    from mlflow.tracking import MlflowClient

    from reprotune._cli import main
    from tinyrun import TinyProject

    project = TinyProject.create(tmp_path, n_rows=40)
    cfg = project.config(
        train={"batch_size": 4, "max_steps": 2, "eval_every": 0, "save_every": 0},
        eval={"batch_size": 8, "max_new_tokens": 4, "generate_at_end": True},
        tracking={"mlflow": True, "uri": "sqlite:///mlflow.db", "artifact_location": "mlartifacts"},
    )
    project.run_cli("run", str(cfg), "--run-dir", "run", "--no-progress")
    run_dir = project.root / "run"
    (first,) = list((run_dir / "evals").iterdir())
    predictions = (first / "predictions.jsonl").read_bytes()
    first.rename(run_dir / "evals" / f".{first.name}.tmp")  # as a kill leaves it: never published

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr("reprotune._eval.at_end.evaluate_at_end", interrupted)
        assert main(["resume", str(run_dir), "--no-progress"]) == 130
    said = capsys.readouterr().err
    assert said.endswith(
        "reprotune resume: interrupted by SIGINT: the run completed; its end-of-run eval did not: "
        f"make it with `reprotune resume {run_dir}`\n"
    ), said
    assert "resumable" not in said

    made = project.run_cli("resume", "run", "--no-progress")
    assert "completed; making its end-of-run eval" in made.stderr
    (eval_dir,) = [p for p in (run_dir / "evals").iterdir() if not p.name.startswith(".")]
    assert (eval_dir / "predictions.jsonl").read_bytes() == predictions
    record = json.loads((eval_dir / "eval.json").read_text())
    mlflow = json.loads((run_dir / "record.json").read_text())["trackers"]["mlflow"]
    logged = MlflowClient(tracking_uri=mlflow["tracking_uri"]).get_run(mlflow["mlflow_run_id"]).data.metrics
    assert {k: v for k, v in logged.items() if k.startswith("test/")} == {
        f"test/{name}": value for name, value in record["metrics"].items()
    }
    again = project.run_cli("resume", "run", "--no-progress", check=False)
    assert again.returncode == 2 and "already complete; nothing to resume" in again.stderr, again.stderr


def test_rerun_makes_the_eval_at_the_end_and_compare_pairs_it(tmp_path: Path) -> None:
    """`reprotune rerun` of a run whose config asks for eval.generate_at_end made no eval (only run
    and resume called it): now the rerun makes it, as run does (its summary printed), with the
    same predictions as the run's, and `compare RUN RERUN` pairs the two evals: IDENTICAL."""
    from tinyrun import TinyProject

    project = TinyProject.create(tmp_path, n_rows=40)
    cfg = project.config(
        train={"batch_size": 4, "max_steps": 2, "eval_every": 0, "save_every": 0},
        eval={"batch_size": 8, "max_new_tokens": 4, "generate_at_end": True},
    )
    project.run_cli("run", str(cfg), "--run-dir", "run", "--no-progress", "--no-tracking")
    done = project.run_cli("rerun", "run", "--run-dir", "again", "--no-progress")
    assert done.stdout.startswith("rerun of run -> again\nIDENTICAL"), done.stdout
    (made,) = list((project.root / "run" / "evals").iterdir())
    (remade,) = list((project.root / "again" / "evals").iterdir())
    record = json.loads((remade / "eval.json").read_text())
    assert record["split"]["name"] == "test" and f"eval {record['eval_id']}" in done.stdout
    assert (remade / "predictions.jsonl").read_bytes() == (made / "predictions.jsonl").read_bytes()
    compared = project.run_cli("compare", "run", "again")
    assert "\nevals of the two runs: IDENTICAL" in compared.stdout, compared.stdout
