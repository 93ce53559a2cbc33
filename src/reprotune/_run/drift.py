"""Drift: how the code and environment of now differ from what a record holds.

A resumed run must be the run that started (same code: :func:`refuse_code_drift`) and must not
have completed (:func:`refuse_completed`); a rerun reports every difference before it trains
(:func:`code_drift`, :func:`section_drift`); neither is possible for a run a user's Trainer script
made (:func:`refuse_trainer_run`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from reprotune._errors import InputError
from reprotune._run import layout
from reprotune._run.record import Status

#: The keys of a record's ``code`` section that identify the code.
CODE_IDENTITY: tuple[str, ...] = ("commit", "dirty", "diff_sha256")


def code_drift(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Each identity key of two ``code`` sections that differs, as ``code.KEY: recorded X, now Y``."""
    return [
        f"code.{key}: recorded {recorded.get(key)!r}, now {now.get(key)!r}"
        for key in CODE_IDENTITY
        if recorded.get(key) != now.get(key)
    ]


def refuse_code_drift(
    recorded: Mapping[str, Any], now: Mapping[str, Any], run_dir: Path, *, what: str, override: str | None
) -> list[str]:
    """Raise when the code differs from the recorded code; return the drift lines otherwise (empty).

    Args:
        recorded: the record's ``code`` section.
        now: the ``code`` section of the code here and now.
        run_dir: the recorded run, for the message.
        what: what is refused ("resuming", "rerunning").
        override: the option that allows it anyway, if there is one (``--allow-code-drift``).

    Raises:
        InputError: the code differs (commit, dirty flag or diff).
    """
    drift = code_drift(recorded, now)
    if drift:
        patch = layout.RunLayout(run_dir).patch
        anyway = f", or pass {override} to go on anyway" if override else ", or start a new run"
        checkout = f"check out commit {recorded.get('commit')} (and apply {patch} if the run was dirty)"
        if not recorded.get("commit"):
            checkout = "the run was made outside a git checkout (no commit to check out): use its code"
        elif not now.get("in_git"):  # run from outside the repository: the code is read from here
            checkout = (
                "run it from inside the git checkout the run was made in (the code is read from the "
                f"current directory, which is in none), at commit {recorded.get('commit')}"
            )
        raise InputError(
            "the code differs from the code the run was made with:\n  " + "\n  ".join(drift),
            source=str(layout.RunLayout(run_dir).record),
            fix=f"{checkout} before {what}{anyway}",
        )
    return drift


#: What a base model is: the sha256 of its weight and tokenizer files; for reprotune's builtin
#: model, of the GGUF it is converted from (its converted files are rebuilt, by whatever
#: transformers is installed, wherever the cache is missing). A resume on others trains another
#: model from its checkpoint on; where it lies, how it is named and its config.json's bookkeeping
#: (``transformers_version``) may change: those are warned, not refused.
MODEL_IDENTITY: tuple[str, ...] = ("weights_sha256", "tokenizer_sha256")
BUILTIN_IDENTITY: tuple[str, ...] = ("gguf_sha256",)


def refuse_model_drift(
    recorded: Mapping[str, Any], now: Mapping[str, Any], record: Path, *, fix: str
) -> None:
    """Raise when the base model's files (:data:`MODEL_IDENTITY`, or :data:`BUILTIN_IDENTITY` for
    the builtin model) hash to others than the run started with; a hash one side could not take
    (None: files not found) is let be.

    Args:
        recorded: the record's ``model`` section.
        now: the ``model`` section of the model loaded now.
        record: the run's ``record.json``, for the message.
        fix: what to do instead.
    """
    keys = BUILTIN_IDENTITY if recorded.get("kind") == "builtin" == now.get("kind") else MODEL_IDENTITY
    differing = [
        f"model.{key}: recorded {str(recorded[key])[:12]}..., now {str(now[key])[:12]}..."
        for key in keys
        if isinstance(recorded.get(key), str) and isinstance(now.get(key), str) and recorded[key] != now[key]
    ]
    if differing:
        where = now.get("resolved_path") or now.get("source")
        raise InputError(
            f"the base model ({where}) is not the one the run started with: the steps after the "
            "checkpoint would train another model:\n  " + "\n  ".join(differing),
            source=str(record),
            fix=fix,
        )


#: Config keys that say where a base model lies and how it is named, not what it is (its files'
#: hashes do): a resume may find it moved.
MODEL_PLACE_KEYS: tuple[str, ...] = ("config.model.name", "config.lora.base_model_name_or_path")


def refuse_completed(status: Status | None, run_dir: Path, *, fix: str | None = None) -> None:
    """Raise when the run to resume has completed: there is nothing to resume.

    Args:
        status: the record's status.
        run_dir: the recorded run, for the message.
        fix: what to do instead; by default compare it or rerun it from the CLI.

    Raises:
        InputError: the status is ``completed``.
    """
    if status == "completed":
        raise InputError(
            f"the run in {run_dir} is already complete; nothing to resume",
            source=str(layout.RunLayout(run_dir).record),
            fix=fix
            or f"compare it with `reprotune compare`, or start a new one with `reprotune rerun {run_dir}`",
        )


