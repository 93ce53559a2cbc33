"""Tests for reprotune._config.yaml_io: what the YAML reader refuses, how it reads numbers and
merges, and where it says a value is written (review of config loading)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reprotune._cli import main
from reprotune._config.loading import config_from_dict, dump_config_yaml, load_config
from reprotune._config.locate import key_location
from reprotune._config.yaml_io import parse_yaml_value
from reprotune._errors import ConfigError


def _write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """stderr of a CLI call that must exit 2 without a traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return err


# --- characters YAML does not allow -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\x00\x00", "the character U+0000 ('\\x00') is not allowed in YAML [line 1, column 1]; 2 such"),
        (
            'train:\n  max_steps: 5\ndata: {system_prompt: "a\x1bb"}\n',
            "U+001B ('\\x1b') is not allowed in YAML [line 3, column 25]",
        ),
    ],
    ids=["nul-file", "esc-in-a-quoted-value"],
)
def test_a_control_character_in_the_file_is_named_with_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    """A NUL or ESC (a PyYAML ReaderError and "internal error", exit 1, before) is exit 2 naming
    the character, its line and column, and the fix."""
    path = _write(tmp_path, text)
    err = _refusal(["doctor", str(path), "--no-probe"], capsys)
    assert expected in err
    assert "fix: delete it; a value that needs a control character writes it as an escape" in err


def test_a_control_character_in_a_set_value_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    """`--set data.system_prompt=a<U+0001>b` is exit 2 naming the --set, the character and its column."""
    err = _refusal(["doctor", "--no-probe", "--set", "data.system_prompt=a\x01b"], capsys)
    assert "--set data.system_prompt: value 'a\\x01b' holds the character U+0001 ('\\x01') at column 2" in err


# --- values Python cannot build ------------------------------------------------------------------


def test_a_date_that_does_not_exist_is_text(tmp_path: Path) -> None:
    """YAML 1.2 has no timestamps: `2024-02-30` (a ValueError crash under 1.1's date reading) and
    `2024-02-01` (a date, refused as not a string) are the experiment names written."""
    cfg = load_config(_write(tmp_path, "tracking: {experiment: 2024-02-30}\n"))
    assert cfg.tracking.experiment == "2024-02-30"
    cfg = load_config(_write(tmp_path, "{}\n"), ["tracking.experiment=2024-02-01"])
    assert cfg.tracking.experiment == "2024-02-01"


def test_a_number_too_long_to_read_is_refused_with_its_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 5,000-digit max_steps (ValueError "exceeds the limit", exit 1, before), in the file or a
    --set, is exit 2 naming the key, line and column, and the fix."""
    digits = "7" * 5000
    path = _write(tmp_path, f"train:\n  max_steps: {digits}\n")
    err = _refusal(["doctor", str(path), "--no-probe"], capsys)
    assert "train.max_steps: the number 777777777777... has 5,000 digits, more than Python reads" in err
    assert "[line 2, column 14]; fix: write a smaller number" in err
    err = _refusal(["doctor", "--no-probe", "--set", f"train.max_steps={digits}"], capsys)
    assert "--set train.max_steps: the number 777777777777... has 5,000 digits" in err


# --- YAML 1.2 numbers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "0123",
            "0123 has a leading zero: YAML 1.1 reads it as octal 83, YAML 1.2 as 123; refused "
            'as ambiguous [line 1, column 14]; fix: write 123, 0o123 for octal, or quote it ("0123") for '
            "text",
        ),
        ("010", "010 has a leading zero: YAML 1.1 reads it as octal 8, YAML 1.2 as 10"),
        (
            "08",
            "08 has a leading zero: YAML 1.1 reads it as text, YAML 1.2 as 8; refused as ambiguous "
            '[line 1, column 14]; fix: write 8, or quote it ("08") for text',
        ),
    ],
    ids=["octal-looking", "octal-8", "not-octal"],
)
def test_a_number_with_a_leading_zero_is_refused(tmp_path: Path, text: str, expected: str) -> None:
    """`seed.root: 0123` was recorded as 83 (YAML 1.1 octal): now refused, in the file and in a --set."""
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, f"seed: {{root: {text}}}\n"))
    (problem,) = caught.value.problems
    assert problem.startswith(f"seed.root: {expected}")
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, "{}\n"), [f"seed.root={text}"])
    (problem,) = caught.value.problems
    assert problem.startswith(f"--set seed.root: {text} has a leading zero") and "line 1" not in problem


@pytest.mark.parametrize(("text", "value"), [("00", 0), ("07", 7), ("0_1", 1), ("-05", -5)])
def test_a_leading_zero_both_yamls_read_alike_is_the_number(tmp_path: Path, text: str, value: int) -> None:
    """One octal digit after the zeros is the same number in YAML 1.1 and 1.2: no ambiguity to
    refuse (`07 has a leading zero: YAML 1.1 reads it as octal 7, YAML 1.2 as 7`, before)."""
    assert parse_yaml_value(text) == value
    if value >= 0:
        assert load_config(_write(tmp_path, f"seed: {{root: {text}}}\n")).seed.root == value


def test_sexagesimal_is_text_and_fails_as_a_number(tmp_path: Path) -> None:
    """`max_steps: 1:30` was 90 (YAML 1.1 base 60): it is the text '1:30', refused as a number."""
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, "train:\n  max_steps: 1:30\n"))
    assert caught.value.problems == [
        "train.max_steps: input should be a valid integer (got '1:30') [line 2, column 14]; "
        "fix: write a whole number, e.g. 8"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0o17", 15),
        ("0x1F", 31),
        ("1_000", 1000),
        ("+5", 5),
        ("0", 0),
        ("-0", 0),
        ("'0123'", "0123"),
        ("1:30", "1:30"),
        ("0b11", "0b11"),
        ("=", "="),
        ("1.5", 1.5),
        ("1.", 1.0),
        (".5", 0.5),
        ("2e-4", 2e-4),
        ("1E+3", 1000.0),
        ("1_000.5", 1000.5),
        ("-.inf", float("-inf")),
        ("1e", "1e"),
        ("1.5.2", "1.5.2"),
    ],
)
def test_yaml_12_core_numbers(text: str, expected: object) -> None:
    """Ints and floats as YAML 1.2's core schema reads them (``_`` may group digits); what it does
    not read as a number stays text (``=`` was a tag no constructor builds)."""
    value = parse_yaml_value(text)
    assert value == expected and type(value) is type(expected)


def test_text_that_looks_like_a_number_round_trips(tmp_path: Path) -> None:
    """The record's config.yaml quotes exactly what would read back as another type."""
    texts = ["0123", "1:30", "0o17", "2024-02-30", "1_000", "1.", "08", "yes"]
    for text in texts:
        cfg = config_from_dict({"tracking": {"experiment": text}})
        path = dump_config_yaml(cfg, tmp_path / "config.yaml")
        assert load_config(path).tracking.experiment == text


