"""Issue 16, items 4, 5 (token-like values), 9 and 11: hostile or odd inputs get a clear exit 2.

YAML alias bombs and JSONL nested 100,000 deep are refused at once; values that look like
credentials are refused unless marked ``!not-secret``; a directory, FIFO or device where a file
belongs is named for what it is; a CSV whose last quote never closes names the line it opened on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reprotune._cli import main
from reprotune._config.loading import dump_config_yaml, load_config
from reprotune._data.loaders import load_table
from reprotune._data.manifest import load_manifest
from reprotune._errors import ConfigError, InputError
from tinyrun import TinyProject


def _bomb(levels: int) -> str:
    """An alias bomb: each level a list of nine aliases of the level below (9**levels values)."""
    lines = ['a0: &a0 ["lol"]']
    for level in range(1, levels + 1):
        aliases = ", ".join([f"*a{level - 1}"] * 9)
        lines.append(f"a{level}: &a{level} [{aliases}]")
    return "\n".join(lines) + "\n"


def _assert_clean_exit_2(done: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    for text in expected:
        assert text in done.stderr, done.stderr


# --- item 4: denial of service ---------------------------------------------------------------------


@pytest.mark.parametrize("levels", [6, 9])
def test_a_yaml_alias_bomb_is_refused_by_doctor(project: TinyProject, levels: int) -> None:
    """`doctor` on an 8-line, 6- or 9-level alias bomb exits 2 at once (it took 33 s, or >120 s and
    7.4 GB, walking every alias expanded). A fresh process with a time limit, so a regression fails
    rather than eats the machine."""
    bomb = project.root / f"bomb{levels}.yaml"
    bomb.write_text(_bomb(levels))
    done = subprocess.run(
        [sys.executable, "-m", "reprotune", "doctor", str(bomb), "--no-probe"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
    )
    _assert_clean_exit_2(done, "expands to more than 10,000 values through its aliases", "line ")


def test_an_alias_that_contains_itself_is_refused(tmp_path: Path) -> None:
    """A recursive alias (an endless document) is refused, not walked forever."""
    path = tmp_path / "loop.yaml"
    path.write_text("train: &t\n  nested: *t\n")
    with pytest.raises(ConfigError, match="refers to itself through an alias"):
        load_config(path)


def test_a_few_aliases_still_work(tmp_path: Path) -> None:
    """Ordinary anchors and aliases stay allowed (here only the unknown key is a problem)."""
    path = tmp_path / "ok.yaml"
    path.write_text("lora:\n  target_modules: &mods [q_proj, v_proj]\nx_unused: *mods\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    (problem,) = caught.value.problems
    assert problem.startswith("x_unused: unknown key (got ['q_proj', 'v_proj']) [line 3, column 1]")


def test_an_alias_bomb_in_a_set_value_is_refused(project: TinyProject) -> None:
    """A --set value is YAML too: 10 x 10 x 10 x 10 x 2 values through aliases is refused."""
    ten = ", ".join(["x"] * 10)
    value = f"[&a [{ten}], &b [{', '.join(['*a'] * 10)}], &c [{', '.join(['*b'] * 10)}], "
    value += f"&d [{', '.join(['*c'] * 10)}], *d, *d]"
    with pytest.raises(ConfigError, match="expands to more than 10,000 values"):
        load_config(project.config(), [f"lora.target_modules={value}"])


def test_a_long_value_is_cut_before_it_is_formatted(tmp_path: Path) -> None:
    """A wrong-typed value of a million items is shown cut, not formatted whole."""
    path = tmp_path / "big.yaml"
    path.write_text("train:\n  batch_size: [" + ", ".join(["1"] * 5000) + "]\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    (problem,) = caught.value.problems
    assert problem.startswith(
        "train.batch_size: input should be a valid integer (got [1, 1, 1, 1, 1, 1, ...])"
    )
    assert len(problem) < 300


def test_jsonl_nested_100000_deep_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A JSONL line nested 100,000 deep (a RecursionError before) is refused naming the line."""
    path = tmp_path / "deep.jsonl"
    path.write_text('{"a": 1}\n{"b": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    assert main(["split", str(path), "--out", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err
    assert "deep.jsonl:2: line 2 nests values more than 100 levels deep" in err
    assert "Traceback" not in err


def test_jsonl_nested_just_below_the_limit_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "ok.jsonl"
    path.write_text('{"b": ' + "[" * 99 + "]" * 99 + "}\n")
    assert load_table(str(path)).n_rows == 1


# --- item 5: values that look like credentials --------------------------------------------------

TOKENS = {
    "hf": "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7xY9zA1cD3f",
    "github": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "openai": "sk-" + "proj-Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8",
    "aws": "AKIA" + "IOSFODNN7EXAMPLE",
}


@pytest.mark.parametrize("kind", sorted(TOKENS))
def test_a_token_in_a_config_value_is_refused_without_showing_it(
    project: TinyProject, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`data.system_prompt: <token>` exits 2 naming the key, line and the fix, never the token."""
    config = project.config(f"tok-{kind}.yaml", data={"path": "data.jsonl", "system_prompt": TOKENS[kind]})
    assert main(["doctor", str(config), "--no-probe"]) == 2
    err = capsys.readouterr().err
    assert "data.system_prompt: holds what looks like" in err and "[line " in err
    assert "set them in the environment" in err and "!not-secret" in err
    assert TOKENS[kind] not in err


def test_a_secret_named_unknown_key_is_refused_before_its_value_is_shown(
    project: TinyProject, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tracking.api_key: <random>`: refused as a secret, not echoed as an unknown key's value."""
    secret = "Zq8vN2xW5rT1yU7iO3pA9sD4fG6hJ0kL"
    config = project.config("key.yaml", tracking={"mlflow": False, "api_key": secret})
    assert main(["doctor", str(config), "--no-probe"]) == 2
    err = capsys.readouterr().err
    assert "tracking.api_key: is named like a secret ('api_key')" in err
    assert secret not in err


def test_a_value_marked_not_secret_is_accepted_and_written_back_marked(
    project: TinyProject, tmp_path: Path
) -> None:
    """`!not-secret` lets a token-like value through; config.yaml keeps the mark, so it loads again."""
    path = project.config("marked.yaml", data={"path": "data.jsonl", "system_prompt": "PLACEHOLDER"})
    path.write_text(path.read_text().replace("PLACEHOLDER", f"!not-secret {TOKENS['openai']}"))
    cfg = load_config(path)
    assert cfg.data.system_prompt == TOKENS["openai"]
    copy = tmp_path / "config.yaml"
    dump_config_yaml(cfg, copy)
    assert copy.read_text().count(f"system_prompt: !not-secret '{TOKENS['openai']}'") == 1
    assert load_config(copy).data.system_prompt == TOKENS["openai"]


def test_a_token_in_a_set_value_is_refused(project: TinyProject) -> None:
    with pytest.raises(ConfigError, match=r"data.system_prompt: holds what looks like a Hugging Face token"):
        load_config(project.config(), [f"data.system_prompt={TOKENS['hf']}"])
    cfg = load_config(project.config(), [f"data.system_prompt=!not-secret {TOKENS['hf']}"])
    assert cfg.data.system_prompt == TOKENS["hf"]


# --- item 9: a path that is not a file ------------------------------------------------------------


def test_a_directory_as_data_path_is_named_a_directory(project: TinyProject, tmp_path: Path) -> None:
    """Not "not found; did you mean <the same path>": what it is and what is expected."""
    folder = project.root / "datadir"
    folder.mkdir(exist_ok=True)
    (folder / "rows.jsonl").write_text('{"prompt": "p", "response": "r"}\n')
    config = project.config("dirdata.yaml", data={"path": "datadir"})
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    (problem,) = caught.value.problems
    assert problem.startswith("data.path: is a directory, not a JSONL, CSV or Parquet file")
    assert f"e.g. {str(folder / 'rows.jsonl')!r}" in problem
    assert "did you mean" not in problem


def test_data_of_no_known_extension_names_the_way_its_command_takes_a_format(
    project: TinyProject, capsys: pytest.CaptureFixture[str]
) -> None:
    """data.txt: `run` says to set data.format in the config (it has no --format), `split` to pass
    --format; each exits 2 before anything is written."""
    shutil.copyfile(project.root / "data.jsonl", project.root / "rows.txt")
    config = project.config("txtdata.yaml", data={"path": "rows.txt"})
    run_dir = project.root / "runs" / "txt"
    assert main(["run", str(config), "--run-dir", str(run_dir), "--no-progress", "--no-tracking"]) == 2
    err = capsys.readouterr().err
    assert "cannot tell the format of 'rows.txt' from its extension '.txt'" in err
    assert err.rstrip().endswith("or set data.format (jsonl, csv or parquet) in the config"), err
    assert not run_dir.exists()
    assert main(["split", str(project.root / "rows.txt"), "--out", str(project.root / "s.json")]) == 2
    assert capsys.readouterr().err.rstrip().endswith("or pass --format jsonl|csv|parquet")
    assert not (project.root / "s.json").exists()


def test_a_directory_as_the_config_is_named_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "exp.yaml").write_text("seed: {root: 1}\n")
    assert main(["doctor", str(tmp_path / "conf"), "--no-probe"]) == 2
    err = capsys.readouterr().err
    assert "is a directory, not a config file" in err and "exp.yaml" in err and "did you mean" not in err


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_device_as_data_is_named_not_read(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A FIFO (reading it would block) or /dev/zero (it never ends) is named for what it is."""
    if kind == "fifo":
        path = tmp_path / "pipe.jsonl"
        os.mkfifo(path)
        expected = "is a named pipe (FIFO), not a data file"
    else:
        path, expected = Path("/dev/zero"), "is a character device, not a data file"
    assert main(["split", str(path), "--format", "jsonl", "--out", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err
    assert expected in err and "does not exist" not in err


def test_a_fifo_as_the_config_is_not_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cfg.yaml"
    os.mkfifo(path)
    assert main(["doctor", str(path), "--no-probe"]) == 2
    assert "is a named pipe (FIFO), not a config file" in capsys.readouterr().err


# --- item 11: a CSV quote that never closes ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ('prompt,response\n"a",b\nc,"d\ne,f\n', 3),
        ('prompt,response\na,b\nc,"d', 3),
        ('prompt,response\n"multi\nline",b\nc,"d\n', 4),
    ],
    ids=["mid-file", "last line", "after a closed multi-line field"],
)
def test_a_csv_quote_never_closed_names_its_line(tmp_path: Path, text: str, line: int) -> None:
    """Accepted silently as fewer rows before; now refused with the line the quote opened on."""
    path = tmp_path / "d.csv"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        load_table(str(path))
    assert caught.value.source == f"{path}:{line}"
    assert f"the quote opened on line {line} is never closed" in caught.value.message


def test_csv_quoting_that_closes_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text('prompt,response\n"a ""quoted"" word","multi\nline"\nplain,a"b\n')
    table = load_table(str(path))
    assert table.column("prompt") == ['a "quoted" word', "plain"]
    assert table.column("response") == ["multi\nline", 'a"b']


# --- no code runs from a config or a manifest (docs/security.md, promise 1) -----------------------


def test_a_python_tag_in_a_config_runs_nothing(tmp_path: Path) -> None:
    """`!!python/object/apply` is not YAML reprotune reads: refused, and the call never happens."""
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.yaml"
    path.write_text(f"seed:\n  root: !!python/object/apply:os.mkdir [{str(marker)!r}]\n")
    with pytest.raises(ConfigError, match="could not determine a constructor"):
        load_config(path)
    assert not marker.exists()


def test_a_manifest_naming_a_sidecar_outside_its_folder_is_refused(tmp_path: Path) -> None:
    """A sidecar name with a directory in it (path traversal) is refused without reading it."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"t": {i}}}\n' for i in range(20)))
    assert main(["split", str(data), "--out", str(tmp_path / "m.json")]) == 0
    manifest = json.loads((tmp_path / "m.json").read_text())
    manifest["row_hashes"] = {"algorithm": "sha256", "file": "../../etc/passwd", "file_sha256": "0" * 64}
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="names neither 'inline' hashes nor a sidecar file"):
        load_manifest(tmp_path / "m.json")
