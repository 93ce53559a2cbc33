"""Reproduction bundles: pack a run, rerun it from another directory; hostile bundles refused."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from reprotune._cli import main
from reprotune._jsonio import sha256_file
from reprotune._proof.bundle import MANIFEST
from reprotune._run.checkpoint_files import DATA_FILES, STATE_FILE
from tinyrun import TinyProject


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[TinyProject, Path, Path]:
    """A completed tiny run (a checkpoint at step 2), packed with and without its data."""
    project = TinyProject.create(tmp_path_factory.mktemp("bundle-project"))
    project.config("cfg.yaml", train={"max_steps": 3, "save_every": 2, "eval_every": 3})
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
    """Rerun the bundle in another directory, from another working directory (a git checkout, so
    other code than the run's, made outside one: let through by --allow-code-drift): IDENTICAL, and
    rerun.json says so, and that the code drift was allowed, and what differed (before: not said)."""
    import subprocess

    _, bundle, _ = packed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=elsewhere, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "other code"], cwd=elsewhere, check=True)
    monkeypatch.chdir(elsewhere)
    out = tmp_path / "unpacked"
    code = main(["rerun", str(bundle), "--out", str(out), "--no-progress", "--allow-code-drift"])
    assert code == 0
    summary = json.loads((out / "rerun.json").read_text())
    assert summary["verdict"] == "IDENTICAL" and summary["bundle_sha256"] == sha256_file(bundle)
    assert summary["code_drift_allowed"] is True
    assert [line.split(":")[0] for line in summary["code_drift"]] == ["code.commit"], summary["code_drift"]
    assert summary["code_drift"][0].startswith("code.commit: recorded None, now '")
    from reprotune._proof.report import write_report

    html = write_report([out], tmp_path / "page.html").read_text(encoding="utf-8")
    assert (
        "The code here was not the run's (let through by <code>--allow-code-drift</code>): code.commit"
        in html
    )
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
    summary = json.loads((out / "rerun.json").read_text())
    assert summary["code_drift_allowed"] is False and summary["code_drift"] == []


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


def _copy_of_the_run(packed: tuple[TinyProject, Path, Path], to: Path) -> Path:
    import shutil

    shutil.copytree(packed[0].root / "runs" / "r", to)
    return to


def _edit_record(run: Path, edit: dict[str, dict[str, object]]) -> None:
    """Update sections of the run's record.json (a key whose value is None is removed)."""
    record = json.loads((run / "record.json").read_text())
    for section, changes in edit.items():
        for key, value in changes.items():
            if value is None:
                record[section].pop(key, None)
            else:
                record.setdefault(section, {})[key] = value
    (run / "record.json").write_text(json.dumps(record))


def _split_with_test_rows_dropped(run: Path) -> tuple[str, str]:
    """Edit the run's split.json as a hand would: the test rows moved to ``dropped``, the sizes
    made to agree (a manifest that loads). Returns (recorded sha256, the edited file's)."""
    manifest = json.loads((run / "split.json").read_text())
    manifest["dropped"], manifest["test"] = sorted(manifest["dropped"] + manifest["test"]), []
    manifest["sizes"] |= {"dropped": len(manifest["dropped"]), "test": 0}
    recorded = sha256_file(run / "split.json")
    (run / "split.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return recorded, sha256_file(run / "split.json")


@pytest.mark.parametrize("case", ["split-edited", "split-missing", "patch-missing", "patch-other"])
def test_a_run_whose_split_or_patch_is_not_the_recorded_one_is_not_packed(
    packed: tuple[TinyProject, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """A split.json edited by hand (test rows moved to dropped, sizes made to agree) or removed,
    and a dirty run's code.patch missing or not the recorded diff: refused (exit 2) naming the
    file, both sha256 and the fix (before: packed, and the bundle reran to IDENTICAL)."""
    run = _copy_of_the_run(packed, tmp_path / "run")
    words: list[str]
    if case == "split-edited":
        recorded, found = _split_with_test_rows_dropped(run)
        words = ["split.json is not the split the run was made with", recorded, found, "restore"]
    elif case == "split-missing":
        (run / "split.json").unlink()
        words = ["split.json is missing", "copy the run directory again"]
    else:
        diff = b"diff --git a/train.py b/train.py\n+x = 1\n"
        _edit_record(run, {"code": {"dirty": True, "diff_sha256": hashlib.sha256(diff).hexdigest()}})
        words = ["code.patch is missing"]
        if case == "patch-other":
            (run / "code.patch").write_bytes(diff + b"+y = 2\n")
            words = [
                "code.patch is not the diff",
                hashlib.sha256(diff).hexdigest(),
                sha256_file(run / "code.patch"),
            ]
    capsys.readouterr()
    assert main(["pack", str(run), "-o", str(tmp_path / "b.tar.gz")]) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, err
    assert "fix:" in err and not (tmp_path / "b.tar.gz").exists()


def test_a_record_without_the_split_hash_or_a_diff_packs_as_before(
    packed: tuple[TinyProject, Path, Path], tmp_path: Path
) -> None:
    """A record written without data.manifest_sha256 is not held to it (nothing new said), and a
    run dirty by untracked files alone (no diff) needs no code.patch."""
    run = _copy_of_the_run(packed, tmp_path / "run")
    _split_with_test_rows_dropped(run)
    _edit_record(run, {"data": {"manifest_sha256": None}, "code": {"dirty": True, "diff_sha256": None}})
    assert main(["pack", str(run), "-o", str(tmp_path / "b.tar.gz")]) == 0


def test_pack_packs_only_the_adapter_files_the_record_lists(
    packed: tuple[TinyProject, Path, Path], tmp_path: Path
) -> None:
    """A stray adapter/.env holding a token is not packed: only outputs.adapter_files are (before:
    every file in adapter/)."""
    run = _copy_of_the_run(packed, tmp_path / "run")
    (run / "adapter" / ".env").write_text("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789\n")
    listed = json.loads((run / "record.json").read_text())["outputs"]["adapter_files"]
    assert main(["pack", str(run), "-o", str(tmp_path / "b.tar.gz")]) == 0
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        adapter = sorted(
            n.removeprefix("run/adapter/") for n in tar.getnames() if n.startswith("run/adapter/")
        )
    assert adapter == sorted(listed) and "adapter_model.safetensors" in adapter


def test_pack_packs_only_the_checkpoint_files_their_state_lists(
    packed: tuple[TinyProject, Path, Path], tmp_path: Path
) -> None:
    """A stray checkpoints/step-00000002/.env holding a token is not packed with --checkpoints:
    of each checkpoint, only state.json and the files it lists, as of adapter/ only the files the
    record lists (before: every file there)."""
    run = _copy_of_the_run(packed, tmp_path / "run")
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert "step-00000002" in checkpoints
    (run / "checkpoints" / "step-00000002" / ".env").write_text(
        "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789\n"
    )
    assert main(["pack", str(run), "-o", str(tmp_path / "b.tar.gz"), "--checkpoints"]) == 0
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        packed_files = sorted(n for n in tar.getnames() if n.startswith("run/checkpoints/"))
    expected = [f"run/checkpoints/{c}/{f}" for c in checkpoints for f in sorted([STATE_FILE, *DATA_FILES])]
    assert packed_files == expected


def test_pack_to_a_path_that_cannot_be_written_is_refused_naming_it(
    packed: tuple[TinyProject, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """-o in /proc, which takes no new file whatever its permissions say (to root): exit 2 naming
    the path, with a fix (before: "internal error (please report it)" and a traceback, exit 1)."""
    capsys.readouterr()
    assert main(["pack", str(packed[0].root / "runs" / "r"), "-o", "/proc/x.tar.gz"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reprotune pack: error: ") and "/proc/x.tar.gz" in err and "\nfix: " in err
    assert "internal error" not in err and "Traceback" not in err


def test_pack_refuses_a_linked_checkpoints_directory(
    packed: tuple[TinyProject, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """checkpoints/ a symbolic link to a directory outside the run (of whole, verified
    checkpoints): `pack --checkpoints` refuses it like any link (before: followed and packed)."""
    import shutil

    run = _copy_of_the_run(packed, tmp_path / "run")
    shutil.move(run / "checkpoints", tmp_path / "elsewhere")
    (run / "checkpoints").symlink_to(tmp_path / "elsewhere")
    capsys.readouterr()
    assert main(["pack", str(run), "-o", str(tmp_path / "b.tar.gz"), "--checkpoints"]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'checkpoints'} is a symbolic link" in err and not (tmp_path / "b.tar.gz").exists()
    assert main(["pack", str(run), "-o", str(tmp_path / "b.tar.gz")]) == 0  # without them: packed


def test_a_run_whose_split_was_edited_is_not_rerun(
    packed: tuple[TinyProject, Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """rerun RUN_DIR of a run whose split.json was edited (test rows moved to dropped): refused
    before training (exit 2) naming the file and both sha256 (before: it reran, on the edited
    split, to IDENTICAL)."""
    monkeypatch.chdir(tmp_path)
    run = _copy_of_the_run(packed, tmp_path / "run")
    recorded, found = _split_with_test_rows_dropped(run)
    capsys.readouterr()
    assert main(["rerun", str(run), "--run-dir", str(tmp_path / "again"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'split.json'} is not the split the run was made with" in err
    assert recorded in err and found in err and "fix:" in err
    assert not (tmp_path / "again").exists()


def test_a_run_made_under_torchrun_is_not_rerun_in_one_process(
    packed: tuple[TinyProject, Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain rerun of a run made under torchrun at world size 2 (a run directory, or its bundle):
    refused before training (exit 2) with the torchrun command that reruns it, nothing left
    (before: it trained the whole run in one process and reported a false DIVERGED)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    run = _copy_of_the_run(packed, tmp_path / "run")
    _edit_record(run, {"distributed": {"world_size": 2, "launcher": "torchrun", "nodes": 1}})
    capsys.readouterr()
    assert main(["rerun", str(run), "--run-dir", str(tmp_path / "again"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "made under torchrun at world size 2; this rerun runs in one process" in err
    assert f"`torchrun --standalone --nproc_per_node 2 -m reprotune rerun {run}`" in err
    assert not (tmp_path / "again").exists()
    bundle, out = tmp_path / "dist.tar.gz", tmp_path / "out"
    assert main(["pack", str(run), "-o", str(bundle), "--with-data"]) == 0
    capsys.readouterr()
    assert main(["rerun", str(bundle), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"`torchrun --standalone --nproc_per_node 2 -m reprotune rerun {bundle} --out {out}`" in err
    assert not out.exists()
