"""Tests for reprotune._run.fingerprint and the environment redaction of _config.secrets: planted
secrets never recorded, git state."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from reprotune._config.secrets import (
    REDACTED,
    is_secret_name,
    mask_command,
    mask_url_credentials,
    redact_env,
    token_problem,
    without_masked_credentials,
)
from reprotune._jsonio import canonical_dumps
from reprotune._run import fingerprint as _fingerprint
from reprotune._run.fingerprint import code_fingerprint, environment_fingerprint, installed_distributions

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

PLANTED = {
    "HF_TOKEN": "hf_plantedSecret1",
    "WANDB_API_KEY": "plantedSecret2",
    "MLFLOW_TRACKING_PASSWORD": "plantedSecret3",
    "HUGGINGFACE_HUB_TOKEN": "plantedSecret4",
    "MLFLOW_TRACKING_URI": "https://alice:plantedSecret5@mlflow.example.com:5000/db",
    "HF_ENDPOINT": "https://hub.example.com/api?access_token=plantedSecret6&region=eu",
    "TORCH_HOME_AUTH": "plantedSecret7",
    "HF_CREDS": "plantedSecret8",
    "HF_PAT": "plantedSecret9",
    "MLFLOW_TRACKING_USERNAME": "plantedSecret10",
}


def test_planted_secrets_never_reach_the_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    """No planted secret value appears anywhere in the environment fingerprint's JSON."""
    for name, value in PLANTED.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    text = canonical_dumps(environment_fingerprint())
    for n in range(1, 11):
        assert f"plantedSecret{n}" not in text
    env = environment_fingerprint()["env"]
    assert env["HF_TOKEN"] == REDACTED and env["WANDB_API_KEY"] == REDACTED
    assert env["MLFLOW_TRACKING_URI"] == "https://***:***@mlflow.example.com:5000/db"
    assert env["HF_ENDPOINT"] == "https://hub.example.com/api?access_token=***&region=eu"
    assert env["TOKENIZERS_PARALLELISM"] == "false"  # "TOKEN" inside a word is not a secret name


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("https://user:pass@host/x", "https://***:***@host/x"),
        ("https://tok@host", "https://***@host"),
        (
            "postgresql://u:p@db:5432/m and s3://k:s@bucket",
            "postgresql://***:***@db:5432/m and s3://***:***@bucket",
        ),
        ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
        ("http://host/path?sig=abc&x=1", "http://host/path?sig=***&x=1"),
    ],
    ids=["user-pass", "user-only", "two-urls", "no-credentials", "query-signature"],
)
def test_redact_value(value: str, expected: str) -> None:
    """Credentials inside URLs and secret query parameters are masked; other text is kept."""
    assert mask_url_credentials(value) == expected


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (
            "env HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789 WANDB_API_KEY=0123456789abcdef python t.py",
            "env 'HF_TOKEN=***' 'WANDB_API_KEY=***' python t.py",
        ),
        (
            "MLFLOW_TRACKING_PASSWORD=hunter2 python t.py --max-steps 6",
            "'MLFLOW_TRACKING_PASSWORD=***' python t.py --max-steps 6",
        ),
        ("python t.py --hub_token s3cr3tvalue --lr 1e-3", "python t.py --hub_token '***' --lr 1e-3"),
        ("python t.py --api-key=Zx9Qw8 --x 1", "python t.py '--api-key=***' --x 1"),
        ("python t.py --use-auth-token --max-steps 3", "python t.py --use-auth-token --max-steps 3"),
        ("python --use-auth-token t.py --x 1", "python --use-auth-token t.py --x 1"),
        ("python t.py --pad_token '<pad>' --eos-token x", "python t.py --pad_token '<pad>' --eos-token x"),
        ('bash -c "HF_TOKEN=abc python t.py --x 1"', "bash -c 'HF_TOKEN=*** python t.py --x 1'"),
        ("python t.py --num_key_value_heads 4", "python t.py --num_key_value_heads 4"),
        ('python "my script.py" --out x', 'python "my script.py" --out x'),
        (
            'python t.py "unclosed --token hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789',
            'python t.py "unclosed --token ***',
        ),
    ],
    ids=[
        "variables",
        "password",
        "option",
        "option-equals",
        "flag",
        "switch",
        "special-tokens",
        "bash-c",
        "not-a-secret",
        "nothing",
        "unsplittable",
    ],
)
def test_a_command_written_down_keeps_no_secret(command: str, expected: str) -> None:
    """A trace's or a verification's command: the values of secret-named variables and options
    have no shape of their own (a W&B key is 40 hex digits): they went into the files verbatim."""
    assert mask_command(command) == expected


