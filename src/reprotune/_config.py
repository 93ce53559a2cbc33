"""The experiment config: one YAML file validated into typed, frozen objects.

``load_config`` reads the YAML (with line and column for every problem), applies ``--set``
overrides, validates, resolves relative paths against the config file's directory and returns an
:class:`ExperimentConfig`. Every problem is reported at once in one :class:`ConfigError`, each as
``key.path: problem (got X) [line L, column C]; fix: ...``.

The YAML dialect is YAML 1.2's core schema where YAML 1.1 surprises people: ``off``/``no``/``yes``
stay strings (``determinism.mode: off`` means the string ``off``), and ``2e-4`` is a float.

Importing this module never imports torch.
"""

from __future__ import annotations

import difflib
import math
import re
import string
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from reprotune._errors import ConfigError, InputError
from reprotune._jsonio import canonical_dumps, sha256_bytes, write_bytes_atomic
from reprotune._seeding import CONSUMERS, SEED_LIMIT

#: Names accepted after ``builtin:`` in ``data.path`` and ``model.name``.
BUILTIN_DATA: tuple[str, ...] = ("chatterbot-en",)
BUILTIN_MODELS: tuple[str, ...] = ("smollm2-135m-instruct",)
BUILTIN_PREFIX = "builtin:"

# Strict scalar types: YAML gives real types, so a quoted "8" or a bool where a number belongs is
# a mistake to report, not to coerce. Floats accept ints (``alpha: 16``).
Int = Annotated[int, Field(strict=True)]
Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Bool = Annotated[bool, Field(strict=True)]
Str = Annotated[str, Field(strict=True)]

# A validator's message starting with this tag names the field it is about, so the error
# points at ``train.epochs`` instead of the whole ``train`` section.
_FIELD_TAG = "\x00field:"


def _field_error(field: str, message: str) -> ValueError:
    return ValueError(f"{_FIELD_TAG}{field}\x00{message}")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SeedConfig(_Section):
    """Seeds: one root, every consumer's seed derived from it by name."""

    root: Int = Field(default=42, ge=0, lt=SEED_LIMIT, description="root seed, an integer in [0, 2**63)")
    overrides: dict[str, Int] = Field(
        default_factory=dict,
        description="consumer -> explicit seed, replacing its derived seed; consumers: "
        + ", ".join(CONSUMERS),
    )

    @field_validator("overrides")
    @classmethod
    def _known_consumers(cls, value: dict[str, int]) -> dict[str, int]:
        for name, seed in value.items():
            if name not in CONSUMERS:
                raise ValueError(
                    f"unknown seed consumer {name!r}; fix: {_did_you_mean(name, CONSUMERS)}"
                    f"use one of {', '.join(CONSUMERS)}"
                )
            if not 0 <= seed < SEED_LIMIT:
                raise ValueError(f"seed for {name!r} must be in [0, 2**63) (got {seed}); fix: use e.g. 7")
        return value


class DataConfig(_Section):
    """The dataset and how a row becomes a prompt."""

    path: Str = Field(
        default="builtin:chatterbot-en",
        min_length=1,
        description="file path (jsonl/csv/parquet) or builtin:NAME; relative paths resolve against "
        "the config file's directory",
    )
    format: Literal["auto", "jsonl", "csv", "parquet"] = Field(
        default="auto", description="file format; auto = by suffix"
    )
    prompt_field: Str = Field(default="prompt", min_length=1, description="column holding the prompt")
    response_field: Str = Field(default="response", min_length=1, description="column holding the response")
    system_prompt: Str | None = Field(default=None, description="optional system message for chat templates")
    prompt_template: Str = Field(
        default="### Question:\n{prompt}\n### Answer:\n",
        description="used only when the tokenizer has no chat template; must contain {prompt} and "
        "no other {field}",
    )

    @field_validator("path")
    @classmethod
    def _known_builtin(cls, value: str) -> str:
        return _check_builtin(value, BUILTIN_DATA)

    @field_validator("prompt_template")
    @classmethod
    def _template_fields(cls, value: str) -> str:
        try:
            fields = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
        except ValueError as exc:
            raise ValueError(
                f"not a valid format string: {exc} (got {value!r}); fix: write braces as {{{{ }}}}"
            ) from None
        if fields != {"prompt"}:
            extra = sorted(fields - {"prompt"})
            problem = f"unknown placeholder(s) {extra}" if extra else "does not contain {prompt}"
            raise ValueError(f"{problem} (got {value!r}); fix: use exactly one placeholder, {{prompt}}")
        return value


