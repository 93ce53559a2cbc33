"""The record sections of a Trainer-made run: config, seeds, model, LoRA, data and trainer.

The record has the sections ``reprotune run`` writes (docs/run-directory.md), filled from what the
Trainer holds, so that ``compare`` reads it unchanged:

- ``config``: what defines the experiment, as a reprotune config does: ``trainer`` (the trainer's
  class and its ``TrainingArguments`` without :data:`PLACE_ARGS`, the settings that only name
  places or displays), ``model.name`` and ``lora`` (the PEFT config). ``config_sha256`` is the
  sha256 of its canonical compact JSON.
- ``seeds``: ``root`` is ``TrainingArguments.seed`` (the Trainer seeds everything from it);
  ``data_order`` is the seed the train sampler actually used (``data_seed``, else ``seed``, plus a
  negative control's perturbation).
- ``model``, ``lora``, ``data``: file hashes of the base model, the adapter's config, content
  hashes of the rows the Trainer sees and the split manifest when there is one.
- ``trainer``: every ``TrainingArguments`` field and the seeds and determinism in force.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from reprotune._config.secrets import mask_data
from reprotune._data.loaders import table_from_dataset
from reprotune._data.manifest import Manifest
from reprotune._data.row_hashes import RowHashes
from reprotune._data.table import canonical_value, row_sha256
from reprotune._determinism.flags import precision_flags
from reprotune._determinism.seeds import last_seeding
from reprotune._errors import InputError
from reprotune._jsonio import canonical_sha256, json_safe
from reprotune._model.identity import config_file_names, files_sha256, tokenizer_file_names, weight_file_names
from reprotune._model.lora import buffer_hashes, lora_config_dict, lora_defaults
from reprotune._model.rope_keys import rope_misread
from reprotune._run import layout
from reprotune._run.fingerprint import CodeInfo, attention_of, code_fingerprint, environment_fingerprint
from reprotune.integrations.controls import UNRECORDED_VARIABLES, Controls

#: TrainingArguments that name where things go or how they are shown, never what is computed:
#: in the record's ``trainer.args``, left out of ``config`` (so two legs of a verification, which
#: write to different places, have the same config).
PLACE_ARGS: tuple[str, ...] = (
    "disable_tqdm",
    "hub_token",
    "log_level",
    "log_level_replica",
    "logging_dir",
    "output_dir",
    "project",
    "push_to_hub_token",
    "report_to",
    "resume_from_checkpoint",
    "run_name",
    "trackio_bucket_id",
    "trackio_space_id",
    "trackio_static_space_id",
)


def training_args(args: Any) -> dict[str, Any]:
    """Every ``TrainingArguments`` field, JSON-safe (``to_dict`` masks the hub token)."""
    result: dict[str, Any] = json_safe(args.to_dict())
    return result


def run_config(trainer: Any, args: Mapping[str, Any], model_name: str | None, lora: Any) -> dict[str, Any]:
    """The ``config`` of a Trainer-made run (see the module docstring). With
    ``auto_find_batch_size`` it also holds the batch size the Trainer found (``train_batch_size``)
    when that is smaller than the arguments' (it ran out of memory): another machine may find
    another, and the run computes with it."""
    cls = type(trainer)
    section: dict[str, Any] = {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        # masked as the rest of the record is (a TRL config's model_init_kwargs may hold a token):
        # a Trainer's arguments never passed the config file's check for secrets
        "args": {k: mask_data(v) for k, v in sorted(args.items()) if k not in PLACE_ARGS},
    }
    found = getattr(trainer, "_train_batch_size", None)
    if args.get("auto_find_batch_size") and found != getattr(trainer.args, "train_batch_size", found):
        section["train_batch_size"] = found
    return {"trainer": section, "model": {"name": model_name}, "lora": lora}


def config_sha256(config: Mapping[str, Any]) -> str:
    """sha256 of the canonical compact JSON of ``config``."""
    return canonical_sha256(dict(config))


def run_seeds(args: Any, sampler_seed: int | None) -> dict[str, int]:
    """``root``: TrainingArguments.seed; ``data_order``: the seed the train sampler used."""
    seeds = {"root": int(args.seed)}
    if sampler_seed is not None:
        seeds["data_order"] = int(sampler_seed)
    return seeds


def base_model_of(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (or the model itself)."""
    getter = getattr(model, "get_base_model", None)
    return getter() if callable(getter) else model


