"""Issue 16, items 5 and 8: what a run writes and shows holds no credentials, and reprotune's own
outputs never make a clean tree dirty.

Real runs of the tiny model through ``main`` in this process, MLflow on a real SQLite store (read
back with ``sqlite3``), a real git repository.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from mlflowstore import seed_mlflow_store
from reprotune._cli import main
from reprotune._run.record import load_record
from tinyrun import TinyProject

PASSWORD = "s3cr3t-pw"


def _every_byte_under(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def test_credentials_in_the_tracking_uri_are_never_written_or_shown(
    project: TinyProject, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tracking.uri: http://alice:PASSWORD@host`: the MLflow connection fails (nothing listens) and is
    reported, the run completes, and neither the user nor the password is in record.json, config.yaml,
    any other file of the run, stdout, stderr or the HTML report."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    uri = f"http://alice:{PASSWORD}@127.0.0.1:9/"
    args = ["run", str(project.config()), "--run-dir", str(run_dir), "--no-progress"]
    assert main([*args, "--set", "tracking.mlflow=true", "--set", f"tracking.uri={uri}"]) == 0
    report = tmp_path / "report.html"
    assert main(["report", str(run_dir), "-o", str(report)]) == 0
    out, err = capfd.readouterr()
    assert "MLflow" in out and "switched off" in out + err  # the failure was reported...
    for text in (out, err, report.read_text(encoding="utf-8")):
        assert PASSWORD not in text and "alice" not in text  # ...without the credentials
    written = _every_byte_under(run_dir)
    assert PASSWORD.encode() not in written and b"alice" not in written
    record = load_record(run_dir / "record.json")
    assert record["config"]["tracking"]["uri"] == "http://***:***@127.0.0.1:9/"
    assert "uri: http://***:***@127.0.0.1:9/" in (run_dir / "config.yaml").read_text()


def test_tracker_params_hold_no_url_credentials(
    project: TinyProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A URL with user-info in a tracking value reaches MLflow's params (a real SQLite store)
    masked. In a value the run computes with (a system prompt) it is refused, the password never
    shown: the record would hold the masked text, and a rerun from it would train on other text
    (it did, and compare blamed nondeterminism)."""
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    prompt = f"house style at https://bob:{PASSWORD}@example.org/style"
    args = ["run", str(project.config()), "--run-dir", str(run_dir), "--no-progress"]
    assert main([*args, "--set", f"data.system_prompt={prompt}"]) == 2
    err = capsys.readouterr().err
    assert "data.system_prompt: holds a URL with credentials" in err and PASSWORD not in err
    assert not run_dir.exists()
    experiment = f"house style at https://bob:{PASSWORD}@example.org/style"
    seed_mlflow_store(tmp_path / "mlflow.db")
    assert main([*args, "--set", "tracking.mlflow=true", "--set", f"tracking.experiment={experiment}"]) == 0
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        params = dict(db.execute("SELECT key, value FROM params").fetchall())
        tags = db.execute("SELECT value FROM tags").fetchall()
    assert params["tracking.experiment"] == "house style at https://***:***@example.org/style"
    assert not any(PASSWORD in str(value) for value in [*params.values(), *tags])
    assert PASSWORD.encode() not in _every_byte_under(run_dir)


def test_a_config_error_does_not_show_url_credentials(
    project: TinyProject, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrongly typed value holding a URL is shown in the error with its user-info masked."""
    value = f"[https://bob:{PASSWORD}@example.org/x]"
    assert main(["doctor", str(project.config()), "--no-probe", "--set", f"tracking.uri={value}"]) == 2
    err = capsys.readouterr().err
    assert "tracking.uri: input should be a valid string (got ['https://***:***@example.org/x'])" in err
    assert PASSWORD not in err


# --- item 8: reprotune's own outputs never make a tree dirty --------------------------------------


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout


@pytest.fixture
def repo(project: TinyProject, tmp_path: Path) -> Path:
    """A git repository holding the tiny project (model, data, config), committed: a clean tree."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "repo"
    shutil.copytree(project.root / "tiny-model", root / "tiny-model")
    shutil.copy(project.root / "data.jsonl", root / "data.jsonl")
    shutil.copy(project.config(), root / "cfg.yaml")
    _git(root, "init", "-q")
    _git(root, "-c", "user.email=t@example.org", "-c", "user.name=t", "add", ".")
    _git(root, "-c", "user.email=t@example.org", "-c", "user.name=t", "commit", "-q", "-m", "project")
    return root


def _only_run(repo: Path) -> Path:
    (run_dir,) = [p for p in (repo / "runs").iterdir() if (p / "record.json").is_file()]
    return run_dir


def test_a_run_from_a_clean_tree_records_a_clean_tree(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """runs/, mlflow.db and mlartifacts/ are untracked files after the run, yet the record says
    dirty: false, lists no untracked file, and no code.patch is written."""
    monkeypatch.chdir(repo)
    seed_mlflow_store(repo / "mlflow.db")
    assert main(["run", "cfg.yaml", "--no-progress", "--set", "tracking.mlflow=true"]) == 0
    status = _git(repo, "status", "--porcelain", "--untracked-files=normal")
    assert {"?? runs/", "?? mlflow.db", "?? mlartifacts/"} <= set(status.splitlines())
    run_dir = _only_run(repo)
    code = load_record(run_dir / "record.json")["code"]
    assert (code["dirty"], code["untracked"], code["patch_file"], code["diff_sha256"]) == (
        False,
        [],
        None,
        None,
    )
    assert not (run_dir / "code.patch").exists()


def test_an_untracked_file_alone_is_dirty_without_an_empty_patch(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's untracked file makes the tree dirty (and is listed), but a patch with nothing in it
    is never written; a tracked change writes one."""
    monkeypatch.chdir(repo)
    (repo / "notes.py").write_text("x = 1\n")
    assert main(["run", "cfg.yaml", "--no-progress", "--no-tracking", "--run-dir", "runs/a"]) == 0
    code = load_record(repo / "runs" / "a" / "record.json")["code"]
    assert (code["dirty"], code["untracked"], code["patch_file"]) == (True, ["notes.py"], None)
    assert not (repo / "runs" / "a" / "code.patch").exists()
    with open(repo / "cfg.yaml", "a", encoding="utf-8") as handle:
        handle.write("# edited\n")
    assert main(["run", "cfg.yaml", "--no-progress", "--no-tracking", "--run-dir", "runs/b"]) == 0
    code = load_record(repo / "runs" / "b" / "record.json")["code"]
    assert code["patch_file"] == "code.patch"
    assert b"+# edited" in (repo / "runs" / "b" / "code.patch").read_bytes()
