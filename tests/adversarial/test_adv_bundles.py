"""Issue 24, bundles: the embedded default travels, a bundle is confined to its own members, its
claims are checked before a byte is read, and ``pack`` packs only the run's own, unchanged files.
Every refusal exits 2 and leaves the file tree byte for byte as it was."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from adv_support import file_tree

from reprotune._cli import main
from reprotune._formats import BUNDLE
from reprotune._jsonio import sha256_bytes
from reprotune._proof.bundle import MANIFEST
from tinyrun import TinyProject


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> TinyProject:
    """A tiny run on a data file (runs/r) and one on the embedded corpus (runs/b)."""
    project = TinyProject.create(tmp_path_factory.mktemp("adv-bundles"))
    train = {"max_steps": 2, "save_every": 0, "eval_every": 2}
    project.config("cfg.yaml", train=train)
    project.config("builtin.yaml", train=train, data={"path": "builtin:chatterbot-en"})
    for config, run in (("cfg.yaml", "runs/r"), ("builtin.yaml", "runs/b")):
        project.run_cli("run", config, "--run-dir", run, "--no-progress", "--no-tracking")
    return project


def test_a_builtin_data_bundle_reruns_elsewhere_with_no_flag(
    project: TinyProject, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """pack of a run on builtin:chatterbot-en, with or without --with-data (nothing to pack), and
    `rerun BUNDLE` with no --data: the corpus is checked against the run's manifest, IDENTICAL;
    `--data builtin:chatterbot-en` names it too. (From a directory outside any git tree, as the
    run was made.)"""
    monkeypatch.chdir(tmp_path)
    run = project.root / "runs" / "b"
    assert main(["pack", str(run), "-o", str(tmp_path / "b.tar.gz"), "--with-data"]) == 0
    assert "builtin:chatterbot-en (ships with reprotune" in capsys.readouterr().out
    assert main(["rerun", str(tmp_path / "b.tar.gz"), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    assert "IDENTICAL" in capsys.readouterr().out
    out = tmp_path / "named"
    argv = ["rerun", str(tmp_path / "b.tar.gz"), "--out", str(out), "--data", "builtin:chatterbot-en"]
    assert main([*argv, "--no-progress"]) == 0
    assert json.loads((out / "rerun.json").read_text())["verdict"] == "IDENTICAL"


def _members(bundle: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(bundle) as tar:
        return [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]


def _write(
    out: Path, manifest: dict[str, Any], members: list[tuple[str, bytes]], *, nested: bytes = b""
) -> Path:
    """A bundle: bundle.json first (or ``nested`` raw bytes in its place), then ``members``."""
    with tarfile.open(out, "w:gz") as tar:
        for name, data in [(MANIFEST, nested or json.dumps(manifest).encode()), *members]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


@pytest.fixture(scope="module")
def honest(project: TinyProject, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list]:
    """The manifest and members of runs/r packed with its data."""
    bundle = tmp_path_factory.mktemp("honest") / "r.tar.gz"
    project.run_cli("pack", "runs/r", "-o", str(bundle), "--with-data")
    members = _members(bundle)
    manifest = json.loads(members[0][1])
    return manifest, [(m.name, data) for m, data in members[1:]]


def _listing(members: list[tuple[str, bytes]]) -> dict[str, dict[str, Any]]:
    return {name: {"sha256": sha256_bytes(data), "size": len(data)} for name, data in members}


def _refused(argv: list[str], root: Path, capsys: pytest.CaptureFixture[str], expected: str) -> None:
    before = file_tree(root)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err, err
    assert "Traceback" not in err
    assert file_tree(root) == before


@pytest.mark.parametrize(
    "reference", ["/etc/hostname", "../../x.jsonl", "run/record.json", "data/absent.jsonl"]
)
def test_a_data_reference_must_be_a_data_member(
    honest: tuple[dict[str, Any], list], reference: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bundle.json naming a file on the machine, outside the bundle, a non-data member or no member
    as its data: refused before anything is read or written."""
    manifest, members = honest
    forged = dict(manifest, data={"member": reference, "sha256": "0" * 64})
    bundle = _write(tmp_path / "forged.tar.gz", forged, members)
    argv = ["rerun", str(bundle), "--out", str(tmp_path / "out"), "--no-progress"]
    _refused(argv, tmp_path, capsys, "is not one of its data/ members")


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("dot", "is not a normalised path"),
        ("file-and-directory", "inside another member"),
        ("long-name", "cannot be written here"),
        ("unlisted", "is not listed in bundle.json"),
        ("lying-size", "bundle.json says"),
        ("outside", "lists members outside run/ and data/ ('setup.py')"),
    ],
)
def test_member_paths_that_cannot_be_one_file_each_are_refused(
    honest: tuple[dict[str, Any], list],
    case: str,
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`run/./record.json` beside `run/record.json`, a member that is also another's directory, a
    name too long for the filesystem, a member bundle.json does not list, a header size other than
    the listed one, a member outside run/ and data/ (which pack never writes): exit 2 with the
    member named, nothing written."""
    manifest, members = honest
    extra = {
        "dot": [("run/./record.json", b"{}")],
        "file-and-directory": [("run/record.json/inner", b"x")],
        "long-name": [("run/" + "x" * 300, b"x")],
        "unlisted": [],
        "lying-size": [],
        "outside": [("setup.py", b"import os")],
    }[case]
    listed = _listing(members + extra)
    if case == "unlisted":
        extra = [("run/extra.txt", b"x")]
    if case == "lying-size":
        listed["run/ledger.jsonl"]["size"] -= 1
    bundle = _write(tmp_path / f"{case}.tar.gz", dict(manifest, members=listed), members + extra)
    argv = ["rerun", str(bundle), "--out", str(tmp_path / "out"), "--no-progress"]
    _refused(argv, tmp_path, capsys, expected)


def test_a_compression_bomb_is_refused_before_a_byte_of_it_is_read(
    honest: tuple[dict[str, Any], list], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 64 MB member of zeros (about 64 KB compressed) listed as it is: refused from bundle.json's
    claims alone. The proof that nothing of it is read: the archive is cut off right after
    bundle.json, and the refusal is still the bomb's, not a damaged archive's."""
    manifest, members = honest
    zeros = bytes(64 << 20)
    bomb = [*members, ("data/zeros.bin", zeros)]
    whole = _write(tmp_path / "whole.tar.gz", dict(manifest, members=_listing(bomb)), bomb)
    assert whole.stat().st_size < (64 << 20) // 200
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(gzip.compress(gzip.decompress(whole.read_bytes())[: 512 * 8]))
    for bundle in (whole, cut):
        argv = ["rerun", str(bundle), "--out", str(tmp_path / "out"), "--no-progress"]
        _refused(argv, tmp_path, capsys, "a compression bomb, refused before reading")


def test_a_deeply_nested_bundle_json_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """bundle.json nested 200,000 deep: a clear exit 2, no RecursionError traceback."""
    nested = b"[" * 200_000 + b"]" * 200_000
    bundle = _write(tmp_path / "deep.tar.gz", {}, [], nested=nested)
    argv = ["rerun", str(bundle), "--out", str(tmp_path / "out"), "--no-progress"]
    _refused(argv, tmp_path, capsys, "nested too deeply")


def test_bundle_json_must_come_first(
    honest: tuple[dict[str, Any], list], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle whose first member is not bundle.json (so its claims could not be checked first)."""
    manifest, members = honest
    with tarfile.open(tmp_path / "late.tar.gz", "w:gz") as tar:
        for name, data in [*members, (MANIFEST, json.dumps(manifest).encode())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    argv = ["rerun", str(tmp_path / "late.tar.gz"), "--out", str(tmp_path / "out"), "--no-progress"]
    _refused(argv, tmp_path, capsys, "does not start with bundle.json")
    assert manifest["schema"] == BUNDLE.schema and manifest["schema_version"] == BUNDLE.version


def test_pack_refuses_a_symbolic_link_in_the_run(
    project: TinyProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run file replaced by a link to a file outside the run: pack refuses, naming it, and
    writes nothing (it never packs what a link points to)."""
    run = tmp_path / "linked"
    run.mkdir()
    for path in (project.root / "runs" / "r").rglob("*"):
        target = run / path.relative_to(project.root / "runs" / "r")
        if path.is_dir():
            target.mkdir(exist_ok=True)
        else:
            target.write_bytes(path.read_bytes())
    secret = tmp_path / "secret.txt"
    secret.write_text("not the run's\n")
    (run / "code.patch").unlink(missing_ok=True)
    (run / "code.patch").symlink_to(secret)
    _refused(["pack", str(run), "-o", str(tmp_path / "x.tar.gz")], tmp_path, capsys, "is a symbolic link")


def test_pack_with_data_checks_the_data_against_the_record(
    project: TinyProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--with-data of a data file changed since the run: refused here, not on the other machine."""
    data = project.root / "data.jsonl"
    original = data.read_bytes()
    try:
        data.write_bytes(original + b"\n")  # one more line end: other bytes, other sha256
        argv = ["pack", str(project.root / "runs" / "r"), "-o", str(tmp_path / "x.tar.gz"), "--with-data"]
        _refused(argv, tmp_path, capsys, "has changed since the run")
    finally:
        data.write_bytes(original)


def test_a_cut_bundle_is_damaged_not_a_traceback(
    honest: tuple[dict[str, Any], list], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle cut off inside bundle.json, or inside a member: exit 2 "damaged" (the record peek
    that runs before torch loads reads it too)."""
    manifest, members = honest
    whole = _write(tmp_path / "whole.tar.gz", manifest, members)
    raw = gzip.decompress(whole.read_bytes())
    for cut in (700, len(raw) // 2):
        bundle = tmp_path / f"cut-{cut}.tar.gz"
        bundle.write_bytes(gzip.compress(raw[:cut]))
        argv = ["rerun", str(bundle), "--out", str(tmp_path / "out"), "--no-progress"]
        _refused(argv, tmp_path, capsys, "the bundle is damaged")


@pytest.mark.parametrize(("name", "expected"), [(".", "has no name"), ("run/" + "a/" * 20 + "f", "levels")])
def test_member_names_that_are_no_path_or_too_deep_are_refused(
    honest: tuple[dict[str, Any], list],
    name: str,
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A member named "." (an IndexError before) or nested 21 levels (a RecursionError while its
    folders were made): exit 2 before it is read. ("." is in the archive only: listed, it would be
    refused before any member is read, as outside run/ and data/.)"""
    manifest, members = honest
    extra = [*members, (name, b"x")]
    listed = _listing(extra if name.startswith("run/") else members)
    bundle = _write(tmp_path / "odd.tar.gz", dict(manifest, members=listed), extra)
    argv = ["rerun", str(bundle), "--out", str(tmp_path / "out"), "--no-progress"]
    _refused(argv, tmp_path, capsys, expected)


def test_a_header_larger_than_the_listing_allows_is_refused(
    honest: tuple[dict[str, Any], list], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A member whose GNU long-name header is 8 MB (read whole by tar before any check; 500 MB once
    took 2 GB of memory): the decompressed stream is bounded to what bundle.json lists, refused."""
    manifest, _ = honest
    bundle = tmp_path / "longname.tar.gz"
    with tarfile.open(bundle, "w:gz", format=tarfile.GNU_FORMAT) as tar:
        for name, data in [(MANIFEST, json.dumps(manifest).encode()), (f"run/{'n' * (8 << 20)}", b"x")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    argv = ["rerun", str(bundle), "--out", str(tmp_path / "out"), "--no-progress"]
    _refused(argv, tmp_path, capsys, "the bundle holds more than its bundle.json lists")


def test_a_bundle_without_its_split_names_the_member_not_the_removed_unpack(
    honest: tuple[dict[str, Any], list], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle made by hand (or by an old pack) without run/split.json: refused before training,
    the message naming the bundle's member (before: the path it was unpacked to, removed by the
    refusal), nothing left."""
    manifest, members = honest
    kept = [(name, data) for name, data in members if name != "run/split.json"]
    bundle = _write(tmp_path / "no-split.tar.gz", dict(manifest, members=_listing(kept)), kept)
    out = tmp_path / "out"
    argv = ["rerun", str(bundle), "--out", str(out), "--no-progress"]
    _refused(argv, tmp_path, capsys, f"{bundle}: run/split.json is missing")
