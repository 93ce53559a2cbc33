"""Reproduction bundles: pack a run, rerun it from another directory; hostile bundles refused."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from reprotune._cli import main
from reprotune._jsonio import sha256_file
from reprotune._proof.bundle import MANIFEST
from tinyrun import TinyProject


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[TinyProject, Path, Path]:
    """A completed tiny run, packed with and without its data."""
    project = TinyProject.create(tmp_path_factory.mktemp("bundle-project"))
    project.config("cfg.yaml", train={"max_steps": 3, "save_every": 0, "eval_every": 3})
    project.run_cli("run", "cfg.yaml", "--run-dir", "runs/r", "--no-progress")
    project.run_cli("pack", "runs/r", "-o", "with-data.tar.gz", "--with-data")
    project.run_cli("pack", "runs/r", "-o", "no-data.tar.gz")
    return project, project.root / "with-data.tar.gz", project.root / "no-data.tar.gz"


def test_pack_is_deterministic(packed: tuple[TinyProject, Path, Path], tmp_path: Path) -> None:
    """Packing one run twice gives the same bytes; bundle.json lists every member with its sha256."""
    project, bundle, _ = packed
    again = tmp_path / "again.tar.gz"
    assert main(["pack", str(project.root / "runs" / "r"), "-o", str(again), "--with-data"]) == 0
    assert again.read_bytes() == bundle.read_bytes()
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile(MANIFEST).read())  # type: ignore[union-attr]
    assert names[0] == MANIFEST and sorted(manifest["members"]) == sorted(names[1:])
    assert {
        "run/record.json",
        "run/ledger.jsonl",
        "run/split.json",
        "run/config.yaml",
        "data/data.jsonl",
    } <= set(names)
    assert "run/adapter/adapter_model.safetensors" in names and not any("checkpoints" in n for n in names)


def test_bundle_reruns_identically_elsewhere(
    packed: tuple[TinyProject, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rerun the bundle in another directory, from another working directory: IDENTICAL, and
    rerun.json says so."""
    _, bundle, _ = packed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    out = tmp_path / "unpacked"
    code = main(["rerun", str(bundle), "--out", str(out), "--no-progress"])
    assert code == 0
    summary = json.loads((out / "rerun.json").read_text())
    assert summary["verdict"] == "IDENTICAL" and summary["bundle_sha256"] == sha256_file(bundle)
    assert (out / "rerun" / "ledger.jsonl").read_bytes() == (
        out / "recorded" / "run" / "ledger.jsonl"
    ).read_bytes()


