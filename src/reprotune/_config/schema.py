"""The experiment config's schema: typed, frozen sections with their defaults and checks.

Sections ``seed``, ``data``, ``split``, ``model``, ``lora``, ``train``, ``eval``, ``determinism``,
``tracking`` and ``distributed``; every field has a default, a type, a range and a one-line
description (the reference in docs/config.md is generated from them). :func:`config_sha256` is a
config's identity. Reading YAML and ``--set`` is in ``_config.loading``. Importing this module
never imports torch.

This module is over 400 lines on purpose: it is the config's one schema, every section a small
class next to the others, so that every key, default, range and description is read in one place.

Over 400 lines on purpose: the one owner of the config's format, every section with its fields,
defaults and ranges in one place, so that what is accepted and the generated reference cannot
drift apart.
"""

from __future__ import annotations

import difflib
import math
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from reprotune._builtins import BUILTIN_DATA, BUILTIN_MODELS, BUILTIN_PREFIX
from reprotune._config.secrets import mask_config
from reprotune._determinism.isa import CpuIsa
from reprotune._determinism.seeds import CONSUMERS, SEED_LIMIT
from reprotune._jsonio import canonical_sha256

# Strict scalar types: YAML gives real types, so a quoted "8" or a bool where a number belongs is
# a mistake to report, not to coerce. Floats accept ints (``alpha: 16``).
Int = Annotated[int, Field(strict=True)]
Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Bool = Annotated[bool, Field(strict=True)]
Str = Annotated[str, Field(strict=True)]

# A validator's message starting with this tag names the field it is about, so the error
# points at ``train.epochs`` instead of the whole ``train`` section.
FIELD_TAG = "\x00field:"


def _field_error(field: str, message: str) -> ValueError:
    return ValueError(f"{FIELD_TAG}{field}\x00{message}")


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
        bad = []  # every bad entry at once, each with its own hint; one fix for all
        for name, seed in value.items():
            if name not in CONSUMERS:
                hint = did_you_mean(name, CONSUMERS).strip()
                bad.append(f"unknown seed consumer {name!r}" + (f" ({hint})" if hint else ""))
            elif not 0 <= seed < SEED_LIMIT:
                bad.append(f"seed for {name!r} must be in [0, 2**63) (got {seed})")
        if bad:
            raise ValueError(
                f"{'; '.join(bad)}; fix: use consumers {', '.join(CONSUMERS)}, seeds in [0, 2**63)"
            )
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
        description="path to an existing split manifest; when set, the options below are ignored. The "
        "data must hold its rows: the same file, or the same rows reformatted (key order, line endings, "
        "format)",
    )
    ratios: tuple[Float, ...] = Field(
        default=(0.8, 0.1, 0.1),
        description="train, validation, test fractions summing to 1, train and validation > 0 (a run "
        "trains and validates; `reprotune split --ratios` alone also takes 0 for them)",
    )
    stratify_by: Str | None = Field(
        default=None, description="column whose class proportions each split keeps"
    )
    group_by: Str | None = Field(
        default=None,
        description="column whose groups never straddle two splits (not with `split.stratify_by`)",
    )
    rare_class_policy: Literal["train", "drop", "error"] = Field(
        default="train",
        description="what to do with a class too small to appear in every split (`train` is refused when "
        "`split.ratios` give train nothing)",
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

    @model_validator(mode="after")
    def _one_strategy(self) -> SplitConfig:
        if self.stratify_by is not None and self.group_by is not None:
            raise _field_error(
                "group_by",
                f"stratify_by ({self.stratify_by!r}) and group_by ({self.group_by!r}) are both set; a "
                "split keeps classes or groups together, not both; fix: keep one and set the other to null",
            )
        return self


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
    world_size_invariant: Bool = Field(
        default=False,
        description="under torchrun: keep each micro-batch's LoRA gradient apart, gather them and add "
        "them in global micro-batch order, so that world sizes 1, 2, 4 ... give the same bits "
        "(docs/distributed.md); a plain run ignores it",
    )

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
    """Validation during training, and generation by ``reprotune eval`` (docs/eval.md)."""

    batch_size: Int = Field(default=8, ge=1, description="rows per validation batch")
    max_rows: Int | None = Field(
        default=None, ge=1, description="cap the validation rows (sampled with the eval seed); null = all"
    )
    decoding: Literal["greedy", "sample"] = Field(
        default="greedy",
        description="how `reprotune eval` picks each token: greedy = the most likely; sample = seeded "
        "sampling (temperature, top_k, top_p), one generator per row seeded from the eval seed",
    )
    temperature: Float = Field(
        default=1.0, gt=0, le=10, description="sampling temperature, in (0, 10]; decoding: sample only"
    )
    top_k: Int = Field(
        default=0,
        ge=0,
        description="sample from the k most likely tokens only; 0 = no limit; decoding: sample only",
    )
    top_p: Float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="sample from the smallest set of most likely tokens whose probability reaches p, "
        "in (0, 1]; 1 = no limit; decoding: sample only",
    )
    max_new_tokens: Int = Field(
        default=64, ge=1, le=4096, description="most tokens generated per row; a row stops at its first eos"
    )
    generate_batch_size: Int = Field(
        default=8, ge=1, description="rows per generation batch (`reprotune eval --batch-size`)"
    )
    generate_max_rows: Int | None = Field(
        default=None,
        ge=1,
        description=(
            "evaluate N rows of the split, drawn with the eval seed "
            "(seed.overrides.eval) and kept in manifest order (docs/eval.md); null = all"
        ),
    )
    generate_at_end: Bool = Field(
        default=False,
        description="after a completed `reprotune run`, evaluate on the test split (RUN_DIR/evals/) and "
        "log test/<metric> to the run's MLflow run",
    )

    @model_validator(mode="after")
    def _sampling_settings_need_sampling(self) -> EvalConfig:
        if self.decoding == "greedy":
            for name, default in (("temperature", 1.0), ("top_k", 0), ("top_p", 1.0)):
                value = getattr(self, name)
                if value != default:
                    raise _field_error(
                        name,
                        f"has no effect with eval.decoding: greedy (got {value!r}); fix: set "
                        f"eval.decoding: sample, or leave eval.{name} at {default}",
                    )
        return self