class SplitConfig(_Section):
    """How the data is split into train, validation and test."""

    manifest: Str | None = Field(
        default=None,
        description="path to an existing split manifest; when set, the options below are ignored",
    )
    ratios: tuple[Float, ...] = Field(
        default=(0.8, 0.1, 0.1), description="train, validation, test fractions; sum to 1"
    )
    stratify_by: Str | None = Field(
        default=None, description="column whose class proportions each split keeps"
    )
    group_by: Str | None = Field(default=None, description="column whose groups never straddle two splits")
    rare_class_policy: Literal["train", "drop", "error"] = Field(
        default="train", description="what to do with a class too small to appear in every split"
    )

    @field_validator("ratios")
    @classmethod
    def _valid_ratios(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if len(value) != 3:
            raise ValueError(
                f"needs 3 fractions: train, validation, test (got {list(value)}); fix: e.g. [0.8, 0.1, 0.1]"
            )
        if any(not 0.0 <= r <= 1.0 for r in value) or value[0] <= 0 or value[1] <= 0:
            raise ValueError(
                f"each fraction must be in [0, 1], train and validation > 0 (got {list(value)}); "
                "fix: e.g. [0.8, 0.1, 0.1]"
            )
        if not math.isclose(math.fsum(value), 1.0, rel_tol=0, abs_tol=1e-9):
            raise ValueError(
                f"fractions must sum to 1 (got {list(value)}, sum {math.fsum(value)!r}); "
                "fix: e.g. [0.8, 0.1, 0.1]"
            )
        return value


class ModelConfig(_Section):
    """The base model and its tokenizer settings."""

    name: Str = Field(
        default="builtin:smollm2-135m-instruct",
        min_length=1,
        description="hub id, local directory, or builtin:NAME",
    )
    revision: Str | None = Field(default=None, description="hub revision; pin a commit sha")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="dtype the weights load in"
    )
    max_length: Int = Field(default=256, ge=8, description="tokenizer max_length (>= 8)")
    padding_side: Literal["right", "left"] = Field(default="right", description="tokenizer padding side")
    pad_token_id: Int | None = Field(
        default=None,
        ge=0,
        description="null -> the tokenizer's pad token, else its eos token; the resolved id is recorded",
    )

    @field_validator("name")
    @classmethod
    def _known_builtin(cls, value: str) -> str:
        return _check_builtin(value, BUILTIN_MODELS)


class LoraConfig(_Section):
    """The LoRA adapter, as PEFT receives it."""

    r: Int = Field(default=8, ge=1, description="rank")
    alpha: Float = Field(default=16.0, gt=0, description="scaling numerator (scale = alpha / r)")
    dropout: Float = Field(default=0.05, ge=0, lt=1, description="dropout on the LoRA input, in [0, 1)")
    target_modules: tuple[Str, ...] = Field(
        default=("q_proj", "v_proj"), min_length=1, description="names of the modules that get an adapter"
    )
    bias: Literal["none", "all", "lora_only"] = Field(default="none", description="which biases train")

    @field_validator("target_modules")
    @classmethod
    def _unique_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not name for name in value) or len(set(value)) != len(value):
            raise ValueError(
                f"names must be non-empty and unique (got {list(value)}); fix: e.g. [q_proj, v_proj]"
            )
        return value


