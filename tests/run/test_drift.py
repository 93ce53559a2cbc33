"""What a resume may find changed since its run's start: which Trainer arguments cannot change
the numbers, and every leaf that differs between two record sections."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reprotune._errors import InputError
from reprotune._run.drift import inert_trainer_arg, leaf_changes, refuse_model_drift, section_drift


@pytest.mark.parametrize(
    ("key", "load_best", "inert"),
    [
        ("config.trainer.args.save_steps", False, True),
        ("config.trainer.args.logging_steps", False, True),
        ("config.trainer.args.hub_model_id", False, True),
        ("config.trainer.args.push_to_hub", False, True),
        # under load_best_model_at_end the saves choose which checkpoint becomes the adapter
        ("config.trainer.args.save_steps", True, False),
        ("config.trainer.args.logging_steps", True, True),
        ("config.trainer.args.learning_rate", False, False),
        ("config.train.save_every", False, False),  # reprotune's own run: not a Trainer argument
        ("config.trainer.args", False, False),
    ],
)
def test_which_trainer_arguments_are_inert(key: str, load_best: bool, inert: bool) -> None:
    assert inert_trainer_arg(key, load_best=load_best) is inert


def test_every_differing_leaf_is_named_with_both_values() -> None:
    old = {"a": {"b": 1, "c": [1]}, "d": "x"}
    new = {"a": {"b": 2, "c": [1]}, "e": None, "f": {"g": 3}}
    assert leaf_changes(old, new, prefix="config") == [
        ("config.a.b", 1, 2),
        ("config.d", "x", None),
        ("config.f", None, {"g": 3}),
    ]
    assert section_drift(old, new, prefix="config") == [
        "config.a.b: recorded 1, now 2",
        "config.d: recorded 'x', now None",
        "config.f: recorded None, now {'g': 3}",
    ]


def test_precision_settings_a_record_made_before_lacks_are_no_drift() -> None:
    """torch's fp32_precision settings, read since 2026-12-06: where the recorded determinism
    section lacks them, a rerun, a resume and an eval compare said "environment differs" for each
    (10 lines); unknown now. At other values on both sides they are drift."""
    old = {"determinism": {"deterministic_algorithms": True}}
    new = {
        "determinism": {
            "deterministic_algorithms": True,
            "fp32_precision": "ieee",
            "fp32_precision_mixed": [],
        }
    }
    assert section_drift(old, new, prefix="environment") == []
    assert section_drift(old["determinism"], new["determinism"], prefix="determinism") == []
    other = {"determinism": {**new["determinism"], "fp32_precision": "tf32"}}
    assert section_drift(new, other, prefix="environment") == [
        "environment.determinism.fp32_precision: recorded 'ieee', now 'tf32'"
    ]
    assert (
        section_drift({"x": 1}, {"x": 1, "fp32_precision": "ieee"}, prefix="config") != []
    )  # not a determinism section


def test_the_builtin_model_is_the_gguf_it_is_converted_from(tmp_path: Path) -> None:
    """The builtin model's converted files are rebuilt wherever its cache is missing, by the
    transformers installed (config.json names its version): a resume is refused on another GGUF
    only, as a local model is on other weights or tokenizer files, never on config.json alone."""
    builtin = {
        "kind": "builtin",
        "gguf_sha256": "g" * 64,
        "weights_sha256": "w" * 64,
        "config_sha256": "c" * 64,
    }
    rebuilt = {**builtin, "weights_sha256": "x" * 64, "config_sha256": "y" * 64, "tokenizer_sha256": "t" * 64}
    refuse_model_drift(builtin, rebuilt, tmp_path / "record.json", fix="f")
    with pytest.raises(InputError, match=r"model\.gguf_sha256: recorded ggg"):
        refuse_model_drift(builtin, {**builtin, "gguf_sha256": "h" * 64}, tmp_path / "record.json", fix="f")
    local = {
        "kind": "local",
        "weights_sha256": "w" * 64,
        "tokenizer_sha256": "t" * 64,
        "config_sha256": "c" * 64,
    }
    refuse_model_drift(local, {**local, "config_sha256": "d" * 64}, tmp_path / "record.json", fix="f")
    with pytest.raises(InputError, match=r"model\.tokenizer_sha256"):
        refuse_model_drift(local, {**local, "tokenizer_sha256": "u" * 64}, tmp_path / "record.json", fix="f")


def _trainer_config(**args: Any) -> dict[str, Any]:
    return {"model": {"name": "/m/a"}, "trainer": {"args": {"save_steps": 2, "logging_steps": 5, **args}}}


def test_a_trainer_resume_may_find_its_model_moved_and_names_what_may_change(tmp_path: Path) -> None:
    """Where the base model lies is no setting of the experiment (its files' hashes are checked):
    a moved model and another save_steps are drift; under load_best_model_at_end the saves choose
    the adapter, and the fix no longer says they may change; an eval_steps the Trainer filled in
    from logging_steps says so."""
    from reprotune._jsonio import canonical_sha256
    from reprotune._run.layout import RunLayout
    from reprotune.integrations._resumable import check_resumable

    def record(config: dict[str, Any]) -> dict[str, Any]:
        return {"status": "stopped", "config": config, "config_sha256": canonical_sha256(config), "code": {}}

    paths, said = RunLayout(tmp_path), list[str]()
    moved = {**_trainer_config(save_steps=1), "model": {"name": "/m/b"}}
    drift = check_resumable(paths, record(_trainer_config()), moved, {}, say=said.append)
    assert drift == [
        "config.model.name: recorded '/m/a', now '/m/b'",
        "config.trainer.args.save_steps: recorded 2, now 1",
    ]
    assert len(said) == 2
    best = _trainer_config(load_best_model_at_end=True)
    with pytest.raises(InputError) as refused:
        check_resumable(paths, record(best), _trainer_config(load_best_model_at_end=True, save_steps=1), {})
    assert "config.trainer.args.save_steps: recorded 2, now 1" in str(refused.value)
    assert "may change: logging_*, hub_*, push_to_hub)" in str(refused.value)
    filled = _trainer_config(eval_steps=5)
    with pytest.raises(InputError) as refused:
        check_resumable(paths, record(filled), _trainer_config(eval_steps=3, logging_steps=3), {})
    assert "eval_steps: recorded 5, now 3 (the Trainer sets eval_steps to logging_steps" in str(refused.value)
