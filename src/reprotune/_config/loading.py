"""Loading an experiment config: YAML file, ``--set`` overrides, validation, paths.

``load_config`` reads the YAML (with line and column for every problem, ``_config.yaml_io``),
applies ``--set`` overrides, validates against the schema (``_config.schema``), resolves relative
paths against the config file's directory and returns an :class:`ExperimentConfig`. Every
problem is reported at once in one :class:`ConfigError`, each as
``key.path: problem (got X) [line L, column C]; fix: ...``.

Importing this module never imports torch.
"""

from __future__ import annotations

import functools
import reprlib
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from reprotune._config.paths import file_hint, inside_hint, path_problems, paths_only, with_config_dir
from reprotune._config.schema import (
    FIELD_TAG,
    ExperimentConfig,
    config_sha256,
    did_you_mean,
    dotted,
    model_at,
    submodel,
)
from reprotune._config.secrets import is_secret_name, mask_url_credentials
from reprotune._config.yaml_dialect import Dumper
from reprotune._config.yaml_io import (
    Marks,
    mark_text,
    not_secret_marked,
    parse_yaml,
    parse_yaml_value,
)
from reprotune._errors import ConfigError, InputError
from reprotune._jsonio import path_kind, write_bytes_atomic

#: The largest config file read (1 MiB): a config names data and models, it does not hold them.
MAX_CONFIG_BYTES = 1 << 20


def _check_key_path(parts: Sequence[str]) -> str | None:
    """None if ``parts`` names a settable key in the schema, else the problem (with did-you-mean)."""
    model: type[BaseModel] = ExperimentConfig
    for depth, part in enumerate(parts):
        fields = model.model_fields
        if part not in fields:
            where = dotted(parts[:depth]) if depth else "the top level"
            fix = _suggest(parts[: depth + 1], list(fields))
            return f"no key {part!r} in {where}; fix: {fix}valid keys: {', '.join(fields)}"
        annotation = fields[part].annotation
        sub = submodel(annotation)
        rest = parts[depth + 1 :]
        if sub is not None:
            if not rest:
                example = f"{dotted(parts)}.{next(iter(sub.model_fields))}"
                return f"{dotted(parts)} is a section; fix: set one of its keys, e.g. {example}=..."
            model = sub
            continue
        if typing.get_origin(annotation) is dict and len(rest) <= 1:
            # A mapping field: its own key (e.g. seed.overrides.lora_init) is checked by validation.
            return None
        if rest:
            value = dotted(parts[: depth + 1])
            return f"{value} is a value, not a section; fix: --set {value}=VALUE"
        return None
    return None


@functools.cache
def _key_paths(
    model: type[BaseModel] = ExperimentConfig, prefix: tuple[str, ...] = ()
) -> list[tuple[str, ...]]:
    """Every key path of the schema under ``model``, sections included."""
    paths: list[tuple[str, ...]] = []
    for name, field in model.model_fields.items():
        paths.append((*prefix, name))
        sub = submodel(field.annotation)
        if sub is not None:
            paths.extend(_key_paths(sub, (*prefix, name)))
    return paths


def _suggest(path: Sequence[str | int], valid: Sequence[str]) -> str:
    """``"did you mean train.max_steps? "`` for a key the schema has in another section (top-level
    ``max_steps``), else "did you mean" among ``valid``, else ``""``."""
    name = path[-1]
    elsewhere = [dotted(p) for p in _key_paths() if p[-1] == name and p != tuple(path)]
    if elsewhere:
        return f"did you mean {' or '.join(elsewhere)}? "
    return did_you_mean(str(name), valid)


def _apply_overrides(
    data: dict[str, Any], overrides: Sequence[str], problems: list[str]
) -> set[tuple[str, ...]]:
    """Apply ``KEY.PATH=VALUE`` overrides to ``data`` in place; return the paths set."""
    applied: set[tuple[str, ...]] = set()
    for item in overrides:
        key, sep, raw = item.partition("=")
        parts = tuple(p.strip() for p in key.split("."))
        if not sep or not key.strip() or any(not p for p in parts):
            problems.append(f"--set {item!r}: expected KEY.PATH=VALUE; fix: e.g. --set eval.max_rows=8")
            continue
        problem = _check_key_path(parts)
        if problem is not None:
            problems.append(f"--set {key}: {problem}")
            continue
        try:
            value = parse_yaml_value(raw, parts)
        except InputError as exc:
            problems.append(f"--set {key}: {exc.message}; fix: {exc.fix}")
            continue
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                problems.append(
                    f"--set {key}: {part} is not a mapping in the config (got {child!r}); "
                    f"fix: make {part} a mapping first"
                )
                break
            node = child
        else:
            node[parts[-1]] = value
            applied.add(parts)
    return applied