class DeterminismConfig(_Section):
    """How hard torch is held to deterministic computation."""

    mode: Literal["strict", "warn", "off"] = Field(
        default="strict",
        description="strict = raise on nondeterministic ops; warn = warn; off = torch defaults",
    )
    threads: Int | None = Field(
        default=2, ge=1, le=1024, description="torch intra-op threads (1 to 1024); null = leave unpinned"
    )
    device: Literal["cpu", "cuda", "auto"] = Field(
        default="cpu", description="compute device; auto = cuda if present"
    )
    cpu_isa: CpuIsa = Field(
        default="native",
        description="CPU kernels: native = the best this CPU has; avx2 / avx512 = every kernel knob "
        "(ATen capability, MKL code path and CNR mode, oneDNN ISA) pinned to that baseline, so that "
        "runs reproduce bit for bit on any Intel x86-64 CPU that has it (MKL takes these branches on "
        "Intel only); avx2-amd = the same on AMD CPUs (MKL's own AMD code path, AUTO,STRICT), so "
        "that runs reproduce on any AMD CPU with AVX2; avx2-compatible = ATen and oneDNN on AVX2 with "
        "MKL's vendor-neutral COMPATIBLE branch and AdamW fused: the same bits on Intel and AMD CPUs with "
        "AVX2, slower (docs/microscope.md)",
    )


class DistributedConfig(_Section):
    """Runs under torchrun (docs/distributed.md); ignored by a plain single-process run."""

    strategy: Literal["ddp", "fsdp"] = Field(
        default="ddp",
        description="ddp = replicated model, gradients all-reduced; fsdp = FSDP2 fully_shard over "
        "the decoder layers, LoRA weights sharded with them",
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        default="auto", description="process-group backend; auto = nccl on CUDA, gloo on CPU"
    )
    timeout_s: Float = Field(
        default=1800.0, gt=0, description="seconds a collective waits for the other ranks before failing"
    )