def test_bundle_without_data_asks_for_it_and_checks_it(
    packed: tuple[TinyProject, Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No data in the bundle: exit 2 asking for --data, nothing left; --data with an edited row:
    refused naming the row; --data with the right file: IDENTICAL."""
    project, _, bundle = packed
    monkeypatch.chdir(tmp_path)  # another working directory, outside any git tree
    out = tmp_path / "u"
    assert main(["rerun", str(bundle), "--out", str(out), "--no-progress"]) == 2
    assert "--data PATH" in capsys.readouterr().err and not out.exists()
    edited = tmp_path / "edited.jsonl"
    lines = (project.root / "data.jsonl").read_text().splitlines()
    lines[5] = lines[5].replace('"response":"', '"response":"changed ')
    edited.write_text("\n".join(lines) + "\n")
    assert main(["rerun", str(bundle), "--out", str(out), "--data", str(edited), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "not the data the run was made from" in err and "5" in err and not out.exists()
    good = [
        "rerun",
        str(bundle),
        "--out",
        str(out),
        "--data",
        str(project.root / "data.jsonl"),
        "--no-progress",
    ]
    assert main(good) == 0


def _rewrite(bundle: Path, out: Path, edit: str) -> Path:
    """A copy of ``bundle`` with one hostile change."""
    with tarfile.open(bundle) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(out, "w:gz") as tar:
        for member, data in members:
            if edit == "tampered" and member.name == "run/ledger.jsonl":  # one digit, same size
                i = data.index(b'"loss":"0x1.') + len(b'"loss":"0x1.')
                data = data[:i] + (b"0" if data[i : i + 1] != b"0" else b"1") + data[i + 1 :]
            if edit == "resized" and member.name == "run/ledger.jsonl":
                data = data.replace(b'"loss":"0x', b'"loss":"-0x', 1)
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        extra = tarfile.TarInfo()
        if edit == "absolute":
            extra.name, payload = "/tmp/reprotune-evil", b"x"
        elif edit == "dotdot":
            extra.name, payload = "run/../../evil.txt", b"x"
        elif edit == "symlink":
            extra.name, extra.type, extra.linkname, payload = "run/link", tarfile.SYMTYPE, "/etc/passwd", b""
        else:
            return out
        extra.size = len(payload)
        tar.addfile(extra, io.BytesIO(payload))
    return out


@pytest.mark.parametrize("edit", ["tampered", "resized", "absolute", "dotdot", "symlink"])
def test_hostile_bundles_are_refused(
    packed: tuple[TinyProject, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: str
) -> None:
    """A changed member, an absolute path, a '..' path or a link: exit 2, nothing written."""
    _, bundle, _ = packed
    hostile = _rewrite(bundle, tmp_path / f"{edit}.tar.gz", edit)
    out = tmp_path / "out"
    assert main(["rerun", str(hostile), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    expected = {
        "tampered": "does not match its sha256",
        "resized": "bundle.json says",
        "absolute": "absolute path",
        "dotdot": "points outside the bundle",
        "symlink": "is a link",
    }[edit]
    assert expected in err
    assert (
        not out.exists() and not (tmp_path / "evil.txt").exists() and not Path("/tmp/reprotune-evil").exists()
    )


def test_a_bundles_rerun_is_mirrored_nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run mirrored to MLflow, packed and rerun elsewhere: the rerun sends nothing to the tracker
    the bundle's config names (it may name any host, and the rerunner's MLflow credentials would go
    with it) and writes no store where it runs (before: mlflow.db and mlartifacts/ there)."""
    project = TinyProject.create(tmp_path / "made")
    project.config(
        "tracked.yaml", train={"max_steps": 2, "save_every": 0, "eval_every": 2}, tracking={"mlflow": True}
    )
    project.run_cli("run", "tracked.yaml", "--run-dir", "runs/t", "--no-progress")
    assert "mlflow" in json.loads((project.root / "runs" / "t" / "record.json").read_text())["trackers"]
    project.run_cli("pack", "runs/t", "-o", "t.tar.gz", "--with-data")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["rerun", str(project.root / "t.tar.gz"), "--out", "out", "--no-progress"]) == 0
    assert json.loads((elsewhere / "out" / "rerun.json").read_text())["verdict"] == "IDENTICAL"
    assert json.loads((elsewhere / "out" / "rerun" / "record.json").read_text())["trackers"] == {}
    assert sorted(p.name for p in elsewhere.iterdir()) == ["out"]


def test_a_bundle_rerun_stopped_before_it_trains_leaves_nothing(
    packed: tuple[TinyProject, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the rerun loads its data or model: the unpacked bundle is removed, so the same
    command can run again (before, only a refusal was cleaned up, and --out was left not empty)."""
    from reprotune._proof import rerun as rerun_module

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(rerun_module, "rerun", interrupted)
    _, bundle, _ = packed
    with pytest.raises(KeyboardInterrupt):
        rerun_module.rerun_bundle(
            bundle, out=tmp_path / "out", data=None, allow_code_drift=False, code_dir=tmp_path, progress=False
        )
    assert not (tmp_path / "out").exists()


def test_a_run_whose_files_are_not_the_ones_it_recorded_is_not_packed(
    packed: tuple[TinyProject, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy of the run without its adapter, with one byte of the adapter changed, or without its
    ledger is refused (exit 2, naming the file), before a bundle reruns it elsewhere to a verdict
    about damaged files; a Trainer-made run is refused saying to run its script (before: packed,
    or 39 config errors)."""
    import shutil

    project, _, _ = packed
    source = project.root / "runs" / "r"

    def copy(name: str) -> Path:
        run = tmp_path / name
        shutil.copytree(source, run)
        return run

    missing, changed, no_ledger, trainer = (
        copy("missing"),
        copy("changed"),
        copy("no-ledger"),
        copy("trainer"),
    )
    (missing / "adapter" / "adapter_model.safetensors").unlink()
    weights = changed / "adapter" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    (no_ledger / "ledger.jsonl").unlink()
    record = json.loads((trainer / "record.json").read_text())
    record["config"] = {"trainer": {"class": "transformers.Trainer", "args": {}}}
    (trainer / "record.json").write_text(json.dumps(record))
    expected = {
        missing: "adapter_model.safetensors is missing",
        changed: "adapter_model.safetensors is not the file the run wrote",
        no_ledger: "ledger.jsonl is missing",
        trainer: "written by ReprotuneCallback inside a Trainer script",
    }
    for run, words in expected.items():
        capsys.readouterr()
        assert main(["pack", str(run), "-o", str(tmp_path / f"{run.name}.tar.gz")]) == 2
        assert words in capsys.readouterr().err
        assert not (tmp_path / f"{run.name}.tar.gz").exists()


CREDENTIAL_LINES = [
    ('+aws_secret_access_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"', "a secret assigned to"),
    ("+WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567", "a secret assigned to WANDB_API_KEY"),
    ("+export HF_TOKEN=abcdEFGH1234ijklMNOP5678", "a secret assigned to HF_TOKEN"),
    ("+-----BEGIN OPENSSH PRIVATE KEY-----", "a private key"),
    (
        '+h = {"Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.x"}',
        "a JSON web token",
    ),
    ('+url = "https://user:s3cretPassw0rd@example.com/repo.git"', "a URL with a password"),
    ('+os.environ["WANDB_API_KEY"] = "0123456789abcdef0123456789abcdef01234567"', "a secret assigned to"),
    ("+os.environ.setdefault('WANDB_API_KEY', 'Zx81kLq0PvN3mW7tR2yB9cD4')", "a secret assigned to"),
    ('+api_key: str = "Zx81kLq0PvN3mW7tR2yB9cD4"', "a secret assigned to api_key"),
    ('+API_KEY = "123e4567-e89b-12d3-a456-426614174000"', "a secret assigned to API_KEY"),
    ("+API_KEY = Zx81kLq0PvN3mW7tR2yB9cD4  # prod", "a secret assigned to API_KEY"),
    ("+MLFLOW_TRACKING_PASSWORD=Zx81kLq0PvN3mW7tR2yB9cD4 python train.py", "a secret assigned to"),
]
#: Code that names secrets without holding one.
INNOCENT_LINES = [
    '+pad_token = "<|im_start|>assistant"',
    "+token = tokenizer.eos_token_id",
    '+api_key = os.environ["WANDB_API_KEY"]',
    '+repo = "https://user@host/repo.git"',
    '+key = "model.layers.0.self_attn.q_proj"',
    '+cache_key = "layer_0_attention_weights_v2"',
    "+max_tokens = 512",
    '+cache_key = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"',  # a sha256
    '+model_key = "meta-llama/Llama-2-7b-hf"',
    '+    "dataset_key": "HuggingFaceH4/ultrachat_200k",',
    "+    token: Qwen2TokenizerFast",
    '+username = "runner2024buildbot"',
]


@pytest.mark.parametrize(("line", "what"), CREDENTIAL_LINES, ids=[w for _, w in CREDENTIAL_LINES])
def test_a_patch_line_holding_a_credential_is_found(line: str, what: str) -> None:
    """Credentials without a token's shape (before: only shaped tokens, hf_/ghp_/sk-/AKIA..., were
    found, and these went into the bundle): named with the file and line."""
    from reprotune._proof.bundle import first_token_in_patch

    patch = f"diff --git a/train.py b/train.py\n@@ -1,1 +1,2 @@\n import os\n{line}\n"
    found = first_token_in_patch(patch)
    assert found is not None and found[:2] == ("train.py", 2) and found[2].startswith(what), found


@pytest.mark.parametrize("line", INNOCENT_LINES)
def test_code_that_names_a_secret_without_holding_one_is_not_refused(line: str) -> None:
    from reprotune._config.secrets import credential_in

    assert credential_in(line) is None


def test_a_data_file_named_with_a_backslash_is_not_packed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A legal Linux file name no bundle member may hold: pack refuses it, saying to pass the data
    to rerun instead (before: packed, then refused by rerun as pointing outside the bundle, '..',
    with the fix to pack it again)."""
    project = TinyProject.create(tmp_path / "made")
    (project.root / "data.jsonl").rename(project.root / "we\\ird.jsonl")
    project.config("odd.yaml", data={"path": "we\\ird.jsonl"}, train={"max_steps": 1, "save_every": 0})
    project.run_cli("run", "odd.yaml", "--run-dir", "runs/odd", "--no-progress")
    capsys.readouterr()
    assert (
        main(["pack", str(project.root / "runs" / "odd"), "-o", str(tmp_path / "odd.tar.gz"), "--with-data"])
        == 2
    )
    err = capsys.readouterr().err
    assert "holds a backslash" in err and "rerun BUNDLE --data PATH" in err
    assert not (tmp_path / "odd.tar.gz").exists()


def test_a_long_line_starts_a_name_only_where_one_can_start() -> None:
    """A committed blob on one line (80,000 hex digits) holds no credential. Each name starts after
    a character no name holds, so the line is read once (it took 49 s when every character started
    a name again, and a 1 MB line hours: the lookbehind is what this checks, timing is bench's)."""
    import secrets

    from reprotune._config import secrets as policy

    blob = secrets.token_hex(40_000)
    assert policy.credential_in("+" + blob) is None
    assert policy.credential_in('+blob = "' + blob + '" + "https://x"') is None
    assert [m.start() for m in policy._ASSIGNED.finditer("+x" + blob + " = 1")] == [1]
    # No name starts inside a run of name characters: without the lookbehind this matched at "x".
    assert policy._ASSIGNED.search("+9x" + blob + " = 1") is None