# --- validation errors -------------------------------------------------------------------------

_TYPE_FIXES = {
    "int_type": "write a whole number, e.g. 8",
    "int_from_float": "write a whole number, e.g. 8",
    "float_type": "write a number, e.g. 0.1",
    "finite_number": "write a finite number",
    "string_type": "write a string (quote it if YAML reads it as something else)",
    "bool_type": "write true or false",
    "tuple_type": "write a YAML list, e.g. [a, b]",
    "list_type": "write a YAML list, e.g. [a, b]",
    "dict_type": "write a mapping of key: value lines",
    "model_type": "write a mapping of key: value lines",
    "model_attributes_type": "write a mapping of key: value lines",
    "too_short": "give more items",
    "string_too_short": "write a non-empty string",
}
_BOUND_FIXES = {"greater_than": "gt", "greater_than_equal": "ge", "less_than": "lt", "less_than_equal": "le"}
_BOUND_WORDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


# Bounded: a value is cut while it is formatted, never formatted whole and then cut.
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlevel = 3


def _short(value: Any) -> str:
    text = mask_url_credentials(_REPR.repr(value))  # messages never show a URL's credentials
    return text if len(text) <= 80 else text[:77] + "..."


def _format_error(error: Mapping[str, Any], marks: Marks, overridden: set[tuple[str, ...]]) -> str:
    """One pydantic error as ``key.path: problem (got X) [line L, column C]; fix: ...``."""
    loc = tuple(error["loc"])
    kind = error["type"]
    message = str(error["msg"])
    if kind == "value_error":
        message = message.removeprefix("Value error, ")
        if message.startswith(FIELD_TAG):
            field, _, message = message[len(FIELD_TAG) :].partition("\x00")
            loc = (*loc, field)
        problem, _, fix = message.partition("; fix: ")
        got = ""
    else:
        problem = message[:1].lower() + message[1:]
        name = next((p for p in reversed(loc) if isinstance(p, str)), "")
        # a value under a key named like a secret (tracking.password) is never shown
        got = "" if is_secret_name(name) else f" (got {_short(error.get('input'))})"
        fix = _TYPE_FIXES.get(kind, "see docs/config.md")
        ctx = error.get("ctx") or {}
        if kind == "extra_forbidden":
            problem = "unknown key"
            section = model_at(loc[:-1])
            valid = list(section.model_fields) if section else []
            fix = f"{_suggest(loc, valid)}remove it or use one of: {', '.join(valid)}"
            if is_secret_name(name):
                fix += "; credentials belong in the environment, never in the config"
        elif kind == "literal_error":
            fix = f"use one of {ctx.get('expected', '')}"
        elif kind in _BOUND_FIXES:
            bound = _BOUND_FIXES[kind]
            fix = f"use a value {_BOUND_WORDS[bound]} {ctx.get(bound)}"
    where = ""
    key = tuple(str(p) for p in loc if isinstance(p, str))
    # --set seed.overrides.bogus=7 fails at seed.overrides (the mapping's validator): a --set at, above
    # or below the key is where the value came from
    if loc[:1] and any(key[: len(o)] == o or o[: len(key)] == key for o in overridden):
        where = " [from --set]"
    elif loc in marks:
        key_mark, value_mark = marks[loc]
        where = f" [{mark_text(key_mark if kind == 'extra_forbidden' else value_mark)}]"
    return f"{dotted(loc)}: {problem}{got}{where}" + (f"; fix: {fix}" if fix else "")


# --- public API --------------------------------------------------------------------------------