def test_a_masked_url_connects_without_the_mask() -> None:
    """What a resumed run reads back from its record (user-info masked) connects without it, with
    credentials from the environment; an unmasked URL or one without user-info is kept."""
    assert without_masked_credentials(mask_url_credentials("http://u:p@host:5000")) == "http://host:5000"
    assert without_masked_credentials(mask_url_credentials("https://tok@host/x")) == "https://host/x"
    assert without_masked_credentials("sqlite:///mlflow.db") == "sqlite:///mlflow.db"
    assert without_masked_credentials("http://u:p@host") == "http://u:p@host"


def test_one_test_of_a_secret_name_for_variables_and_config_keys() -> None:
    """A name is judged one way wherever it appears: an environment variable's value is redacted and
    a random-looking config value under that key refused for the same names (there were two word
    lists: ``session``, ``cookie``, ``private_key`` were secret in the environment only)."""
    random_value = "Zq8xL2mVt7Rk4Nw9Yp3H"
    for name in ("HF_TOKEN", "WANDB_API_KEY", "SESSION_ID", "GIT_COOKIE", "PRIVATE", "OAUTH", "APIKEY"):
        assert is_secret_name(name) and is_secret_name(name.lower().replace("_", "-"))
        assert redact_env({f"HF_{name}": "x"}) == {f"HF_{name}": REDACTED}
        assert token_problem(["tracking", name.lower()], random_value) is not None
    for name in ("TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE", "KEYBOARD", "learning_rate"):
        assert not is_secret_name(name)
        assert token_problem(["tracking", name.lower()], random_value) is None


def test_redact_env_keeps_only_relevant_names() -> None:
    """Only variables with a relevant prefix are kept; HOME and an AWS key are not recorded at all."""
    env = {"HOME": "/root", "AWS_SECRET_ACCESS_KEY": "x", "CUDA_VISIBLE_DEVICES": "0", "PYTHONHASHSEED": "0"}
    assert redact_env(env) == {"CUDA_VISIBLE_DEVICES": "0", "PYTHONHASHSEED": "0"}


def test_environment_lists_installed_distributions_and_versions() -> None:
    """Every installed distribution is listed with its version, plus torch, CPU and thread facts."""
    env = environment_fingerprint()
    assert env["distributions"]["torch"] == importlib.metadata.version("torch")
    assert env["distributions"]["pydantic"] == importlib.metadata.version("pydantic")
    assert len(env["distributions"]) == len(
        {d.metadata["Name"].lower() for d in importlib.metadata.distributions()}
    )
    assert env["torch"]["version"] and env["cpu"]["model"]
    assert env["threads"]["torch_intra_op"] == env["determinism"]["torch_num_threads"]


def test_distributions_read_from_metadata_heads_equal_a_full_parse(tmp_path: Path) -> None:
    """Names and versions read from the head of each metadata file are what importlib.metadata's
    full parse gives, for every installed distribution; a header later in the file (the long
    description) is not taken for one."""
    full: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        if dist.metadata["Name"]:
            full[re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()] = dist.version
    assert installed_distributions() == dict(sorted(full.items())) and len(full) > 50
    info = tmp_path / "My_Pkg-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nname: My_Pkg\nVERSION: 1.2\nName: other\n\nVersion: 9.9\n", encoding="utf-8"
    )
    dist = importlib.metadata.PathDistribution(info)
    assert _fingerprint._name_and_version(dist) == (dist.metadata["Name"], dist.version) == ("My_Pkg", "1.2")