def lora_section(model: Any) -> dict[str, Any] | None:
    """The PEFT config of a ``PeftModel`` as the record keeps it, else None."""
    return _of_active_adapter(lora_config_dict, model)


def lora_defaults_section(model: Any) -> dict[str, Any] | None:
    """The defaults of a ``PeftModel``'s LoRA config class (``lora_defaults``), else None."""
    return _of_active_adapter(lora_defaults, model)


def _of_active_adapter(read: Callable[..., dict[str, Any]], model: Any) -> dict[str, Any] | None:
    """``read(model, adapter_name=...)`` for the active adapter of a ``PeftModel``, else None."""
    if getattr(model, "peft_config", None) is None:
        return None
    try:
        return read(model, adapter_name=getattr(model, "active_adapter", "default"))
    except (KeyError, TypeError):
        return read(model)


def _model_directory(name: str | None, commit: str | None) -> Path | None:
    """The directory holding the model's files: a local path, or its snapshot in the HF cache."""
    if not name:
        return None
    path = Path(name).expanduser()
    if path.is_dir():
        return path.resolve()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, revision=commit, local_files_only=True))
    except Exception:  # not a hub id, or not in the local cache: the model stays unhashed
        return None


def model_section(model: Any, processing_class: Any) -> dict[str, Any]:
    """The base model's identity: where it came from and the sha256 of its files.

    ``weights_sha256``, ``tokenizer_sha256`` and ``config_sha256`` are None when the files cannot
    be found (a model made in memory, or a hub id not in the local cache).
    """
    base = base_model_of(model)
    config = getattr(base, "config", None)
    name = getattr(config, "_name_or_path", None) or getattr(base, "name_or_path", None)
    commit = getattr(config, "_commit_hash", None)
    directory = _model_directory(name, commit)
    tokenizer_name = getattr(processing_class, "name_or_path", None) or name
    tokenizer_dir = _model_directory(tokenizer_name, None)
    section: dict[str, Any] = {
        "source": name,
        "revision": commit,
        "resolved_path": str(directory) if directory else None,
        "weights_sha256": None,
        "tokenizer_sha256": None,
        "config_sha256": None,
    }
    if directory is not None:
        # No weight files there (a model saved elsewhere): left unhashed, said by a finding.
        with contextlib.suppress(InputError):
            section["weights_sha256"], section["weights_files"] = files_sha256(
                directory, weight_file_names(directory)
            )
        section["config_sha256"], section["config_files"] = files_sha256(
            directory, config_file_names(directory)
        )
    if tokenizer_dir is not None:
        section["tokenizer_sha256"], section["tokenizer_files"] = files_sha256(
            tokenizer_dir, tokenizer_file_names(tokenizer_dir)
        )
    parameter = next(iter(base.parameters()), None) if hasattr(base, "parameters") else None
    section["dtype"] = str(parameter.dtype).removeprefix("torch.") if parameter is not None else None
    section["pad_token_id"] = getattr(config, "pad_token_id", None)
    if isinstance(base, torch.nn.Module):
        section["buffers"] = buffer_hashes(base)
    return section


def config_misread(model: Any, model_info: Mapping[str, Any]) -> tuple[str, str] | None:
    """What the installed transformers computes otherwise than the base model's ``config.json``
    (found by :func:`model_section`) gives, and the fix; None where it reads it as written."""
    directory = model_info.get("resolved_path")
    config = getattr(base_model_of(model), "config", None)
    if directory is None or config is None or not (Path(directory) / "config.json").is_file():
        return None
    return rope_misread(Path(directory) / "config.json", config)