class TrackingConfig(_Section):
    """Trackers: observers that mirror the record."""

    mlflow: Bool = Field(default=True, description="log params, metrics and artifacts to MLflow")
    wandb: Bool = Field(
        default=False,
        description="also mirror to Weights & Biases, offline unless WANDB_MODE says otherwise "
        "(project: tracking.experiment, with / \\ # ? % : made dashes; needs the reprotune[wandb] extra)",
    )
    uri: Str = Field(
        default="sqlite:///mlflow.db",
        min_length=1,
        description="tracking URI; relative sqlite paths resolve against the current directory",
    )
    artifact_location: Str = Field(
        default="mlartifacts",
        min_length=1,
        description="where MLflow stores artifacts (a new experiment's: one that exists keeps its own; "
        "the record's trackers.mlflow.artifact_uri says where they went)",
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
    distributed: DistributedConfig = Field(default=DistributedConfig(), description="distributed runs")
    config_dir: Str | None = Field(
        default=None,
        description="the directory relative data.path, split.manifest and local model.name paths "
        "resolve against: set by load_config to the config file's directory (absolute; written into "
        "the record and config.yaml copies so they resolve the same); not part of the config's "
        "identity (config_sha256), so a moved project keeps its hash",
    )

    def resolve_paths(self) -> ExperimentConfig:
        """A copy with relative data, manifest and local model paths made absolute against
        :attr:`config_dir` (or the current directory when it is None): what a run opens."""
        base = Path(self.config_dir) if self.config_dir is not None else Path.cwd()

        def absolute(value: str) -> str:
            return str((base / Path(value).expanduser()).resolve())

        data, split, model = self.data, self.split, self.model
        if not data.path.startswith(BUILTIN_PREFIX):
            data = data.model_copy(update={"path": absolute(data.path)})
        if split.manifest is not None:
            split = split.model_copy(update={"manifest": absolute(split.manifest)})
        name = model.name
        if not name.startswith(BUILTIN_PREFIX) and (
            name.startswith(("/", "./", "../", "~")) or (base / name).is_dir()
        ):
            model = model.model_copy(update={"name": absolute(name)})
        return self.model_copy(update={"data": data, "split": split, "model": model})

    def resolved(self) -> dict[str, Any]:
        """The config with every default written out, as JSON-safe data (lists, not tuples).

        URL user-info is masked (``http://***:***@host``): this is what the record, ``config.yaml``,
        the trackers' params and :func:`config_sha256` are made from, so a credential in a URL
        stays in memory (``cfg.tracking.uri``), for the connection only.
        """
        resolved: dict[str, Any] = mask_config(self.model_dump(mode="json"))
        return resolved


#: Keys added after configs were first recorded, with the default that means what their absence
#: meant: left out of a config's identity while at it (so a config keeps the hash older reprotune
#: gave it), and not a difference between an older record without the key and a newer one at it.
NEUTRAL_DEFAULTS: dict[str, Any] = {"determinism.cpu_isa": "native", "train.world_size_invariant": False}


def config_sha256(cfg: ExperimentConfig) -> str:
    """sha256 of the canonical compact JSON of ``cfg.resolved()`` without ``config_dir``: the
    config's identity, the same wherever the project lives (paths stay as the config writes them),
    and without the keys of :data:`NEUTRAL_DEFAULTS` while at their default."""
    identity = {key: value for key, value in cfg.resolved().items() if key != "config_dir"}
    for dotted, default in NEUTRAL_DEFAULTS.items():
        section, key = dotted.split(".")
        if identity.get(section, {}).get(key) == default:
            identity[section] = {k: v for k, v in identity[section].items() if k != key}
    return canonical_sha256(identity)


def _check_builtin(value: str, known: tuple[str, ...]) -> str:
    if value.startswith(BUILTIN_PREFIX):
        name = value[len(BUILTIN_PREFIX) :]
        if name not in known:
            raise ValueError(
                f"unknown builtin {name!r} (got {value!r}); fix: {did_you_mean(name, known)}"
                f"known: {', '.join(BUILTIN_PREFIX + k for k in known)}"
            )
    return value


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """``"did you mean 'x'? "`` for the closest of ``choices``, or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


# --- schema walking ----------------------------------------------------------------------------


def submodel(annotation: Any) -> type[BaseModel] | None:
    """The section model an annotation names, or None when it is a plain value."""
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def model_at(path: Sequence[str | int]) -> type[BaseModel] | None:
    """The section model at ``path`` in the schema, or None when ``path`` is not a section."""
    model: type[BaseModel] | None = ExperimentConfig
    for part in path:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        model = submodel(model.model_fields[part].annotation)
    return model


def dotted(path: Sequence[str | int]) -> str:
    """A key path as people write it: ``train.lr``, ``lora.target_modules[1]``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"