class TrainConfig(_Section):
    """The optimisation: optimizer, schedule, batch, length, checkpoints, precision."""

    optimizer: Literal["adamw", "sgd"] = Field(default="adamw", description="optimizer")
    learning_rate: Float = Field(default=2.0e-4, gt=0, description="peak learning rate (> 0)")
    scheduler: Literal["constant", "linear", "cosine"] = Field(
        default="linear", description="learning-rate schedule"
    )
    warmup_steps: Int = Field(default=0, ge=0, description="linear warmup steps (<= max_steps)")
    weight_decay: Float = Field(default=0.0, ge=0, description="decoupled weight decay")
    batch_size: Int = Field(default=8, ge=1, description="rows per micro-batch")
    grad_accum_steps: Int = Field(default=1, ge=1, description="micro-batches per optimizer step")
    max_steps: Int | None = Field(
        default=100,
        ge=1,
        description="optimizer steps; exactly one of max_steps and epochs (setting epochs "
        "alone clears this default)",
    )
    epochs: Int | None = Field(
        default=None, ge=1, description="passes over the training split, instead of max_steps"
    )
    max_grad_norm: Float | None = Field(
        default=1.0, gt=0, description="gradient clipping norm; null = no clipping"
    )
    eval_every: Int = Field(default=25, ge=0, description="validate every N steps; 0 = only at the end")
    save_every: Int = Field(default=0, ge=0, description="checkpoint every N steps; 0 = never")
    keep_checkpoints: Int = Field(default=2, ge=1, description="how many latest checkpoints to keep")
    precision: Literal["fp32", "bf16", "fp16"] = Field(default="fp32", description="compute precision")

    @model_validator(mode="before")
    @classmethod
    def _epochs_clear_default_steps(cls, data: Any) -> Any:
        # Writing only ``epochs: 3`` means "train by epochs": the max_steps default must not
        # then count as a second, conflicting length.
        if isinstance(data, dict) and data.get("epochs") is not None and "max_steps" not in data:
            return {**data, "max_steps": None}
        return data

    @model_validator(mode="after")
    def _one_length(self) -> TrainConfig:
        if self.max_steps is None and self.epochs is None:
            raise _field_error(
                "max_steps",
                "neither max_steps nor epochs is set (got null, null); fix: set one, e.g. max_steps: 100",
            )
        if self.max_steps is not None and self.epochs is not None:
            raise _field_error(
                "epochs",
                f"max_steps ({self.max_steps}) and epochs ({self.epochs}) are both set; "
                "fix: keep one and set the other to null",
            )
        if self.max_steps is not None and self.warmup_steps > self.max_steps:
            raise _field_error(
                "warmup_steps",
                f"exceeds max_steps {self.max_steps} (got {self.warmup_steps}); fix: lower warmup_steps",
            )
        return self


class EvalConfig(_Section):
    """Validation during and after training."""

    batch_size: Int = Field(default=8, ge=1, description="rows per validation batch")
    max_rows: Int | None = Field(
        default=None, ge=1, description="cap the validation rows (sampled with the eval seed); null = all"
    )


class DeterminismConfig(_Section):
    """How hard torch is held to deterministic computation."""

    mode: Literal["strict", "warn", "off"] = Field(
        default="strict",
        description="strict = raise on nondeterministic ops; warn = warn; off = torch defaults",
    )
    threads: Int | None = Field(default=2, ge=1, description="torch intra-op threads; null = leave unpinned")
    device: Literal["cpu", "cuda", "auto"] = Field(
        default="cpu", description="compute device; auto = cuda if present"
    )


class TrackingConfig(_Section):
    """Trackers: observers that mirror the record."""

    mlflow: Bool = Field(default=True, description="log params, metrics and artifacts to MLflow")
    uri: Str = Field(
        default="sqlite:///mlflow.db",
        min_length=1,
        description="tracking URI; relative sqlite paths resolve against the current directory",
    )
    artifact_location: Str = Field(
        default="mlartifacts", min_length=1, description="where MLflow stores artifacts"
    )
    experiment: Str = Field(default="reprotune", min_length=1, description="MLflow experiment name")


class ExperimentConfig(_Section):
    """A whole experiment. Every field has a default; see docs/config.md."""

    seed: SeedConfig = Field(default=SeedConfig(), description="seeds")
    data: DataConfig = Field(default=DataConfig(), description="data")
    split: SplitConfig = Field(default=SplitConfig(), description="split")
    model: ModelConfig = Field(default=ModelConfig(), description="base model")
    lora: LoraConfig = Field(default=LoraConfig(), description="LoRA adapter")
    train: TrainConfig = Field(default=TrainConfig(), description="training")
    eval: EvalConfig = Field(default=EvalConfig(), description="evaluation")
    determinism: DeterminismConfig = Field(default=DeterminismConfig(), description="determinism")
    tracking: TrackingConfig = Field(default=TrackingConfig(), description="tracking")

    def resolved(self) -> dict[str, Any]:
        """The config with every default written out, as JSON-safe data (lists, not tuples)."""
        return self.model_dump(mode="json")


def config_sha256(cfg: ExperimentConfig) -> str:
    """sha256 of the canonical compact JSON of ``cfg.resolved()``: the config's identity."""
    return sha256_bytes(canonical_dumps(cfg.resolved(), indent=None).encode("utf-8"))