def rows_sha256(dataset: Any) -> tuple[int | None, str | None]:
    """``(rows, sha256)`` of a dataset's rows as the Trainer indexes them.

    The sha256 is that of the row-hash encoding of docs/manifest.md over one sha256 per row
    (canonical JSON of the row), so a ``datasets.Dataset`` and the same rows in a list give the same
    digest. ``(None, None)`` for a dataset without a length; the digest is None when a row holds a
    value with no canonical form.
    """
    if dataset is None:
        return None, None
    try:
        n_rows = len(dataset)
    except TypeError:
        return None, None
    if hasattr(dataset, "with_format") and hasattr(dataset, "column_names"):
        try:
            return n_rows, table_from_dataset(dataset).row_hash_table().sha256()
        except (TypeError, ValueError):
            return n_rows, None
    try:
        hexes = [row_sha256(_canonical_row(dataset[i])) for i in range(n_rows)]
    except (TypeError, ValueError, KeyError, IndexError, NotImplementedError):
        return n_rows, None  # (an iterable dataset with a length has no rows by index)
    return n_rows, RowHashes.from_hex(hexes).sha256()


def _canonical_row(row: Any) -> dict[str, Any]:
    if not isinstance(row, Mapping):
        row = {"value": row}
    return {str(k): canonical_value(v.tolist() if hasattr(v, "tolist") else v) for k, v in row.items()}


def eval_sets(eval_dataset: Any) -> dict[str, Any]:
    """The Trainer's eval datasets by the name its metrics carry: ``""`` for one dataset
    (``eval_loss``), each name of a dict of them (``eval_{name}_loss``), in its order."""
    if isinstance(eval_dataset, Mapping):
        return {str(name): dataset for name, dataset in eval_dataset.items()}
    return {} if eval_dataset is None else {"": eval_dataset}


def is_eval_loss(key: str) -> bool:
    """An eval loss the Trainer logs: ``eval_loss``, or ``eval_{name}_loss`` of a dict of sets."""
    return key == "eval_loss" or (key.startswith("eval_") and key.endswith("_loss"))


def eval_loss(metrics: Mapping[str, Any], eval_dataset: Any) -> tuple[float, int, str | None] | None:
    """The validation loss one ``on_evaluate`` reports, how many rows it covers and the name of
    its set in a dict of them (None for one eval dataset; the Trainer evaluates a dict one set at
    a time, each under its name); None: no loss there."""
    for name, dataset in eval_sets(eval_dataset).items():
        loss = metrics.get(f"eval_{name}_loss" if name else "eval_loss")  # an is_eval_loss key
        if isinstance(loss, int | float) and not isinstance(loss, bool):
            return float(loss), len(dataset) if hasattr(dataset, "__len__") else 0, name or None
    return None


def _eval_rows_sha256(eval_dataset: Any) -> tuple[int | None, str | None]:
    """:func:`rows_sha256` of the eval dataset; of a dict of them, the rows of all and the sha256
    of each set's digest by name."""
    if not isinstance(eval_dataset, Mapping):
        return rows_sha256(eval_dataset)
    each = {name: rows_sha256(dataset) for name, dataset in eval_sets(eval_dataset).items()}
    counts, digests = [n for n, _ in each.values()], {name: sha for name, (_, sha) in each.items()}
    rows = sum(n for n in counts if n is not None) if None not in counts else None
    return rows, canonical_sha256(digests) if None not in digests.values() else None


