"""Issue 24, bounded work: a config is a config (not 110 MB, not empty), a study and a thread count
have limits, and a lone surrogate in the data is refused at load with its line and column. Each
is a clear exit 2 before any work, with nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reprotune._cli import main
from reprotune._config.loading import MAX_CONFIG_BYTES


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("text", ["", "\n\n", "# a comment only\n"], ids=["0-bytes", "blank", "comment"])
def test_an_empty_config_starts_nothing(
    text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty config would silently fine-tune the builtin model for 100 steps: refused."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.yaml").write_text(text)
    assert main(["run", "empty.yaml", "--no-progress", "--no-tracking"]) == 2
    assert "is empty" in capsys.readouterr().err
    assert _files(tmp_path) == ["empty.yaml"]


def test_a_config_over_the_size_limit_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config past 1 MiB (here 2 MiB of unknown keys, which once took minutes and gigabytes):
    refused by its size, before YAML parses it."""
    monkeypatch.chdir(tmp_path)
    lines = (f"key_{i}: {i}\n" for i in range(200_000))
    (tmp_path / "big.yaml").write_text("".join(lines))
    assert (tmp_path / "big.yaml").stat().st_size > MAX_CONFIG_BYTES
    assert main(["doctor", "big.yaml"]) == 2
    assert f"a config is at most {MAX_CONFIG_BYTES}" in capsys.readouterr().err


def test_thread_counts_past_the_limit_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """determinism.threads=100000 once segfaulted torch: now a config error naming the bound."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.yaml").write_text("train:\n  max_steps: 1\n")
    assert main(["run", "cfg.yaml", "--set", "determinism.threads=100000", "--no-progress"]) == 2
    assert "determinism.threads: input should be less than or equal to 1024" in capsys.readouterr().err
    assert _files(tmp_path) == ["cfg.yaml"]


def test_a_study_of_a_billion_runs_is_refused_before_planning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`seeds --n 1000000000` grew a plan without bound: refused, naming the limit."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.yaml").write_text("train:\n  max_steps: 1\n")
    assert main(["seeds", "cfg.yaml", "--n", "1000000000", "--no-tracking"]) == 2
    assert "at most 1000" in capsys.readouterr().err
    assert _files(tmp_path) == ["cfg.yaml"]


@pytest.mark.parametrize(
    ("line", "column"),
    [
        ('{"prompt": "p", "response": "r", "category": "\\udc80"}', "category"),
        ('{"prompt": "a\\ud800b", "response": "r", "category": "c"}', "prompt"),
    ],
)
def test_a_lone_surrogate_in_the_data_is_refused_at_load(
    line: str, column: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lone surrogate as a class or inside a prompt (a traceback in split and run before):
    refused at load with its line and column; a proper surrogate pair is an ordinary character."""
    good = '{"prompt": "\\ud83d\\ude00", "response": "r", "category": "c"}'
    data = tmp_path / "data.jsonl"
    data.write_text(f"{good}\n{line}\n")
    assert main(["split", str(data), "--out", str(tmp_path / "split.json")]) == 2
    err = capsys.readouterr().err
    assert f"line 2, column {column!r} holds a lone UTF-16 surrogate" in err
    assert _files(tmp_path) == ["data.jsonl"]


def test_a_long_csv_field_is_data_and_a_huge_one_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 200,000-character field (over Python csv's 131,072 default) loads; one over reprotune's
    16 Mi limit is refused with its line and the limit, not "check the quoting"."""
    from reprotune._data.loaders import MAX_CSV_FIELD, load_table

    long = tmp_path / "long.csv"
    long.write_text("prompt,response,category\n" + f"a,{'x' * 200_000},c\n" + "b,y,c\n")
    assert len(load_table(str(long)).column("response")[0]) == 200_000
    huge = tmp_path / "huge.csv"
    huge.write_text("prompt,response,category\n" + f"a,{'x' * (MAX_CSV_FIELD + 1)},c\n")
    assert main(["split", str(huge), "--out", str(tmp_path / "split.json")]) == 2
    err = capsys.readouterr().err
    assert f"line 2 has a field over {MAX_CSV_FIELD} characters" in err and "quoting" not in err


def test_a_config_of_many_keys_is_refused_as_what_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Just under 1 MiB of distinct unknown keys (2,000,000 took 98 s to refuse before): refused by
    the value count, and the message says so instead of blaming aliases it does not have."""
    text = "".join(f"k{i}: {i}\n" for i in range(60_000))
    assert len(text.encode()) < MAX_CONFIG_BYTES
    (tmp_path / "many.yaml").write_text(text)
    assert main(["doctor", str(tmp_path / "many.yaml")]) == 2
    err = capsys.readouterr().err
    assert "holds more than 10,000 values" in err and "alias" not in err


def test_a_refusal_of_thousands_of_unknown_keys_stays_a_screen_long(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """4,000 unknown keys (under the value bound): the first 30 named with line and fix, the rest
    counted (the message was 4,000 lines and 700 KB)."""
    (tmp_path / "many.yaml").write_text("".join(f"k{i}: {i}\n" for i in range(4_000)))
    assert main(["doctor", str(tmp_path / "many.yaml")]) == 2
    err = capsys.readouterr().err
    assert "invalid config (4,000 problems)" in err and "... and 3,970 more" in err
    assert "k29: unknown key (got 29) [line 30, column 1]" in err and "k30:" not in err
    assert len(err.splitlines()) < 40


def test_classes_that_print_alike_are_told_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stratify column holding 1 and "1" has two classes: the summary shows them as 1 and "1"
    (both were printed as 1)."""
    rows = [("a", 1), ("b", "1"), ("c", 1), ("d", "1")]
    data = tmp_path / "mixed.jsonl"
    data.write_text(
        "".join(f'{{"prompt": "{p}", "response": "r", "category": {json.dumps(c)}}}\n' for p, c in rows)
    )
    assert main(["split", str(data), "--stratify-by", "category", "--out", str(tmp_path / "s.json")]) == 0
    table = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.split()[1:2] == ["2"]]
    assert sorted(table) == ['"1"', "1"]


def test_a_second_study_on_a_directory_being_written_is_refused_in_its_own_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """While one `seeds --out st` writes st (its one-writer lock held, as here), a second is
    refused naming the study directory, the holder and --out (it once suggested --run-dir, an
    option of `run`)."""
    from reprotune._run.lock import holding_run_dir

    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.yaml").write_text("train:\n  max_steps: 1\n")
    with holding_run_dir(tmp_path / "st", report=print, what="study directory", option="--out"):
        assert main(["seeds", "cfg.yaml", "--n", "2", "--out", "st", "--no-tracking"]) == 2
    err = capsys.readouterr().err
    assert f"study directory st is being written by another process (pid {os.getpid()}" in err
    assert "choose another --out" in err and "--run-dir" not in err
    assert _files(tmp_path) == ["cfg.yaml", "st"]
