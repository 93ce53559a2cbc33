"""Issue 16, items 2, 3 and 7 (split): outputs never overwrite inputs, a manifest and its sidecar are
replaced together or not at all, and every bad ``split`` input is exit 2 with a message.

No model and no training: ``split`` and ``report`` run in this process through ``main``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from adv_support import fill_leaving

from reprotune._cli import main
from reprotune._data import manifest as manifest_module
from reprotune._data.loaders import table_from_columns
from reprotune._data.manifest import load_manifest, write_manifest
from reprotune._data.split import split_table
from reprotune._errors import InputError
from reprotune._formats import SPLIT_MANIFEST
from reprotune._html import GENERATOR
from reprotune._run import outputs
from rundirs import RunSpec, write_run_dir
from tinyrun import TinyProject

ROWS = "".join(json.dumps({"text": f"row {i}", "label": "ab"[i % 2]}) + "\n" for i in range(40))


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text(ROWS, encoding="utf-8")
    return path


def _assert_refused(capsys: pytest.CaptureFixture[str], *expected: str) -> str:
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err and "internal error" not in err, err
    for text in expected:
        assert text in err, err
    return err


# --- item 2: outputs never overwrite inputs -----------------------------------------------------


@pytest.mark.parametrize("how", ["same path", "symlink", "hard link", "relative path"])
def test_split_out_onto_its_data_is_refused(
    data: Path, how: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`split d.jsonl --out d.jsonl` (or a link to it) exits 2 and the data keeps every byte."""
    out = data
    if how == "symlink":
        out = data.parent / "link.json"
        out.symlink_to(data)
    elif how == "hard link":
        out = data.parent / "hard.json"
        os.link(data, out)
    elif how == "relative path":
        monkeypatch.chdir(data.parent)
        out = Path("sub") / ".." / data.name
        (data.parent / "sub").mkdir()
    assert main(["split", str(data), "--out", str(out)]) == 2
    _assert_refused(capsys, "--out", "the same file", "writing it would destroy what it holds")
    assert data.read_text(encoding="utf-8") == ROWS


def test_report_onto_a_run_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`report RUN -o RUN/record.json` exits 2 and the record keeps every byte."""
    run = write_run_dir(tmp_path / "A", RunSpec())
    record = (run / "record.json").read_bytes()
    assert main(["report", str(run), "-o", str(run / "record.json")]) == 2
    _assert_refused(capsys, "is inside", str(run))
    assert (run / "record.json").read_bytes() == record
    assert main(["report", str(run), "-o", str(run / "new.html")]) == 2  # no new file in a run either
    assert not (run / "new.html").exists()


def test_split_out_into_a_run_directory_is_refused(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A manifest written over a run's split.json would change a recorded run: refused."""
    run = write_run_dir(tmp_path / "A", RunSpec())
    manifest = (run / "split.json").read_bytes()
    assert main(["split", str(data), "--out", str(run / "split.json")]) == 2
    _assert_refused(capsys, "is inside the run directory")
    assert (run / "split.json").read_bytes() == manifest