def _check_builtin(value: str, known: tuple[str, ...]) -> str:
    if value.startswith(BUILTIN_PREFIX):
        name = value[len(BUILTIN_PREFIX) :]
        if name not in known:
            raise ValueError(
                f"unknown builtin {name!r} (got {value!r}); fix: {_did_you_mean(name, known)}"
                f"known: {', '.join(BUILTIN_PREFIX + k for k in known)}"
            )
    return value


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    """``"did you mean 'x'? "`` for the closest of ``choices``, or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


# --- YAML --------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans (only true/false) and floats like ``2e-4``."""


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes exactly the strings :class:`_Loader` would read as another type."""


def _yaml12_resolvers() -> dict[Any, list[tuple[str, re.Pattern[str]]]]:
    bool_tag, float_tag = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"
    resolvers = {
        first: [(tag, regexp) for tag, regexp in entries if tag != bool_tag]
        for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    bool_re = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
    for first in "tTfF":
        resolvers.setdefault(first, []).append((bool_tag, bool_re))
    float_re = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
    for first in "-+0123456789":
        resolvers.setdefault(first, []).append((float_tag, float_re))
    return resolvers


_Loader.yaml_implicit_resolvers = _yaml12_resolvers()
_Dumper.yaml_implicit_resolvers = _yaml12_resolvers()


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Multi-line strings (the prompt template) read best as literal blocks.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)

# key path -> (mark of the key, mark of the value); paths use str keys and int list indices.
_Marks = dict[tuple[str | int, ...], tuple[Any, Any]]


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _dotted(path: Sequence[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


def _collect_marks(node: Any, path: tuple[str | int, ...], marks: _Marks, problems: list[str]) -> None:
    """Record where every key and value sits, and report duplicate keys (YAML keeps the last silently)."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            sub = (*path, key)
            if key in seen:
                problems.append(
                    f"{_dotted(sub)}: duplicate key [{_where(key_node.start_mark)}, first at "
                    f"{_where(seen[key])}]; fix: keep one"
                )
            seen[key] = key_node.start_mark
            marks[sub] = (key_node.start_mark, value_node.start_mark)
            _collect_marks(value_node, sub, marks, problems)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            marks[(*path, index)] = (item.start_mark, item.start_mark)
            _collect_marks(item, (*path, index), marks, problems)