def test_no_gpu_tools_no_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without nvidia-smi the fingerprint still builds, with no driver."""
    monkeypatch.setattr(_fingerprint.shutil, "which", lambda name: None)
    env = environment_fingerprint()
    assert env["gpu_driver"] is None and env["nvidia_smi_gpus"] == []


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with one commit holding a text file and a binary file."""
    _git(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)))
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "init")
    return tmp_path


@needs_git
def test_clean_repo(repo: Path) -> None:
    """A clean tree: commit and branch recorded, not dirty, no diff."""
    info = code_fingerprint(repo)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    assert info.in_git and info.commit == head and info.branch == "main"
    assert not info.dirty and info.diff == b"" and info.diff_sha256 is None and info.untracked == ()


@needs_git
def test_dirty_repo_diff_is_binary_safe(repo: Path) -> None:
    """A modified text and binary file: dirty, diff covers both, its sha256 is of the exact bytes."""
    (repo / "train.py").write_text("print('changed')\n")
    (repo / "blob.bin").write_bytes(bytes(range(255, -1, -1)))
    (repo / "new.py").write_text("x = 1\n")
    info = code_fingerprint(repo / "train.py")  # a file inside the repo works too
    assert info.dirty and info.untracked == ("new.py",)
    assert b"changed" in info.diff and b"GIT binary patch" in info.diff
    assert info.diff_sha256 == hashlib.sha256(info.diff).hexdigest()
    record = info.to_record(patch_file="code.patch")
    assert record["dirty"] is True and record["patch_file"] == "code.patch" and "diff" not in record


@needs_git
def test_untracked_only_is_dirty(repo: Path) -> None:
    """An untracked file alone makes the tree dirty (a commit would not reproduce it)."""
    (repo / "helper.py").write_text("")
    info = code_fingerprint(repo)
    assert info.dirty and info.diff_sha256 is None and info.untracked == ("helper.py",)