@pytest.mark.parametrize("kind", ["config", "json", "other schema", "data"])
def test_split_out_onto_a_file_that_is_not_a_manifest_is_refused(
    tmp_path: Path, data: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`split --out` onto an existing file that is not a split manifest (a config, another JSON
    document, another data file): exit 2, the file keeps every byte."""
    out = tmp_path / {"config": "cfg.yaml", "json": "notes.json", "other schema": "bundle.json"}.get(
        kind, "other.jsonl"
    )
    content = {
        "config": "seed: {root: 1}\n",
        "json": '{"note": "mine"}',
        "other schema": '{"schema": "reprotune/bundle"}',
    }.get(kind, ROWS)
    out.write_text(content, encoding="utf-8")
    assert main(["split", str(data), "--out", str(out)]) == 2
    _assert_refused(capsys, f"--out {str(out)!r} exists and is not a split manifest", "give --out a new path")
    assert out.read_text(encoding="utf-8") == content


def test_split_out_replaces_a_manifest_or_an_empty_file(tmp_path: Path, data: Path) -> None:
    """A manifest written again (another seed) replaces the old one; an empty file holds nothing."""
    out = tmp_path / "split.json"
    assert main(["split", str(data), "--out", str(out), "--seed", "1"]) == 0
    first = out.read_bytes()
    assert main(["split", str(data), "--out", str(out), "--seed", "2"]) == 0
    assert out.read_bytes() != first and load_manifest(out).seed == 2
    empty = tmp_path / "empty.json"
    empty.touch()
    assert main(["split", str(data), "--out", str(empty)]) == 0 and load_manifest(empty).n_rows == 40


def test_a_data_file_at_out_is_told_from_a_manifest_without_reading_it_whole(
    tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JSON Lines (a whole object on its first line, more after it) is not a manifest, told from
    its first line: the file is never read whole (a data file can be gigabytes). A manifest written
    over several lines (pretty-printed by hand) is read whole and is one."""
    pretty = tmp_path / "pretty.json"
    assert main(["split", str(data), "--out", str(pretty)]) == 0
    pretty.write_text(json.dumps(json.loads(pretty.read_text(encoding="utf-8")), indent=2), encoding="utf-8")
    kind = outputs.json_document(SPLIT_MANIFEST)
    whole: list[Path] = []
    read_bytes = Path.read_bytes

    def counted(path: Path) -> bytes:
        whole.append(path)
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", counted)
    assert not kind.holds(data) and whole == []
    assert kind.holds(pretty) and whole == [pretty]


def test_report_onto_a_file_that_is_not_a_page_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`report RUN -o cfg.yaml` exits 2 and the config keeps every byte; `-o` an earlier report
    (one marked as reprotune's, or one of the HTML kit's from before the mark) replaces it; `-o`
    someone's own HTML page is refused and kept."""
    run = write_run_dir(tmp_path / "A", RunSpec())
    config = tmp_path / "cfg.yaml"
    config.write_text("seed: {root: 1}\n", encoding="utf-8")
    assert main(["report", str(run), "-o", str(config)]) == 2
    _assert_refused(capsys, "exists and is not a page reprotune wrote")
    assert config.read_text(encoding="utf-8") == "seed: {root: 1}\n"
    page = tmp_path / "report.html"
    assert main(["report", str(run), "-o", str(page)]) == 0
    first = page.read_bytes()
    assert main(["report", str(run), str(run), "-o", str(page)]) == 0  # an earlier report: replaced
    assert page.read_bytes() != first
    # a page of the HTML kit from before the generator mark: replaced too
    page.write_text(
        "<!DOCTYPE html>\n<html><head><style>\nbody { font-family: system-ui, sans-serif; "
        "margin: 2em auto; max-width: 70em; color: #222; }</style></head></html>",
        encoding="utf-8",
    )
    assert main(["report", str(run), "-o", str(page)]) == 0
    assert GENERATOR in page.read_text(encoding="utf-8")
    # someone's own page (a project's index.html) is not reprotune's: refused, kept byte for byte
    theirs = tmp_path / "index.html"
    theirs.write_text("<!DOCTYPE html>\n<html><body>our project</body></html>", encoding="utf-8")
    assert main(["report", str(run), "-o", str(theirs)]) == 2
    _assert_refused(capsys, f"--out {str(theirs)!r} exists and is not a page reprotune wrote")
    assert theirs.read_text(encoding="utf-8") == "<!DOCTYPE html>\n<html><body>our project</body></html>"


def test_verify_out_onto_its_config_is_refused(
    project: TinyProject, capsys: pytest.CaptureFixture[str]
) -> None:
    """`verify CFG --out CFG`: exit 2 before anything runs; the config keeps every byte."""
    config = project.config("verify-out.yaml")
    before = config.read_bytes()
    assert main(["verify", str(config), "--out", str(config)]) == 2
    _assert_refused(capsys, "is a file, not a directory")
    assert config.read_bytes() == before


def test_a_verification_or_bundle_out_holding_other_files_is_refused_alike(
    project: TinyProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`verify CONFIG`, `verify --command` and a bundle's unpacking refuse an --out that holds
    someone's files with one message, before anything runs, and leave it as it was; a file given
    as --out is named as a file (verify --command called it "not empty")."""
    from reprotune._proof.unpack import unpack

    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine", encoding="utf-8")
    config = project.config("verify-full.yaml")
    for argv in (
        ["verify", str(config), "--out", str(full)],
        ["verify", "--command", "true", "--out", str(full)],
    ):
        assert main(argv) == 2
        _assert_refused(capsys, f"--out {str(full)!r} exists and is not empty", "give --out a new (or empty)")
    with pytest.raises(InputError, match=r"^--out '.*full' exists and is not empty"):
        unpack(tmp_path / "no-such.tar.gz", full)
    assert [p.name for p in full.iterdir()] == ["notes.txt"]
    assert main(["verify", "--command", "true", "--out", str(full / "notes.txt")]) == 2
    _assert_refused(capsys, "is a file, not a directory")


# --- item 7 (split): bad outputs and seeds ---------------------------------------------------------


def test_an_option_named_in_its_message_is_not_named_again(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refusal whose message opens with the option (`--out 'x' ...`) prints it once; one that does
    not is located by it (`--out: ...`)."""
    assert str(InputError("--out 'x' is a file", source="--out", fix="f")) == "--out 'x' is a file\nfix: f"
    assert str(InputError("x is a file", source="--out")) == "--out: x is a file"
    assert str(InputError("--outside", source="--out")) == "--out: --outside"
    out = tmp_path / "cfg.yaml"
    out.write_text("seed: {root: 1}\n", encoding="utf-8")
    assert main(["split", str(data), "--out", str(out)]) == 2
    assert f"error: --out {str(out)!r} exists and is not a split manifest" in capsys.readouterr().err


def test_split_out_under_a_file_is_exit_2(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An --out whose parent is a file names that file."""
    blocker = data.parent / "plain"
    blocker.write_text("x")
    assert main(["split", str(data), "--out", str(blocker / "x.json")]) == 2
    _assert_refused(capsys, f"{blocker} is a file, not a directory")


def test_split_out_in_a_read_only_directory_is_exit_2(
    data: Path, small_disk: Callable[[int], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A read-only filesystem (a real one: root is not held back by file modes) is exit 2, naming it."""
    disk = small_disk(1 << 20)
    assert os.system(f"mount -o remount,ro {disk}") == 0
    assert main(["split", str(data), "--out", str(disk / "split.json")]) == 2
    _assert_refused(capsys, f"--out {str(disk / 'split.json')!r} cannot be written", "read-only file system")


@pytest.mark.parametrize(
    ("seed", "expected"),
    [
        ("9" * 5000, "(5000 digits) is out of range"),
        (str(2**63), "is out of range: seeds are in [0, 2**63)"),
        ("-1", "is not a non-negative integer"),
        ("٣", "is not a non-negative integer"),  # a digit, but not an ASCII one
    ],
    ids=["5000 digits", "2**63", "negative", "arabic-indic digit"],
)
def test_split_seed_takes_the_range_of_seed_root(
    data: Path, tmp_path: Path, seed: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["split", str(data), "--seed", seed, "--out", str(tmp_path / "m.json")]) == 2
    _assert_refused(capsys, expected, "--seed")
    assert main(["split", str(data), "--seed", str(2**63 - 1), "--out", str(tmp_path / "m.json")]) == 0


@pytest.mark.parametrize("source", ["jsonl NaN", "parquet float NaN", "infinity"])
def test_a_stratify_column_with_nan_is_exit_2(
    tmp_path: Path, source: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """NaN is not a class (it is not even equal to itself): exit 2 naming the column and a row."""
    if source == "parquet float NaN":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "d.parquet"
        pq.write_table(pa.table({"c": [1.0, float("nan"), 2.0, 1.0], "t": list("abcd")}), path)
    else:
        path = tmp_path / "d.jsonl"
        bad = "NaN" if source == "jsonl NaN" else "Infinity"
        path.write_text(f'{{"c": 1.0, "t": "a"}}\n{{"c": {bad}, "t": "b"}}\n{{"c": 2.0, "t": "c"}}\n')
    assert main(["split", str(path), "--stratify-by", "c", "--out", str(tmp_path / "m.json")]) == 2
    _assert_refused(capsys, "the stratify column 'c' holds", "first row 1")
    assert not (tmp_path / "m.json").exists()


def test_split_on_a_full_disk_is_exit_2_and_leaves_nothing(
    data: Path, small_disk: Callable[[int], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """ENOSPC: exit 2 naming the path and the space needed; no temporary file is left."""
    disk = small_disk(64 << 10)
    fill_leaving(disk, 0)
    assert main(["split", str(data), "--out", str(disk / "split.json")]) == 2
    _assert_refused(
        capsys, f"no space left on the device of {disk / 'split.json'}", "free now; the write takes about"
    )
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]


# --- item 3: a manifest and its sidecar are replaced together or not at all -------------------


def _table(seed: int, n: int = 120):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    return table_from_columns({"x": rng.integers(0, 10**9, n).tolist()})


def test_a_failed_overwrite_keeps_the_old_manifest_and_its_sidecar(
    small_disk: Callable[[int], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Overwriting a sidecar manifest on a nearly full disk: the new sidecar fits, the manifest does
    not (ENOSPC). The old manifest still loads, with its own sidecar; the new sidecar is gone."""
    monkeypatch.setattr(manifest_module, "INLINE_ROW_HASH_LIMIT", 50)  # a sidecar from 51 rows
    disk = small_disk(1 << 20)
    path = disk / "split.json"
    old = split_table(_table(1), seed=1)
    write_manifest(old, path)
    before = {p.name: p.read_bytes() for p in disk.iterdir()}
    assert len(before) == 2  # the manifest and its sidecar
    new = split_table(_table(2), seed=1)  # other data: another sidecar
    fill_leaving(disk, len(new.row_hashes.to_bytes()) + 1)  # room for the new sidecar only
    with pytest.raises(InputError, match="no space left"):
        write_manifest(new, path)
    (disk / "filler").unlink()
    assert {p.name: p.read_bytes() for p in disk.iterdir()} == before
    assert load_manifest(path).indices == old.indices
    write_manifest(new, path)  # with room: the new pair replaces the old pair
    assert len(list(disk.iterdir())) == 2
    assert load_manifest(path).indices == new.indices


def test_rewriting_a_manifest_keeps_one_sidecar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each write leaves the manifest and exactly the sidecar it names."""
    monkeypatch.setattr(manifest_module, "INLINE_ROW_HASH_LIMIT", 50)
    path = tmp_path / "split.json"
    for seed in (1, 2, 2, 3):
        write_manifest(split_table(_table(seed), seed=0), path)
        named = json.loads(path.read_text())["row_hashes"]["file"]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["split.json", named])
    write_manifest(split_table(_table(1, n=10), seed=0), path)  # inline hashes: no sidecar at all
    assert [p.name for p in tmp_path.iterdir()] == ["split.json"]


def test_project_data_is_never_written_by_split(
    project: TinyProject, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tiny project's data, given as --out through a path with `..`: refused, unchanged."""
    data = project.root / "data.jsonl"
    before = data.read_bytes()
    out = project.root / "tiny-model" / ".." / "data.jsonl"
    assert main(["split", str(data), "--out", str(out)]) == 2
    assert data.read_bytes() == before
    _assert_refused(capsys, "the same file")


# --- every writer: an output path refused before any work, by name, exit 2 -------------------------


def test_an_output_under_a_file_or_onto_a_directory_is_refused_by_every_writer(
    project: TinyProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pack -o DIR`, `pack -o FILE/x`, `verify --out FILE/x`: exit 2 naming the path, no traceback
    (they raised IsADirectoryError, FileExistsError, NotADirectoryError), nothing written; a refusal
    around an --out that is a file (`verify --spot --out FILE`) leaves it (it listed it as a
    directory, NotADirectoryError)."""
    run = write_run_dir(tmp_path / "run", RunSpec())
    blocker = tmp_path / "plain.txt"
    blocker.write_text("x")
    assert main(["pack", str(run), "-o", str(tmp_path)]) == 2
    _assert_refused(capsys, f"-o {str(tmp_path)!r} is a directory; -o names the file to write")
    assert main(["pack", str(run), "-o", str(blocker / "b.tar.gz")]) == 2
    _assert_refused(capsys, f"-o {str(blocker / 'b.tar.gz')!r} cannot be written: {blocker} is a file")
    assert main(["verify", str(project.config()), "--out", str(blocker / "v")]) == 2
    _assert_refused(capsys, f"--out {str(blocker / 'v')!r} cannot be written: {blocker} is a file")
    with pytest.raises(InputError, match="refused"), outputs.removed_if_refused(blocker):
        raise InputError("refused")  # as verify --spot --out FILE refuses: the file is not iterated
    assert blocker.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt", "run"]


def test_outputs_inside_another_run_directory_are_refused(
    project: TinyProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new run, a study or a verification inside an existing run or study directory would mix
    their files with its own: refused, exit 2, the directory left as it was."""
    run = write_run_dir(tmp_path / "run", RunSpec())
    before = sorted(p.name for p in run.iterdir())
    config = str(project.config())
    for argv, option, inside in (
        (["run", config, "--no-progress", "--no-tracking", "--run-dir"], "--run-dir", run / "sub"),
        (["seeds", config, "--n", "2", "--out"], "--out", run / "study"),
        (["verify", config, "--out"], "--out", run / "verify"),
    ):
        assert main([*argv, str(inside)]) == 2
        _assert_refused(capsys, f"{option} {str(inside)!r} is inside the run directory {run}, whose files")
        assert sorted(p.name for p in run.iterdir()) == before, argv
    # A seed study's directory likewise: a study, run or verification inside it was accepted.
    study = tmp_path / "study"
    study.mkdir()
    (study / "study.json").write_text("{}")
    for argv, option, inside in (
        (["seeds", config, "--n", "2", "--out"], "--out", study / "nested"),
        (["run", config, "--no-progress", "--no-tracking", "--run-dir"], "--run-dir", study / "x"),
        (["verify", config, "--out"], "--out", study / "verify"),
    ):
        assert main([*argv, str(inside)]) == 2
        _assert_refused(
            capsys, f"{option} {str(inside)!r} is inside the study directory {study}, whose files"
        )
        assert sorted(p.name for p in study.iterdir()) == ["study.json"], argv


def test_rerun_refuses_a_bad_tolerance_and_the_other_forms_option_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rerun RUN --tolerance -1` trained the whole rerun before refusing the tolerance, and left the
    new run behind; `rerun RUN --out X` ignored --out. Both: exit 2 before anything is made."""
    run = write_run_dir(tmp_path / "run", RunSpec())
    for bad in ("-1", "nan", "inf"):
        assert main(["rerun", str(run), "--tolerance", bad, "--no-progress"]) == 2
        _assert_refused(capsys, "is not a finite number >= 0")
    assert main(["rerun", str(run), "--out", str(tmp_path / "x")]) == 2
    _assert_refused(capsys, "--out", "is for rerunning a bundle", f"use --run-dir {tmp_path / 'x'} instead")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_path_the_filesystem_refuses_late_is_exit_2_not_an_internal_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write refused by the filesystem after the checks (a permission the checks could not
    foresee) is bad input: exit 2 naming the path; another OSError stays an internal error."""
    import reprotune._proof.bundle as bundle

    run = write_run_dir(tmp_path / "run", RunSpec())

    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", "/mnt/share/b.tar.gz")

    monkeypatch.setattr(bundle, "pack", refused)
    assert main(["pack", str(run), "-o", str(tmp_path / "b.tar.gz")]) == 2
    _assert_refused(
        capsys, "error: /mnt/share/b.tar.gz: Permission denied", "fix: check the path's permissions"
    )

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(5, "Input/output error", "/dev/sdz")

    monkeypatch.setattr(bundle, "pack", broken)
    assert main(["pack", str(run), "-o", str(tmp_path / "b.tar.gz")]) == 1
    assert "internal error" in capsys.readouterr().err


def test_an_existing_output_directory_is_judged_by_itself_not_by_its_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--out /data/alice` that exists, writable, in a /data this user cannot write: accepted (the
    command writes into it); a new `--out /data/bob` is refused, naming /data. os.access stands in
    for the permissions (root passes every mode check)."""
    parent, mine = tmp_path / "data", tmp_path / "data" / "alice"
    mine.mkdir(parents=True)
    monkeypatch.setattr(outputs.os, "access", lambda path, mode: Path(path) != parent)
    outputs.refuse_unwritable_parent(mine, source="--out")
    with pytest.raises(InputError, match=f"the directory {parent} is not writable here"):
        outputs.refuse_unwritable_parent(parent / "bob", source="--out")