def _parse_yaml(text: str, source: str) -> tuple[Any, _Marks]:
    """Parse YAML text; return (data, marks). Raises ConfigError with line and column."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return {}, {}
        marks: _Marks = {}
        problems: list[str] = []
        _collect_marks(node, (), marks, problems)
        if problems:
            raise ConfigError(problems, source=source)
        return loader.construct_document(node), marks
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" [{_where(mark)}]" if mark is not None else ""
        problem = exc.problem or exc.context or "malformed YAML"
        raise ConfigError(
            [f"malformed YAML: {problem}{where}; fix: check indentation, colons and quotes there"],
            source=source,
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"malformed YAML: {exc}; fix: check the file is YAML"], source=source) from None
    finally:
        loader.dispose()


def parse_yaml_value(text: str) -> Any:
    """Parse one ``--set`` value as a YAML scalar or flow collection (``8``, ``2e-4``, ``[a, b]``, ``null``).

    Raises:
        InputError: the value is not valid YAML.
    """
    try:
        return yaml.load(text, Loader=_Loader) if text.strip() else ""
    except yaml.YAMLError as exc:
        raise InputError(
            f"value {text!r} is not valid YAML: {exc}", fix="quote it, e.g. key='a: b'"
        ) from None


# --- schema walking ----------------------------------------------------------------------------


def _submodel(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _model_at(path: Sequence[str | int]) -> type[BaseModel] | None:
    """The section model at ``path`` in the schema, or None when ``path`` is not a section."""
    model: type[BaseModel] | None = ExperimentConfig
    for part in path:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        model = _submodel(model.model_fields[part].annotation)
    return model


def _check_key_path(parts: Sequence[str]) -> str | None:
    """None if ``parts`` names a settable key in the schema, else the problem (with did-you-mean)."""
    model: type[BaseModel] = ExperimentConfig
    for depth, part in enumerate(parts):
        fields = model.model_fields
        if part not in fields:
            where = _dotted(parts[:depth]) if depth else "the top level"
            return (
                f"no key {part!r} in {where}; fix: {_did_you_mean(part, list(fields))}"
                f"valid keys: {', '.join(fields)}"
            )
        annotation = fields[part].annotation
        sub = _submodel(annotation)
        rest = parts[depth + 1 :]
        if sub is not None:
            if not rest:
                example = f"{_dotted(parts)}.{next(iter(sub.model_fields))}"
                return f"{_dotted(parts)} is a section; fix: set one of its keys, e.g. {example}=..."
            model = sub
            continue
        if typing.get_origin(annotation) is dict and len(rest) <= 1:
            # A mapping field: its own key (e.g. seed.overrides.lora_init) is checked by validation.
            return None
        if rest:
            value = _dotted(parts[: depth + 1])
            return f"{value} is a value, not a section; fix: --set {value}=VALUE"
        return None
    return None


def _apply_overrides(
    data: dict[str, Any], overrides: Sequence[str], problems: list[str]
) -> set[tuple[str, ...]]:
    """Apply ``KEY.PATH=VALUE`` overrides to ``data`` in place; return the paths set."""
    applied: set[tuple[str, ...]] = set()
    for item in overrides:
        key, sep, raw = item.partition("=")
        parts = tuple(p.strip() for p in key.split("."))
        if not sep or not key.strip() or any(not p for p in parts):
            problems.append(f"--set {item!r}: expected KEY.PATH=VALUE; fix: e.g. --set train.max_steps=50")
            continue
        problem = _check_key_path(parts)
        if problem is not None:
            problems.append(f"--set {key}: {problem}")
            continue
        try:
            value = parse_yaml_value(raw)
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


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _format_error(error: Mapping[str, Any], marks: _Marks, overridden: set[tuple[str, ...]]) -> str:
    """One pydantic error as ``key.path: problem (got X) [line L, column C]; fix: ...``."""
    loc = tuple(error["loc"])
    kind = error["type"]
    message = str(error["msg"])
    if kind == "value_error":
        message = message.removeprefix("Value error, ")
        if message.startswith(_FIELD_TAG):
            field, _, message = message[len(_FIELD_TAG) :].partition("\x00")
            loc = (*loc, field)
        problem, _, fix = message.partition("; fix: ")
        got = ""
    else:
        problem = message[:1].lower() + message[1:]
        got = f" (got {_short(error.get('input'))})"
        fix = _TYPE_FIXES.get(kind, "see docs/config.md")
        ctx = error.get("ctx") or {}
        if kind == "extra_forbidden":
            problem = "unknown key"
            section = _model_at(loc[:-1])
            valid = list(section.model_fields) if section else []
            fix = f"{_did_you_mean(str(loc[-1]), valid)}remove it or use one of: {', '.join(valid)}"
        elif kind == "literal_error":
            fix = f"use one of {ctx.get('expected', '')}"
        elif kind in _BOUND_FIXES:
            bound = _BOUND_FIXES[kind]
            fix = f"use a value {_BOUND_WORDS[bound]} {ctx.get(bound)}"
    where = ""
    if loc[:1] and tuple(str(p) for p in loc if isinstance(p, str)) in overridden:
        where = " [from --set]"
    elif loc in marks:
        key_mark, value_mark = marks[loc]
        where = f" [{_where(key_mark if kind == 'extra_forbidden' else value_mark)}]"
    return f"{_dotted(loc)}: {problem}{got}{where}" + (f"; fix: {fix}" if fix else "")


# --- public API --------------------------------------------------------------------------------


def config_from_dict(
    data: Mapping[str, Any] | None,
    *,
    source: str = "<dict>",
    base_dir: str | Path | None = None,
    overrides: Sequence[str] = (),
    check_paths: bool = False,
    _marks: _Marks | None = None,
) -> ExperimentConfig:
    """Validate a config mapping into an :class:`ExperimentConfig`.

    Args:
        data: the parsed config (None = all defaults).
        source: where ``data`` came from, for messages.
        base_dir: directory that relative ``data.path``, ``split.manifest`` and local
            ``model.name`` paths resolve against; None leaves them as written.
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
    try:
        cfg = ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        problems.extend(_format_error(error, _marks or {}, overridden) for error in exc.errors())
        raise ConfigError(problems, source=source) from None
    if problems:
        raise ConfigError(problems, source=source)
    if base_dir is not None:
        cfg = _resolve_paths(cfg, Path(base_dir))
    if check_paths:
        problems.extend(_missing_paths(cfg))
        if problems:
            raise ConfigError(problems, source=source)
    return cfg


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Load, override and validate the YAML config at ``path``.

    Relative ``data.path``, ``split.manifest`` and local ``model.name`` resolve against the config
    file's directory, so the returned config holds absolute paths.

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
    if not file.is_file():
        raise InputError(f"config file {str(path)!r} not found", source=str(path), fix=_file_hint(file))
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(
            f"cannot read config file: {exc}", source=str(path), fix="pass a UTF-8 YAML file"
        ) from None
    data, marks = _parse_yaml(text, str(path))
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
        cfg.resolved(), Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False
    )
    return write_bytes_atomic(path, (header + body).encode("utf-8"))


