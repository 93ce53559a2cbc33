"""What a resume may find changed since its run's start: which Trainer arguments cannot change
the numbers, and every leaf that differs between two record sections."""

from __future__ import annotations

import pytest

from reprotune._run.drift import inert_trainer_arg, leaf_changes, section_drift


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
