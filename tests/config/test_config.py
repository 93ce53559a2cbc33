"""Tests for reprotune._config: loading, overrides, every error at once, round trip, the reference doc."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reprotune._config.loading import config_from_dict, dump_config_yaml, load_config
from reprotune._config.reference import config_keys
from reprotune._config.schema import ExperimentConfig, config_sha256
from reprotune._errors import ConfigError, InputError

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

BAD_YAML = """\
seed:
  root: -1
  overides: {lora_init: 3}
data:
  path: builtin:chatterbot
  prompt_template: "Q: {question}"
split:
  ratios: [0.5, 0.3]
lora:
  r: "8"
  dropout: 1.0
train:
  precision: fp8
determinism:
  threads: 0
trackin: {}
"""


def _write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _problems(exc: pytest.ExceptionInfo[ConfigError]) -> dict[str, str]:
    """key path -> the problem line, for each problem of a ConfigError."""
    return {p.split(":", 1)[0]: p for p in exc.value.problems}


def test_empty_file_is_refused_and_an_empty_mapping_gives_every_default(tmp_path: Path) -> None:
    """A 0-byte (or comments-only) config is refused: it would silently start a fine-tune of the
    builtin model. ``{}`` asks for the defaults, fully written out in resolved()."""
    for empty in ("", "\n  \n", "# nothing here\n"):
        with pytest.raises(InputError, match="is empty: it would run every default"):
            load_config(_write(tmp_path, empty))
    cfg = load_config(_write(tmp_path, "{}\n"))
    assert cfg.config_dir == str(tmp_path.resolve())  # where relative paths would resolve
    assert cfg.model_copy(update={"config_dir": None}) == ExperimentConfig()
    resolved = cfg.resolved()
    assert resolved["train"]["max_steps"] == 100 and resolved["split"]["ratios"] == [0.8, 0.1, 0.1]
    assert {k.path.split(".")[0] for k in config_keys()} == set(resolved)


def test_quickstart_example_loads() -> None:
    """examples/quickstart.yaml is valid and small (stratified, seed 42, embedded model and data)."""
    cfg = load_config(REPO / "examples" / "quickstart.yaml")
    assert cfg.seed.root == 42 and cfg.split.stratify_by == "category"
    assert cfg.data.path == "builtin:chatterbot-en" and cfg.model.name == "builtin:smollm2-135m-instruct"
    assert cfg.train.max_steps == 30 and cfg.determinism.mode == "strict"


def test_every_problem_reported_at_once_with_line_and_column(tmp_path: Path) -> None:
    """A file with many mistakes gives one ConfigError listing each, with key path and position."""
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, BAD_YAML))
    problems = _problems(info)
    assert set(problems) == {
        "seed.root",
        "seed.overides",
        "data.path",
        "data.prompt_template",
        "split.ratios",
        "lora.r",
        "lora.dropout",
        "train.precision",
        "determinism.threads",
        "trackin",
    }
    assert "[line 2, column 9]" in problems["seed.root"] and "(got -1)" in problems["seed.root"]
    assert "did you mean 'overrides'?" in problems["seed.overides"]
    assert "did you mean 'tracking'?" in problems["trackin"] and "[line 16, column 1]" in problems["trackin"]
    assert "did you mean 'chatterbot-en'?" in problems["data.path"]
    assert "'question'" in problems["data.prompt_template"]
    assert "(got '8')" in problems["lora.r"] and "fix: write a whole number" in problems["lora.r"]
    assert "fix: use one of 'fp32', 'bf16' or 'fp16'" in problems["train.precision"]
    assert str(info.value).startswith(f"{tmp_path / 'config.yaml'}: invalid config (10 problems)")


def test_malformed_yaml_gives_line_and_column(tmp_path: Path) -> None:
    """Broken YAML is reported with its 1-based line and column."""
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, "train:\n  max_steps: 5\n  batch_size: [1, 2\n"))
    assert len(info.value.problems) == 1
    assert (
        info.value.problems[0].startswith("malformed YAML") and "[line 4, column 1]" in info.value.problems[0]
    )


def test_duplicate_key_is_an_error(tmp_path: Path) -> None:
    """A key written twice is reported (YAML would silently keep the last)."""
    with pytest.raises(
        ConfigError, match=r"train.max_steps: duplicate key \[line 3, column 3, first at line 2"
    ):
        load_config(_write(tmp_path, "train:\n  max_steps: 5\n  max_steps: 6\n"))


def test_yaml_12_scalars(tmp_path: Path) -> None:
    """`off` stays a string and `2e-4` is a float (YAML 1.1 would give False and a string)."""
    cfg = load_config(_write(tmp_path, "determinism:\n  mode: off\ntrain:\n  learning_rate: 2e-4\n"))
    assert cfg.determinism.mode == "off"
    assert cfg.train.learning_rate == 2e-4


def test_overrides_apply_yaml_values(tmp_path: Path) -> None:
    """--set values are parsed as YAML scalars and lists and replace file values."""
    path = _write(tmp_path, "train:\n  max_steps: 5\n")
    cfg = load_config(
        path,
        [
            "train.max_steps=7",
            "lora.target_modules=[q_proj, k_proj]",
            "seed.overrides.lora_init=9",
            "model.revision=null",
            "train.learning_rate=1e-3",
        ],
    )
    assert cfg.train.max_steps == 7 and cfg.lora.target_modules == ("q_proj", "k_proj")
    assert cfg.seed.overrides == {"lora_init": 9} and cfg.model.revision is None
    assert cfg.train.learning_rate == 1e-3


def test_bad_overrides_are_all_reported(tmp_path: Path) -> None:
    """Unknown --set paths (with did-you-mean), sections, malformed items and bad values come together."""
    path = _write(tmp_path, "{}")
    with pytest.raises(ConfigError) as info:
        load_config(path, ["train.max_step=3", "train=5", "nokey", "train.batch_size=big", "seed.root.x=1"])
    text = "\n".join(info.value.problems)
    assert len(info.value.problems) == 5
    assert "--set train.max_step: no key 'max_step' in train; fix: did you mean 'max_steps'?" in text
    assert "--set train: train is a section" in text
    assert "--set 'nokey': expected KEY.PATH=VALUE" in text
    assert "train.batch_size: input should be a valid integer (got 'big') [from --set]" in text
    assert "--set seed.root.x: seed.root is a value, not a section" in text


def test_a_set_entry_of_a_mapping_is_located_at_the_set(tmp_path: Path) -> None:
    """`--set seed.overrides.bogus=7` fails at `seed.overrides` (the mapping's check): it is said to
    come from --set (it had no location); the same entry in the file keeps its line."""
    path = _write(tmp_path, "{}")
    with pytest.raises(ConfigError) as info:
        load_config(path, ["seed.overrides.bogus=7"])
    assert info.value.problems[0].startswith(
        "seed.overrides: unknown seed consumer 'bogus' [from --set]; fix:"
    )
    path = _write(tmp_path, "seed:\n  overrides:\n    bogus: 7\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, [])
    assert "unknown seed consumer 'bogus' [line 3, column 5]" in info.value.problems[0]


def test_a_set_value_that_is_bad_yaml_or_a_token_reads_as_one_line(tmp_path: Path) -> None:
    """A --set value that is not YAML is named in one line with its column and a fix a shell keeps
    (PyYAML's multi-line text and "key='a: b'", which a shell unquotes, were shown); a token given
    with --set is not located at "[line 1, column 1]" nor named twice."""
    path = _write(tmp_path, "{}")
    token = "ghp_" + "a1B2c3D4" * 5
    with pytest.raises(ConfigError) as info:
        load_config(path, ["train.learning_rate=[1,", f"model.name={token}"])
    bad_yaml, secret = info.value.problems
    assert bad_yaml == (
        "--set train.learning_rate: value '[1,' is not valid YAML: expected the node content, but found "
        "'<stream end>' at column 4; fix: close its brackets and braces; to pass the value as text, put "
        "YAML quotes inside the shell's, e.g. --set \"key='a: [b'\""
    )
    assert secret.startswith("--set model.name: holds what looks like a GitHub token (ghp_...); fix: ")
    assert "line 1" not in secret and token not in secret


def test_unknown_seed_consumer(tmp_path: Path) -> None:
    """seed.overrides keys must be known consumers."""
    with pytest.raises(
        ConfigError, match=r"seed.overrides: unknown seed consumer 'lora'.*did you mean 'lora_init'"
    ):
        config_from_dict({"seed": {"overrides": {"lora": 1}}})


def test_every_bad_seed_override_is_named_at_once() -> None:
    """Two unknown consumers and a seed out of range: all three in one problem (only the first
    was named, so each fix met the next refusal)."""
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"seed": {"overrides": {"lora": 1, "order": 2, "dropout": -1}}})
    (problem,) = caught.value.problems
    assert problem.startswith(
        "seed.overrides: unknown seed consumer 'lora' (did you mean 'lora_init'?); unknown seed consumer "
        "'order'"
    )
    assert "seed for 'dropout' must be in [0, 2**63) (got -1); fix: use consumers " in problem


def test_stratify_and_group_together_are_refused_with_the_config() -> None:
    """A split cannot keep both classes and groups together: refused as the config is read
    (naming split.group_by), where it passed doctor and failed the run naming CLI flags."""
    with pytest.raises(
        ConfigError, match=r"split\.group_by: stratify_by \('c'\) and group_by \('g'\) are both set"
    ):
        config_from_dict({"split": {"stratify_by": "c", "group_by": "g"}})


def test_epochs_alone_clears_default_max_steps() -> None:
    """Writing only epochs trains by epochs; writing both is an error on train.epochs."""
    assert config_from_dict({"train": {"epochs": 2}}).train.max_steps is None
    with pytest.raises(ConfigError, match=r"train.epochs: max_steps \(5\) and epochs \(2\) are both set"):
        config_from_dict({"train": {"epochs": 2, "max_steps": 5}})
    with pytest.raises(ConfigError, match=r"train\.max_steps: neither max_steps nor epochs"):
        config_from_dict({"train": {"max_steps": None}})


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("train.learning_rate=0", "train.learning_rate"),
        ("split.ratios=[0.8, 0.1, 0.2]", "split.ratios"),
        ("model.max_length=4", "model.max_length"),
        ("train.warmup_steps=500", "train.warmup_steps"),
        ("tracking.mlflow=yes", "tracking.mlflow"),
        ("lora.target_modules=[q_proj, q_proj]", "lora.target_modules"),
        ("seed.root=9223372036854775808", "seed.root"),
    ],
    ids=["lr-zero", "ratios-sum", "max-length", "warmup", "bool-yes", "dup-modules", "root-2**63"],
)
def test_out_of_range_values(override: str, key: str) -> None:
    """Out-of-range or wrongly typed values are refused at their key path."""
    with pytest.raises(ConfigError) as info:
        config_from_dict({}, overrides=[override])
    assert [p.split(":", 1)[0] for p in info.value.problems] == [key]


def test_relative_paths_resolve_against_config_dir(tmp_path: Path) -> None:
    """data.path and split.manifest resolve against the config file's directory."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "data.jsonl").write_text('{"prompt": "a", "response": "b"}\n')
    (tmp_path / "split.json").write_text("{}")
    path = _write(tmp_path / "sub", "data:\n  path: ../data.jsonl\nsplit:\n  manifest: ../split.json\n")
    cfg = load_config(path)
    # Kept as written (the config's identity does not depend on where it lives) ...
    assert (cfg.data.path, cfg.split.manifest) == ("../data.jsonl", "../split.json")
    assert cfg.config_dir == str((tmp_path / "sub").resolve())
    # ... and resolved against the config's directory when a run opens them.
    resolved = cfg.resolve_paths()
    assert resolved.data.path == str((tmp_path / "data.jsonl").resolve())
    assert resolved.split.manifest == str((tmp_path / "split.json").resolve())
    moved = load_config(path).model_copy(update={"config_dir": "/elsewhere"})
    assert config_sha256(moved) == config_sha256(cfg)


def test_missing_data_file_says_did_you_mean(tmp_path: Path) -> None:
    """A data path that does not exist is reported with the closest sibling."""
    (tmp_path / "train.jsonl").write_text("")
    with pytest.raises(ConfigError, match=r"data.path: file not found.*did you mean '.*train.jsonl'"):
        load_config(_write(tmp_path, "data:\n  path: trian.jsonl\n"))


def test_missing_paths_come_with_the_other_problems_and_their_lines(tmp_path: Path) -> None:
    """A missing data file is named in the same refusal as an unknown key (it showed only once the
    schema problems were fixed) and located: its line and column, or [from --set]."""
    path = _write(tmp_path, "data:\n  path: nothere.jsonl\ntrain:\n  max_stepz: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    problems = _problems(info)
    assert set(problems) == {"train.max_stepz", "data.path"}
    assert (
        "file not found (got " in problems["data.path"]
        and "[line 2, column 9]; fix: " in problems["data.path"]
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, ["data.path=elsewhere.jsonl", "split.manifest=m.json"])
    problems = _problems(info)
    assert set(problems) == {"train.max_stepz", "data.path", "split.manifest"}
    assert "elsewhere.jsonl') [from --set]; fix: " in problems["data.path"]


def test_missing_config_file_says_did_you_mean(tmp_path: Path) -> None:
    """A config path that does not exist raises InputError suggesting the closest file."""
    _write(tmp_path, "", "quickstart.yaml")
    with pytest.raises(InputError) as info:
        load_config(tmp_path / "quickstrat.yaml")
    assert "not found" in info.value.message and "quickstart.yaml" in str(info.value.fix)


def test_dump_round_trip_and_sha(tmp_path: Path) -> None:
    """dump_config_yaml writes YAML that loads back to an equal config with the same sha256."""
    cfg = config_from_dict(
        {
            "data": {"prompt_template": "Q: {prompt}\nA: ", "system_prompt": "off"},
            "train": {"epochs": 3},
            "seed": {"overrides": {"eval": 5}},
        }
    )
    dump_config_yaml(cfg, tmp_path / "out.yaml")
    again = load_config(tmp_path / "out.yaml")
    assert again.config_dir == str(tmp_path.resolve())  # the copy had none: its own directory
    assert again.model_copy(update={"config_dir": None}) == cfg and config_sha256(again) == config_sha256(cfg)
    # A config with a config_dir keeps it through a copy anywhere (verify, the run directory).
    placed = cfg.model_copy(update={"config_dir": "/projects/p"})
    dump_config_yaml(placed, tmp_path / "copy" / "config.yaml")
    assert load_config(tmp_path / "copy" / "config.yaml") == placed
    assert config_sha256(cfg) != config_sha256(ExperimentConfig())


def test_config_sha256_golden() -> None:
    """The default config's identity is pinned: a changed default shows up here, on purpose."""
    assert (
        config_sha256(ExperimentConfig())
        == "4c94974de2d5a2665a1b6d339811026641405514e24eaae8b2af0100a7dc25c0"
    )


def test_config_is_frozen() -> None:
    """Configs are immutable."""
    cfg = ExperimentConfig()
    with pytest.raises(Exception, match="frozen"):
        cfg.train.max_steps = 3


def test_config_reference_is_current_and_complete() -> None:
    """docs/config.md is what scripts/gen_config_docs.py generates, and names every key."""
    import gen_config_docs

    text = (REPO / "docs" / "config.md").read_text(encoding="utf-8")
    assert text == gen_config_docs.render()
    for key in config_keys():
        assert f"`{key.path}`" in text


def test_config_and_record_modules_do_not_import_torch() -> None:
    """Reading configs and records (compare, report) never imports torch."""
    code = (
        "import sys; import reprotune._config.schema, reprotune._run.record; "
        "from reprotune._config.schema import ExperimentConfig; ExperimentConfig().resolved(); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_unknown_key_named_like_a_secret_never_shows_its_value(tmp_path: Path) -> None:
    """`tracking: {password: hunter2}` printed "(got 'hunter2')"; a value under a key named like a
    secret is never shown, whatever the problem."""
    path = _write(tmp_path, "tracking: {password: hunter2}\nseed:\n  overrides: {api_key: hunter3}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "hunter" not in str(info.value)
    assert _problems(info)["tracking.password"] == (
        "tracking.password: unknown key [line 1, column 12]; fix: remove it or use one of: mlflow, "
        "wandb, uri, artifact_location, experiment; credentials belong in the environment, never in "
        "the config"
    )


def test_a_key_in_the_wrong_section_names_the_section_that_has_it(tmp_path: Path) -> None:
    """Top-level `max_steps` (or `eval.learning_rate`) says "did you mean train.max_steps?", in
    the file and in a --set; the fuzzy match stays for typos."""
    path = _write(tmp_path, "max_steps: 5\neval: {learning_rate: 0.1}\ntrain: {max_step: 3}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, ["max_steps=5"])
    problems = _problems(info)
    assert "fix: did you mean train.max_steps? remove it" in problems["max_steps"]
    assert "fix: did you mean train.learning_rate? remove it" in problems["eval.learning_rate"]
    assert "fix: did you mean 'max_steps'? remove it" in problems["train.max_step"]
    assert (
        "--set max_steps: no key 'max_steps' in the top level; fix: did you mean train.max_steps?"
        in (info.value.problems)[0]
    )