#: What reproduces a Trainer-made run, which reprotune cannot train again itself.
RUN_THE_SCRIPT_AGAIN = (
    "run the script again and `reprotune compare` the two runs, or use `reprotune verify "
    '--command "python train.py ..."` (docs/integrations.md)'
)


def refuse_trainer_run(record: Mapping[str, Any], run_dir: Path, *, why: str, fix: str) -> None:
    """Raise when ``record`` is of a run ``ReprotuneCallback`` wrote inside a user's Trainer script:
    it holds the Trainer's settings, not a reprotune config, so reprotune cannot train it again.

    Args:
        why: what cannot be done, for the message.
        fix: what to do instead.
    """
    if "trainer" in (record.get("config") or {}):
        raise InputError(
            f"the run in {run_dir} was written by ReprotuneCallback inside a Trainer script: {why}",
            source=str(layout.RunLayout(run_dir).record),
            fix=fix,
        )


def environment_drift(
    recorded: Mapping[str, Any], now: Mapping[str, Any], report: Callable[[str], None]
) -> list[str]:
    """What moved in the environment since the run started, each line warned on ``report``; a
    resume notes the lines on its attempt."""
    drift = section_drift(recorded, now, prefix="environment")
    for line in drift:
        report(f"warning: environment differs from the run's start: {line}")
    return drift


def section_drift(old: Mapping[str, Any], new: Mapping[str, Any], *, prefix: str) -> list[str]:
    """Every leaf of two record sections that differs, as ``prefix.path: recorded X, now Y``."""
    return [f"{key}: recorded {a!r}, now {b!r}" for key, a, b in leaf_changes(old, new, prefix=prefix)]


#: A drift line as :func:`section_drift` (and every note of what moved) writes it.
_DRIFT_LINE = re.compile(r"(?P<key>[^\s:]+): recorded (?P<then>.*), now (?P<now>.*)", re.S)


def read_drift_line(line: object) -> tuple[str, Any] | None:
    """A drift line's key and the value it says is in force now, read back from its repr (a value
    that is no Python literal, such as a hash cut short, as its text); None for any other line."""
    found = _DRIFT_LINE.fullmatch(line) if isinstance(line, str) else None
    if found is None:
        return None
    try:
        return found["key"], ast.literal_eval(found["now"])
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return found["key"], found["now"]


#: Leaves records gained later, by the name of the section that holds them and how their keys
#: begin: torch's ``fp32_precision`` settings in a ``determinism`` section (a run's or an eval's,
#: ``_determinism.flags.precision_flags``) and an eval's ``generation.prompt_truncation``, both
#: recorded since 2026-12-06.
_ADDED_LATER: tuple[tuple[str, str], ...] = (
    ("determinism", "fp32_precision"),
    ("generation", "prompt_truncation"),
)


def added_later(prefix: str, key: str) -> bool:
    """Whether ``prefix.key`` is a leaf records gained later (:data:`_ADDED_LATER`), unknown where
    one record lacks it."""
    section = prefix.rsplit(".", 1)[-1]
    return any(section == name and key.startswith(start) for name, start in _ADDED_LATER)


def leaf_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], *, prefix: str
) -> list[tuple[str, Any, Any]]:
    """Every leaf of two record sections that differs: its key path under ``prefix``, its value
    in ``old`` and in ``new`` (None where a section lacks it), in key order; a leaf one section
    lacks because it was recorded later (:func:`added_later`) is unknown, not a change."""
    changes: list[tuple[str, Any, Any]] = []
    for key in sorted(set(old) | set(new)):
        if (key in old) != (key in new) and added_later(prefix, key):
            continue
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            changes.extend(leaf_changes(a, b, prefix=f"{prefix}.{key}"))
        elif a != b:
            changes.append((f"{prefix}.{key}", a, b))
    return changes


#: A Trainer's arguments that choose what it logs, saves and pushes, never what it computes: a
#: run's ``config.trainer.args.<NAME>`` cannot change the numbers when NAME starts with one of
#: these (the Trainer's own loss log, ``logging_nan_inf_filter`` included, is not the ledger's;
#: tests/integrations show two runs apart in them alone give the same bits).
INERT_TRAINER_ARG_PREFIXES: tuple[str, ...] = ("logging_", "save_", "hub_", "push_to_hub")
TRAINER_ARGS = "config.trainer.args."


def inert_trainer_arg(key: str, *, load_best: bool) -> bool:
    """Whether the config key path ``key`` is a Trainer argument that cannot change the numbers
    (:data:`INERT_TRAINER_ARG_PREFIXES`); under ``load_best_model_at_end`` (``load_best``) the
    ``save_*`` arguments choose which checkpoint becomes the adapter, so they can."""
    if not key.startswith(TRAINER_ARGS):
        return False
    name = key[len(TRAINER_ARGS) :]
    return name.startswith(INERT_TRAINER_ARG_PREFIXES) and not (load_best and name.startswith("save_"))