@dataclass(frozen=True)
class ConfigKey:
    """One leaf key of the schema, for the reference in docs/config.md."""

    path: str
    type: str
    default: Any
    description: str


def config_keys() -> list[ConfigKey]:
    """Every leaf key of the config schema, in schema order."""
    keys: list[ConfigKey] = []
    defaults = ExperimentConfig().resolved()
    for section, section_field in ExperimentConfig.model_fields.items():
        model = _submodel(section_field.annotation)
        assert model is not None  # every top-level field is a section, by construction
        for name, field in model.model_fields.items():
            keys.append(
                ConfigKey(
                    f"{section}.{name}",
                    _type_name(field.annotation),
                    defaults[section][name],
                    field.description or "",
                )
            )
    return keys


def section_docs() -> dict[str, str]:
    """Section name -> the section's one-line description."""
    out = {}
    for section, field in ExperimentConfig.model_fields.items():
        model = _submodel(field.annotation)
        out[section] = (model.__doc__ or "").strip().splitlines()[0] if model else ""
    return out


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(repr(a) for a in args).replace("'", "")
    if origin is Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is tuple:
        return f"list[{_type_name(args[0])}]"
    if origin is dict:
        return f"mapping[{_type_name(args[0])}, {_type_name(args[1])}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def _looks_like_path(name: str, base_dir: Path) -> bool:
    return name.startswith(("/", "./", "../", "~")) or (base_dir / name).is_dir()


def _resolve_paths(cfg: ExperimentConfig, base_dir: Path) -> ExperimentConfig:
    """Make relative data, manifest and local model paths absolute against ``base_dir``."""

    def resolve(value: str) -> str:
        return str((base_dir / Path(value).expanduser()).resolve())

    data, split, model = cfg.data, cfg.split, cfg.model
    if not data.path.startswith(BUILTIN_PREFIX):
        data = data.model_copy(update={"path": resolve(data.path)})
    if split.manifest is not None:
        split = split.model_copy(update={"manifest": resolve(split.manifest)})
    if not model.name.startswith(BUILTIN_PREFIX) and _looks_like_path(model.name, base_dir):
        model = model.model_copy(update={"name": resolve(model.name)})
    return cfg.model_copy(update={"data": data, "split": split, "model": model})


def _missing_paths(cfg: ExperimentConfig) -> list[str]:
    problems = []
    if not cfg.data.path.startswith(BUILTIN_PREFIX) and not Path(cfg.data.path).is_file():
        problems.append(
            f"data.path: file not found (got {cfg.data.path!r}); fix: {_file_hint(Path(cfg.data.path))}"
        )
    if cfg.split.manifest is not None and not Path(cfg.split.manifest).is_file():
        problems.append(
            f"split.manifest: file not found (got {cfg.split.manifest!r}); "
            f"fix: {_file_hint(Path(cfg.split.manifest))}"
        )
    if Path(cfg.model.name).is_absolute() and not Path(cfg.model.name).is_dir():
        problems.append(
            f"model.name: local model directory not found (got {cfg.model.name!r}); "
            "fix: point it at a directory with config.json and weights, or use a hub id"
        )
    return problems


def _file_hint(path: Path) -> str:
    """'did you mean' among the siblings of a missing file, else a generic hint."""
    parent = path.parent if path.parent.is_dir() else None
    if parent is not None:
        close = difflib.get_close_matches(path.name, [p.name for p in parent.iterdir()], n=1, cutoff=0.6)
        if close:
            return f"did you mean {str(parent / close[0])!r}?"
    return "check the path (relative paths in a config resolve against the config file's directory)"