def config_from_dict(
    data: Mapping[str, Any] | None,
    *,
    source: str = "<dict>",
    base_dir: str | Path | None = None,
    overrides: Sequence[str] = (),
    check_paths: bool = False,
    _marks: Marks | None = None,
) -> ExperimentConfig:
    """Validate a config mapping into an :class:`ExperimentConfig`.

    Args:
        data: the parsed config (None = all defaults).
        source: where ``data`` came from, for messages.
        base_dir: the config file's directory: ``config_dir`` when the data sets none (a relative
            ``config_dir`` resolves against it). Paths stay as written: a run resolves them
            against ``config_dir`` (:meth:`ExperimentConfig.resolve_paths`).
        overrides: ``KEY.PATH=VALUE`` strings, values parsed as YAML.
        check_paths: also report a data file, manifest or local model directory that does not exist.

    Returns:
        The validated, frozen config.

    Raises:
        ConfigError: every problem found, at once.
    """
    problems: list[str] = []
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            [
                f"<top level>: expected a mapping of sections (got {_short(data)}); "
                "fix: start the file with sections like `train:`"
            ],
            source=source,
        )
    raw = _deep_copy(dict(data))
    overridden = _apply_overrides(raw, overrides, problems)
    marks = _marks or {}
    try:
        cfg = ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        problems.extend(_format_error(error, marks, overridden) for error in exc.errors())
        cfg = None
    if cfg is None or problems:  # the paths too, so that one round of fixes is enough
        located = paths_only(raw, base_dir) if check_paths else None
        if located is not None:
            problems.extend(path_problems(located, marks, overridden))
        raise ConfigError(problems, source=source)
    cfg = with_config_dir(cfg, base_dir)
    if check_paths:
        problems.extend(path_problems(cfg, marks, overridden))
        if problems:
            raise ConfigError(problems, source=source)
    return cfg


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Load, override and validate the YAML config at ``path``.

    Paths stay as the file writes them; ``config_dir`` is set to the file's directory (unless the
    file sets it), and relative ``data.path``, ``split.manifest`` and local ``model.name`` resolve
    against it when a run opens them. So the config's identity (``config_sha256``) does not depend
    on where the project lives, and a moved project keeps its hash.

    Args:
        path: the YAML file.
        overrides: ``KEY.PATH=VALUE`` strings (``--set``), values parsed as YAML.

    Returns:
        The validated, frozen config.

    Raises:
        InputError: the file does not exist or cannot be read (with "did you mean").
        ConfigError: every problem in the file and the overrides, at once.

    Example:
        >>> cfg = load_config("examples/quickstart.yaml", ["train.max_steps=5"])  # doctest: +SKIP
    """
    file = Path(path)
    kind = path_kind(file)
    if kind == "missing":
        raise InputError(f"config file {str(path)!r} not found", source=str(path), fix=file_hint(file))
    if kind != "file":
        raise InputError(
            f"config path {str(path)!r} is a {kind}, not a config file",
            source=str(path),
            fix=f"pass a YAML file{inside_hint(file, ('.yaml', '.yml'))}",
        )
    size = file.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise InputError(
            f"config file {str(path)!r} is {size} bytes; a config is at most {MAX_CONFIG_BYTES} "
            "(data and prompts belong in files it names)",
            source=str(path),
            fix="pass the experiment config (YAML), not a data file",
        )
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(
            f"cannot read config file: {exc}", source=str(path), fix="pass a UTF-8 YAML file"
        ) from None
    if not text.strip() or all(line.lstrip().startswith("#") for line in text.splitlines() if line.strip()):
        raise InputError(
            f"config file {str(path)!r} is empty: it would run every default (a fine-tune of the "
            "builtin model), which no one asks for with an empty file",
            source=str(path),
            fix="write the settings you want (see examples/quickstart.yaml), or `{}` to run the defaults",
        )
    data, marks = parse_yaml(text, str(path))
    return config_from_dict(
        data,
        source=str(path),
        base_dir=file.resolve().parent,
        overrides=overrides,
        check_paths=True,
        _marks=marks,
    )


def dump_config_yaml(cfg: ExperimentConfig, path: str | Path) -> Path:
    """Write ``cfg.resolved()`` as YAML atomically; :func:`load_config` reads it back to an equal config.

    Returns:
        The path written.
    """
    header = f"# reprotune resolved config: every default written out. sha256 {config_sha256(cfg)}\n"
    body = yaml.dump(
        not_secret_marked(cfg.resolved()),
        Dumper=Dumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
    )
    return write_bytes_atomic(path, (header + body).encode("utf-8"))


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value
