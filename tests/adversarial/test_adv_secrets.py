"""Issue 24, secrets by every path: a token planted in the environment under an innocent name, in
the branch name, in a modified tracked file, in URLs (credentials with ``/`` and ``@``, query
strings) and in a ``--set`` key appears in no file a run, report or pack writes, in no MLflow
store, on no stream; ``pack`` refuses a patch holding one unless ``--allow-secrets``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tinyrun import TinyProject

# Shaped like real credentials (so found by their shape), and unique strings to search for.
GITHUB = "ghp_" + "Q7x" * 12
HF = "hf_" + "Zk9" * 11
PASSWORD = "pa/ss@w0rd-PLANTED"
QUERY = "QUERY-SECRET-PLANTED"
PLANTED = (GITHUB, HF, PASSWORD, QUERY, "pa/ss", "w0rd-PLANTED")


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def _leaks(text: str | bytes) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [secret for secret in PLANTED if secret.encode() in data]


def _files_leaking(root: Path) -> dict[str, list[str]]:
    """Every file under ``root`` (git's own objects aside) that holds a planted secret."""
    found = {}
    for path in root.rglob("*"):
        if path.is_file() and ".git" not in path.parts:
            leaks = _leaks(path.read_bytes())
            if leaks:
                found[str(path.relative_to(root))] = leaks
    return found


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> TinyProject:
    """A tiny project in git, on a branch named after a token, with a token in a tracked file
    changed since the commit (so the run's code.patch carries it)."""
    project = TinyProject.create(tmp_path_factory.mktemp("adv-secrets"))
    root = project.root
    (root / "train_notes.py").write_text("NOTE = 'nothing yet'\n")
    (root / ".gitignore").write_text("runs/\nmlflow.db\nmlartifacts/\n*.tar.gz\n*.html\n")
    _git(root, "init", "-q")
    _git(root, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    _git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    _git(root, "checkout", "-qb", f"try-{GITHUB}")
    (root / "train_notes.py").write_text(f"NOTE = 'nothing yet'\nTOKEN = '{HF}'\n")
    return project


@pytest.fixture(scope="module")
def secret_run(project: TinyProject) -> subprocess.CompletedProcess[str]:
    """runs/r: a run (MLflow on SQLite) with secrets in the environment and the git state."""
    project.config(
        "cfg.yaml",
        train={"max_steps": 2, "save_every": 0, "eval_every": 2},
        tracking={"mlflow": True, "uri": "sqlite:///mlflow.db", "artifact_location": "mlartifacts"},
    )
    env = {
        "WANDB_NOTES": f"see {GITHUB}",
        "HF_ENDPOINT": f"https://user:{PASSWORD}@hub.example/x?api_key={QUERY}",
    }
    return project.run_cli("run", "cfg.yaml", "--run-dir", "runs/r", "--no-progress", env=env)


def test_no_planted_secret_leaves_through_a_run_its_mlflow_store_or_its_report(
    project: TinyProject, secret_run: subprocess.CompletedProcess[str]
) -> None:
    """The run directory, the MLflow store and artifacts, the report and both streams hold none of
    the planted secrets (the run's code.patch aside, which a rerun here needs: it holds the token
    on purpose, and pack refuses to ship it)."""
    assert _leaks(secret_run.stdout + secret_run.stderr) == []
    report = project.run_cli("report", "runs/r", "-o", "report.html")
    assert _leaks(report.stdout + report.stderr) == []
    leaking = _files_leaking(project.root)
    assert set(leaking) == {"train_notes.py", "runs/r/code.patch"}, leaking
    record = (project.root / "runs" / "r" / "record.json").read_text()
    assert '"WANDB_NOTES": "***REDACTED***"' in record and "try-***" in record


@pytest.mark.parametrize(
    ("argv", "secret"),
    [
        (["--set", f"data.path=https://user:{PASSWORD}@data.example/d.jsonl"], PASSWORD),
        (["--set", f"data.path=https://data.example/d.jsonl?api_key={QUERY}"], QUERY),
        (["--set", f"model.name=https://user:{PASSWORD}@models.example/m"], PASSWORD),
        (["--set", f"{GITHUB}=1"], GITHUB),
        (["--set", f"tracking.uri=https://user:{PASSWORD}@mlflow.example"], PASSWORD),
    ],
    ids=["data-url-password", "data-query", "model-url-password", "set-key-token", "tracking-password"],
)
def test_refusals_and_failures_never_echo_a_secret(
    project: TinyProject, argv: list[str], secret: str
) -> None:
    """Bad input carrying a secret, refused or failing at any point: exit 2 (or a failed tracker,
    the run going on) and neither stream holds the secret, whatever path normalisation did first."""
    project.config("small.yaml", train={"max_steps": 1, "save_every": 0, "eval_every": 1})
    done = project.run_cli(
        "run", "small.yaml", "--run-dir", "runs/refused", "--no-progress", *argv, check=False
    )
    assert done.returncode in (0, 2), done.stderr
    assert secret not in done.stdout + done.stderr, done.stderr
    for path in (project.root / "runs").rglob("*"):
        if path.is_file() and "refused" in path.parts:
            assert secret.encode() not in path.read_bytes(), path


def test_pack_refuses_a_patch_holding_a_token_naming_file_and_line(
    project: TinyProject, secret_run: subprocess.CompletedProcess[str]
) -> None:
    """The run's code.patch holds the planted token: pack exits 2 naming train_notes.py line 2,
    writes nothing; with --allow-secrets the bundle is written."""
    done = project.run_cli("pack", "runs/r", "-o", "r.tar.gz", check=False)
    assert done.returncode == 2
    assert "a Hugging Face token (hf_...), in train_notes.py line 2" in done.stderr
    assert "--allow-secrets" in done.stderr and not (project.root / "r.tar.gz").exists()
    assert _leaks(done.stdout + done.stderr) == []
    project.run_cli("pack", "runs/r", "-o", "r.tar.gz", "--allow-secrets")
    assert (project.root / "r.tar.gz").is_file()