def data_section(
    train_dataset: Any, eval_dataset: Any, manifest: Manifest | None, manifest_sha256: str | None
) -> dict[str, Any]:
    """The data a Trainer-made run trained on: content hashes of the rows it sees, the manifest."""
    n_train, train_sha = rows_sha256(train_dataset)
    n_eval, eval_sha = _eval_rows_sha256(eval_dataset)
    section: dict[str, Any] = {
        "source": manifest.dataset_source if manifest else type(train_dataset).__name__,
        "file_sha256": manifest.dataset_sha256 if manifest else None,
        "n_rows": manifest.n_rows if manifest else n_train,
        "manifest_sha256": manifest_sha256,
        "manifest_file": layout.MANIFEST if manifest else None,
        "split_sizes": dict(manifest.sizes) if manifest else {},
        "train_rows": n_train,
        "train_rows_sha256": train_sha,
        "eval_rows": n_eval,
        "eval_rows_sha256": eval_sha,
    }
    if isinstance(eval_dataset, Mapping):  # the names of a dict's sets, in the order of its val lines
        section["eval_sets"] = list(eval_sets(eval_dataset))
    return section


def script_dir() -> Path:
    """The directory of the script being run (``__main__``), else the current directory."""
    import __main__

    main_file = getattr(__main__, "__file__", None)
    return Path(main_file).resolve().parent if main_file else Path.cwd()


def trainer_section(
    trainer: Any,
    args: Any,
    args_dict: dict[str, Any],
    max_steps: int,
    sampler: Any,
    sampler_seed: int | None,
    *,
    integration: str,
    controls: Controls,
    steps_per_epoch: int | None,
    rows_recorded: bool,
    ranks: list[dict[str, Any]],
) -> dict[str, Any]:
    """The record's ``trainer`` section: the class, its arguments, seeds and sampler, the
    verification controls in force, and every rank's identity."""
    cls = type(trainer)
    return {
        "integration": integration,
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "args": args_dict,
        "seed": args.seed,
        "data_seed": args.data_seed,
        "sampler": type(sampler).__name__ if sampler is not None else None,
        "sampler_seed": sampler_seed,
        "perturb_data_seed": controls.perturb_data_seed,
        "full_determinism": bool(args.full_determinism),
        "seed_everything": last_seeding(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "max_steps": max_steps,
        "steps_per_epoch": steps_per_epoch,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "stop_after": controls.stop_after,
        "rows_recorded": rows_recorded,
        "ranks": ranks,
    }


def script_outputs(args: Any, run_dir: Path | None) -> list[str | Path]:
    """What a Trainer run writes, none of it code: the run directory, ``output_dir``, and where the
    Trainer's own reporters write beside the script, when it reports to them: W&B's ``wandb/`` (in
    ``WANDB_DIR``, else the current directory) and TensorBoard's logs (``TENSORBOARD_LOGGING_DIR``;
    4.x's ``logging_dir``). Other reporters write into ``output_dir`` or an MLflow store (left out
    by default)."""
    reporters = getattr(args, "report_to", None) or []
    places: list[str | Path | None] = [run_dir, args.output_dir]
    if "wandb" in reporters:
        places.append(Path(os.environ.get("WANDB_DIR") or ".") / "wandb")
    if "tensorboard" in reporters:
        places += [os.environ.get("TENSORBOARD_LOGGING_DIR"), getattr(args, "logging_dir", None)]
    return [p for p in places if p]


def code_and_environment(
    code_dir: Path, outputs: list[str | Path], model: Any
) -> tuple[CodeInfo, dict[str, Any]]:
    """The script's code (git state, the run's own ``outputs`` left out) and the environment (the
    variables that only steer ``verify`` and ``trace`` left out)."""
    code = code_fingerprint(code_dir, outputs=outputs)
    variables = {k: v for k, v in os.environ.items() if k not in UNRECORDED_VARIABLES}
    return code, environment_fingerprint(variables, attention=attention_of(model))


def tf32_matmul() -> bool:
    """Whether TF32 matmuls are on for CUDA (False without CUDA), read through
    ``precision_flags``: torch >= 2.9 refuses to read the legacy flag once its fp32_precision
    settings contradict it, as transformers' ``tf32`` argument sets them."""
    return torch.cuda.is_available() and bool(precision_flags()["matmul_allow_tf32"])