@needs_git
def test_only_a_stores_own_files_beside_it_count_as_its_output(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An output directory leaves out what is under it, and a sqlite store its -journal/-wal
    beside it; a script named like an output directory with a dash is still untracked code (it
    was left out as one: ``wandb-sweep.py`` beside ``wandb/``)."""
    monkeypatch.chdir(repo)
    (repo / "wandb").mkdir()
    (repo / "wandb" / "debug.log").write_text("")
    for name in ("mlflow.db", "mlflow.db-wal", "wandb-sweep.py"):
        (repo / name).write_text("")
    info = code_fingerprint(repo, outputs=["wandb"])
    assert info.untracked == ("wandb-sweep.py",)


@needs_git
def test_a_verification_under_way_is_output_before_its_verification_json(repo: Path) -> None:
    """verify --out proofs/v1 (outside runs/): its config copy, logs and lock are output while its
    legs run, as they are once verification.json lands (before, each leg recorded a dirty tree and
    a rerun of the reference then found code drift: dirty true then, false now)."""
    verification = repo / "proofs" / "v1"
    (verification / "rerun").mkdir(parents=True)
    for name in ("config.yaml", "verify.log.0", ".train-lock", "rerun/.writer.lock"):
        (verification / name).write_text("")
    (verification / "verify.log").write_text("$ -m reprotune run proofs/v1/config.yaml ...\n")
    during = code_fingerprint(repo)
    (verification / "verification.json").write_text("{}")
    assert not during.dirty and during.untracked == () == code_fingerprint(repo).untracked
    # A verify.log of the user's own (git-ignored, as *.log often is) marks nothing: code beside
    # it is still untracked code.
    (repo / ".gitignore").write_text("*.log\n")
    _git(repo, "add", ".gitignore")
    _git(repo, "commit", "-q", "-m", "ignore logs")
    (repo / "scripts").mkdir()
    (repo / "scripts" / "verify.log").write_text("2026-12-06 checked\n")
    (repo / "scripts" / "helper.py").write_text("x = 1\n")
    assert code_fingerprint(repo).untracked == ("scripts/helper.py",)


@needs_git
def test_another_trainer_runs_marked_checkpoints_are_output(repo: Path) -> None:
    """A Trainer checkpoint the callback marked (``reprotune-run.json``) is another script's run
    beside this one, not untracked code (before, a second run's record said dirty, listing the first
    run's checkpoint files, and a resume of the first was refused as code drift); an unmarked
    checkpoint folder still counts."""
    for name in ("checkpoint-2", "checkpoint-4"):
        (repo / "out-a" / name).mkdir(parents=True)
        (repo / "out-a" / name / "adapter_model.safetensors").write_bytes(b"weights")
    (repo / "out-a" / "checkpoint-2" / "reprotune-run.json").write_text("{}")
    info = code_fingerprint(repo)
    assert info.untracked == ("out-a/checkpoint-4/adapter_model.safetensors",)


def test_outside_git(tmp_path: Path) -> None:
    """Outside a git work tree: in_git False, no crash."""
    info = code_fingerprint(tmp_path)
    assert info.in_git is False and info.commit is None and not info.dirty


def test_without_git_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without git installed: in_git False, no crash."""
    monkeypatch.setattr(_fingerprint.shutil, "which", lambda name: None)
    info = code_fingerprint(tmp_path)
    assert info.in_git is False and info.git_error == "git is not installed"


def test_a_resume_from_outside_the_repository_is_told_to_run_inside_it(tmp_path: Path) -> None:
    """The run was made at a commit; resumed from a directory in no git checkout, the code reads as
    none: the fix says to run it inside the checkout (it said to check out the commit, which is
    checked out already)."""
    from reprotune._errors import InputError
    from reprotune._run.drift import refuse_code_drift

    recorded = {"in_git": True, "commit": "a" * 40, "branch": "main", "dirty": False}
    with pytest.raises(InputError) as refused:
        refuse_code_drift(
            recorded, code_fingerprint(tmp_path).to_record(), tmp_path, what="resuming", override=None
        )
    assert "run it from inside the git checkout the run was made in" in (refused.value.fix or "")


@needs_git
def test_reading_the_code_writes_nothing_in_the_repository(repo: Path) -> None:
    """git diff HEAD refreshes the index it reads and writes it back (GIT_OPTIONAL_LOCKS or not):
    the fingerprint diffs against a private copy, so the user's .git/index keeps its bytes and its
    time (it was rewritten, beside the user's own git commands), and the diff is the same."""
    for name in ("new.py", "same.py"):
        (repo / name).write_text("x = 1\n")
    _git(repo, "add", "new.py", "same.py")
    _git(repo, "commit", "-q", "-m", "new")
    (repo / "new.py").write_text("x = 2\n")
    os.utime(repo / "same.py", ns=(2_000_000_000, 2_000_000_000))  # stat-dirty, same bytes: refreshed
    index = repo / ".git" / "index"
    before = (index.read_bytes(), index.stat().st_mtime_ns)
    info = code_fingerprint(repo)
    assert (index.read_bytes(), index.stat().st_mtime_ns) == before
    assert info.dirty and b"-x = 1\n+x = 2\n" in info.diff


@needs_git
def test_no_room_for_the_index_copy_still_reads_the_code(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The private index copy cannot be written (a full temporary directory): the code is read
    from the real index, as before (the record said the code was in no git tree)."""
    import errno

    from reprotune._run import git as _git_module

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    (repo / "new.py").write_text("x = 1\n")
    monkeypatch.setattr(_git_module.shutil, "copyfile", full)
    info = code_fingerprint(repo)
    assert info.in_git and info.commit is not None and info.untracked == ("new.py",)


@needs_git
def test_the_private_index_copy_keeps_the_indexs_time(repo: Path) -> None:
    """git checks an entry by content, not by its stat, when the entry is not older than the index
    file (a "racily clean" entry: a same-size edit within the second of a commit). The private
    copy had its own, later time, so git trusted the stat and such an edit read clean (CI caught
    it, in doctor's git-dirty test, once in a while). The copy keeps the index's time."""
    from reprotune._run.git import index_copy

    index = repo / ".git" / "index"
    os.utime(index, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    with index_copy(repo) as private:
        copy = Path(private["GIT_INDEX_FILE"])
        assert copy.read_bytes() == index.read_bytes()
        assert copy.stat().st_mtime_ns == index.stat().st_mtime_ns
