"""The study directory: what ``reprotune seeds`` refuses before it trains anything (exit 2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from synthetic import write_study_dir

from reprotune._cli import main
from reprotune._config.loading import config_from_dict, dump_config_yaml, load_config
from reprotune._config.schema import config_sha256
from reprotune._errors import InputError
from reprotune._studies.directory import new_study, open_study
from reprotune._studies.layout import StudyLayout
from reprotune._studies.plan import plan_study
from reprotune._studies.study import StudyOptions, run_study
from reprotune._studies.studyfile import load_study, write_study
from tinyrun import TinyProject
from warm import fork_legs_here

CFG = config_from_dict({"seed": {"root": 1}})  # the config synthetic studies are made of


@pytest.mark.parametrize(
    ("cfg", "n", "vary", "needle"),
    [
        (config_from_dict({"seed": {"root": 2}}), 3, "all", "holds a study of another config"),
        (CFG, 3, "data_order", "holds a study of another --vary"),
        (CFG, 2, "all", "holds a study of --n 3; --n 2 would drop runs"),
    ],
    ids=["config", "vary", "smaller-n"],
)
def test_another_study_in_the_directory(cfg: object, n: int, vary: str, needle: str, tmp_path: Path) -> None:
    """A directory that holds another study is refused, naming what differs and the fix."""
    out = write_study_dir(tmp_path / "s", [1.0, 1.1, 0.9])
    before = (out / "study.json").read_bytes()
    with pytest.raises(InputError, match=needle):
        run_study(cfg, n=n, vary=vary, options=StudyOptions(out=out, tracking=False))  # type: ignore[arg-type]
    assert (out / "study.json").read_bytes() == before


def test_a_directory_that_is_not_a_study(tmp_path: Path) -> None:
    """A non-empty directory without study.json is refused and left as it was."""
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(InputError, match="is not a study directory"):
        run_study(CFG, n=2, vary="all", options=StudyOptions(out=tmp_path / "s", tracking=False))
    assert [p.name for p in (tmp_path / "s").iterdir()] == ["notes.txt"]
    # A file given as --out: the message names --out (it said --run-dir).
    (tmp_path / "f").write_text("mine", encoding="utf-8")
    with pytest.raises(InputError, match=r"^--out '.*f' is a file, not a directory") as refused:
        run_study(CFG, n=2, vary="all", options=StudyOptions(out=tmp_path / "f", tracking=False))
    assert refused.value.source == "--out"  # said once: not "--out: --out", nor the path twice


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--n", "1"], "at least 2 runs"), (["--n", "3", "--jobs", "0"], "--jobs must be 1 or more")],
    ids=["n1", "jobs0"],
)
def test_cli_bad_options_exit_2(
    args: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad --n or --jobs: exit 2 with the fix, and no study directory made."""
    config = tmp_path / "cfg.yaml"
    config.write_text("seed:\n  root: 1\n", encoding="utf-8")
    assert main(["seeds", str(config), *args, "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert needle in err and "fix:" in err
    assert not (tmp_path / "s").exists()


def test_a_study_refused_as_busy_leaves_the_other_s_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another `seeds` made the directory between this one's look and its lock: refused as busy,
    and the other's directory stays (before, a refusal before any run began removed it, the
    other's lock and study.json with it)."""
    from reprotune._run.lock import holding_run_dir
    from reprotune._studies import directory as _directory

    out = tmp_path / "s"
    monkeypatch.setattr(_directory, "first_missing", lambda path: out)  # as if this call were to make it
    with holding_run_dir(out, report=lambda _: None, what="study directory", option="--out"):
        (out / "study.json").write_text("{}")
        with pytest.raises(InputError, match="study directory"):
            run_study(CFG, n=2, vary="all", options=StudyOptions(out=out, tracking=False))
        assert (out / "study.json").is_file()


def test_a_studys_mlflow_state_never_holds_the_stores_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tracking URI with a password (a PostgreSQL store; none runs here, so the client is a stand-in):
    studies/<id>/mlflow.json held it in plain text; it holds the masked URI, and a second start
    of the study still reopens its parent run from it."""
    import json

    from reprotune._studies import tracking

    opened: list[str] = []

    class Client:
        def get_run(self, run_id: str) -> None:
            opened.append(run_id)

    monkeypatch.setattr(tracking, "open_client", lambda uri: Client())
    monkeypatch.setattr(tracking, "open_run", lambda *args: "parent-1")
    uri, state = "postgresql://alice:S3cretPassw0rd@db.example/mlflow", tmp_path / "mlflow.json"
    for _ in range(2):
        tracker = tracking.StudyTracker(uri, str(tmp_path / "art"), "exp", state, report=print)
        tracker.start("study-1", {}, {})
        assert tracker.parent_run_id == "parent-1"
    assert (
        "S3cretPassw0rd" not in state.read_text()
        and json.loads(state.read_text())["parent_run_id"] == "parent-1"
    )
    assert opened == ["parent-1"]  # the second start reopened it


def _files(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root``: a file's bytes, None for a directory."""
    return {
        p.relative_to(root).as_posix(): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


def _never_begun(root: Path, cfg_path: Path, *sets: str) -> StudyLayout:
    """Make ``root`` a study of ``cfg_path`` with ``sets`` that never began, as an older reprotune
    left one whose first run was refused: every run planned, its config.yaml, an MLflow parent
    run and a log."""
    paths = StudyLayout(root)
    other = load_config(cfg_path, list(sets))
    root.mkdir()
    write_study(paths.study, new_study(plan_study(other, n=2, vary="all", name="cfg")))
    dump_config_yaml(other, paths.config)
    paths.mlflow.write_text('{"parent_run_id": "the other config\'s parent run"}', encoding="utf-8")
    (root / "logs").mkdir()
    (root / "logs" / "all-000.log").write_bytes(b"the other config's first run, refused\n")
    return paths


@pytest.mark.parametrize(
    "jobs", [pytest.param(1, id="jobs1"), pytest.param(2, id="jobs2", marks=pytest.mark.slow)]
)
def test_a_study_taken_over_and_refused_leaves_the_directory_byte_for_byte(
    jobs: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory holding a study of another config that never began (config.yaml, study.json,
    mlflow.json, a log): `seeds` takes it over for this config and is refused at its first run
    (exit 2). Every file is as it was: before, study.json was put back but config.yaml was this
    config's (the directory's config no longer matched its study.json), mlflow.json was gone and
    --jobs 2 left its logs."""
    assert jobs == 1 or fork_legs_here(monkeypatch) or os.environ.get("REPROTUNE_TESTS_COLD")
    project = TinyProject.create(tmp_path / "project")
    cfg = project.config("cfg.yaml")
    paths = _never_begun(tmp_path / "out", cfg, "split.stratify_by=nosuchcol")
    before = _files(paths.root)
    args = ["--n", "2", "--jobs", str(jobs), "--out", str(paths.root), "--no-tracking"]
    code = main(["seeds", str(cfg), *args, "--set", "split.stratify_by=othercol"])
    assert (code, "'othercol'" in capsys.readouterr().err) == (2, True)  # its own refusal
    assert _files(paths.root) == before


def test_a_study_taken_over_drops_the_other_configs_mlflow_parent(tmp_path: Path) -> None:
    """A study of another config none of whose runs began is taken over: study.json is this
    config's, and the other's MLflow parent run (mlflow.json) is not this study's."""
    paths = StudyLayout(tmp_path / "s")
    paths.root.mkdir()
    other = plan_study(config_from_dict({"seed": {"root": 2}}), n=2, vary="all", name="s")
    write_study(paths.study, new_study(other))
    paths.mlflow.write_text('{"parent_run_id": "the other config\'s"}', encoding="utf-8")
    open_study(paths, plan_study(CFG, n=2, vary="all", name="s"))
    assert load_study(paths.study)["config_sha256"] == config_sha256(CFG)
    assert not paths.mlflow.exists()