# --- --set values that are comments ------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            "#1 rule: answer in one word",
            "value '#1 rule: answer in one word' is all YAML comment (# starts one), so it would be null",
        ),
        ("answer # in one word", "value 'answer # in one word' ends in a YAML comment, which YAML drops"),
    ],
    ids=["all-comment", "trailing-comment"],
)
def test_a_set_value_with_a_comment_is_refused(tmp_path: Path, value: str, expected: str) -> None:
    """`--set 'data.system_prompt=#1 rule ...'` was recorded as null: refused, with the quoting fix."""
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, "{}\n"), [f"data.system_prompt={value}"])
    assert caught.value.problems == [
        f"--set data.system_prompt: {expected}; fix: to pass it as text, put YAML quotes inside the "
        f"shell's: --set 'data.system_prompt=\"{value}\"'"
    ]
    cfg = load_config(_write(tmp_path, "{}\n"), [f'data.system_prompt="{value}"'])
    assert cfg.data.system_prompt == value


# --- flow mappings -------------------------------------------------------------------------------


def test_a_flow_mapping_key_without_space_after_the_colon_is_refused(tmp_path: Path) -> None:
    """`{lora_init:7}` is the key 'lora_init:7' with no value (it gave "got None" and no hint)."""
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, "{}\n"), ["seed.overrides={lora_init:7}"])
    assert caught.value.problems == [
        "--set seed.overrides: 'lora_init:7' is read as a key with no value; fix: put a space after the "
        "colon, as YAML flow mappings need: {lora_init: 7}"
    ]
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, "seed:\n  overrides: {lora_init:7}\n"))
    assert caught.value.problems[0].startswith(
        "seed.overrides: 'lora_init:7' is read as a key with no value [line 2, column 15]"
    )
    assert load_config(_write(tmp_path, "{}\n"), ["seed.overrides={lora_init: 7}"]).seed.overrides == {
        "lora_init": 7
    }


# --- merge keys ----------------------------------------------------------------------------------

MERGED = """\
seed: {root: 1}
eval: &common
  batch_size: 0
lora: {r: 8, <<: {alpha: 16, r: 4}}
train:
  <<: *common
  max_steps: 4
"""


def test_a_merged_key_is_located_where_its_value_is_written(tmp_path: Path) -> None:
    """A key brought in by `<<` is located at its value and names the merge (it had no line and was
    said to be "not set there: its default applies"); a key the mapping sets itself wins."""
    path = _write(tmp_path, MERGED)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert sorted(caught.value.problems) == [
        "eval.batch_size: input should be greater than or equal to 1 (got 0) [line 3, column 15]; "
        "fix: use a value >= 1",
        "train.batch_size: input should be greater than or equal to 1 (got 0) [line 3, column 15, "
        "merged in by << at line 6, column 3]; fix: use a value >= 1",
    ]
    assert key_location(path, "train.batch_size") == (
        f"{path}, line 3, column 15, merged in by << at line 6, column 3 (key train.batch_size)"
    )
    assert key_location(path, "lora.r") == f"{path}, line 4, column 11 (key lora.r)"
    assert key_location(path, "lora.alpha").startswith(f"{path}, line 4, column 26, merged in by <<")
    cfg = load_config(_write(tmp_path, MERGED.replace("batch_size: 0", "batch_size: 2")))
    assert (cfg.train.batch_size, cfg.train.max_steps, cfg.lora.r, cfg.lora.alpha) == (2, 4, 8, 16)


def test_a_run_names_the_merge_that_set_a_bad_value(
    tiny_project: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A batch bigger than the data, set through `<<`, is located at the merged value (the run said
    "not set there: its default applies")."""
    config = _write(
        tmp_path,
        f"data: {{path: {tiny_project.root / 'data.jsonl'}}}\n"
        f"model: {{name: {tiny_project.root / 'tiny-model'}}}\n"
        "eval: &common\n  batch_size: 1000\ntrain:\n  <<: *common\n  max_steps: 4\n"
        "tracking: {mlflow: false}\n",
        name="cfg.yaml",
    )
    err = _refusal(["run", str(config), "--run-dir", str(tmp_path / "run"), "--no-progress"], capsys)
    assert f"{config}, line 4, column 15, merged in by << at line 6, column 3 (key train.batch_size): " in err
    assert "not set there" not in err
