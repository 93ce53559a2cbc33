"""Where a config key sits in its YAML file, so a message about a value can name file, line, column."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from reprotune._config.schema import ExperimentConfig, model_at
from reprotune._config.yaml_io import mark_text, parse_yaml
from reprotune._errors import ReprotuneError

# A dotted key path of the schema (``split.stratify_by``), as library errors give it in ``source``.
_KEY_PATH = re.compile(r"[a-z_]+(\.[a-z_]+)+")


def is_key_path(text: str | None) -> bool:
    """Whether ``text`` names a key of the config schema (``split.stratify_by``)."""
    if text is None or _KEY_PATH.fullmatch(text) is None:
        return False
    *sections, leaf = text.split(".")
    model = model_at(sections)
    return model is not None and model is not ExperimentConfig and leaf in model.model_fields


def value_source(key: str, overrides: Sequence[str], config: str | Path | None) -> str | None:
    """Where ``key``'s value came from: the last ``--set`` of it (the one in force), else the
    config file's line (:func:`key_location`); None when neither applies."""
    given = next((o for o in reversed(overrides) if o.partition("=")[0].strip() == key), None)
    if given is not None:
        return f"--set {given}"
    if config is not None and str(config) and Path(config).is_file():
        return key_location(Path(config), key)
    return None


def key_location(config: Path, key: str) -> str:
    """``cfg.yaml, line 5, column 16 (key split.stratify_by)``, or, when the file does not set the
    key, ``cfg.yaml (key split.stratify_by, not set there: its default applies)``."""
    try:
        _, marks = parse_yaml(config.read_text(encoding="utf-8"), str(config))
    except (OSError, UnicodeDecodeError, ReprotuneError):
        return f"{config} (key {key})"
    found = marks.get(tuple(key.split(".")))
    if found is None:
        return f"{config} (key {key}, not set there: its default applies)"
    return f"{config}, {mark_text(found[1])} (key {key})"
