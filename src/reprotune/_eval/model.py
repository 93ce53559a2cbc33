"""The model an eval generates with: the run's base model, verified file by file against the
record, and its adapter unmerged, with the ``rowwise`` attention and no generation defaults of
its own.

- Weights and config files (``config.json``, ``generation_config.json``, custom code) that differ
  from the record are refused: that would be another model.
- Tokenizer files that differ are refused too, naming both hashes and the files, unless the
  caller allows it (``--allow-tokenizer-change``); the eval record then says so. The same
  tokenizer for training and evaluation is the rule.
- The adapter is loaded as trained, not merged: merging changes the logits' last bits.
- Its linear layers compute in fixed blocks of rows probed on this machine, and whether a row's
  logits then depend on its batch is checked before the eval may claim they do not
  (``_eval.invariance``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprotune._config.schema import ExperimentConfig
from reprotune._errors import InputError
from reprotune._eval.decode import ROWWISE, register_rowwise_attention
from reprotune._eval.invariance import Invariance, make_batch_invariant
from reprotune._model.loading import load_base_model
from reprotune._model.positions import refuse_past_the_model


@dataclass(frozen=True)
class EvalModel:
    """A model ready to generate, and what the eval record keeps about it.

    Attributes:
        model: the base model (with the adapter unmerged, unless base-only), in eval mode.
        tokenizer: its tokenizer.
        info: ``LoadedModel.info`` of the base model (hashes, files, pad token).
        tokenizer_check: ``recorded_sha256``, ``sha256``, ``changed_files`` and ``allowed``.
        eos_token_ids: the ids that end a row.
        attention: the attention implementation in force.
        invariance: whether rows are shown independent of their batch here, with the evidence.
    """

    model: Any
    tokenizer: Any
    info: Mapping[str, Any]
    tokenizer_check: Mapping[str, Any]
    eos_token_ids: tuple[int, ...]
    attention: str
    invariance: Invariance


def load_eval_model(
    cfg: ExperimentConfig,
    recorded: Mapping[str, Any],
    adapter_dir: Path | None,
    *,
    device: str,
    allow_tokenizer_change: bool,
    record_path: Path,
) -> EvalModel:
    """Load the run's base model (and adapter) for generation, checked against ``recorded``.

    Args:
        cfg: the run's config (``model`` section).
        recorded: the record's ``model`` section.
        adapter_dir: the run's ``adapter/``; None evaluates the base model alone.
        device: where to generate.
        allow_tokenizer_change: go on when the tokenizer files differ from the record.
        record_path: the run's ``record.json``, for messages.

    Raises:
        InputError: the weights or config files differ from the record, or the tokenizer files
            do without ``allow_tokenizer_change``.
    """
    _refuse_moved_model(cfg.model.name, recorded)
    loaded = load_base_model(
        cfg.model.name,
        revision=cfg.model.revision,
        dtype=cfg.model.dtype,
        pad_token_id=cfg.model.pad_token_id,
        padding_side="left",
        device=device,
    )
    info = loaded.info
    for part in ("weights", "config"):
        _refuse_changed(part, recorded, info, record_path)
    tokenizer_check = _tokenizer_check(recorded, info, allow_tokenizer_change, record_path)
    model = loaded.model
    refuse_past_the_model(model.config, cfg.model.max_length, cfg.eval.max_new_tokens)
    model.set_attn_implementation(register_rowwise_attention())
    # A model whose attention does not go through transformers' AttentionInterface keeps its own:
    # recorded as it is, and the eval then claims no batch invariance.
    attention = str(getattr(model.config, "_attn_implementation", None))
    model.config.use_cache = True
    eos = _eos_token_ids(model, loaded.tokenizer)
    from transformers import GenerationConfig

    # The eval passes its generation config whole; the model's own generation_config.json (its
    # sampling defaults, penalties) must not fill in what the eval leaves unset.
    model.generation_config = GenerationConfig(eos_token_id=list(eos), pad_token_id=int(info["pad_token_id"]))
    if adapter_dir is not None:
        from peft import PeftModel

        with warnings.catch_warnings():
            # PEFT asks transformers a deprecated question while loading (a FutureWarning about
            # is_gradient_checkpointing): noise for the user, nothing about the eval.
            warnings.simplefilter("ignore", FutureWarning)
            model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=False)
    model.eval()
    invariance = make_batch_invariant(
        model,
        device=device,
        attention=attention,
        rowwise=ROWWISE,
        eos_token_ids=eos,
        pad_token_id=int(info["pad_token_id"]),
        vocab_size=int(loaded.model.config.vocab_size),
    )
    return EvalModel(model, loaded.tokenizer, info, tokenizer_check, eos, attention, invariance)


def _refuse_moved_model(name: str, recorded: Mapping[str, Any]) -> None:
    """A run trained on a local model directory that is no longer there (``name``, the run's
    model.name resolved as the run's data is, absolute when the directory exists): say to put it
    back (the loader would look the name up as a hub id, and say to download one)."""
    if recorded.get("kind") == "local" and not (Path(name).is_absolute() and Path(name).is_dir()):
        source = recorded.get("source")
        raise InputError(
            f"the run's base model directory is no longer there ({source} when the run trained)",
            source="record.json: config.model.name",
            fix=f"put the model the run trained on back at {source}, or beside the project as "
            f"model.name {name!r} says (weights sha256 {recorded.get('weights_sha256')}); an eval "
            "loads the run's own base model",
        )


def _files_diff(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    names = sorted(set(old) | set(new))
    return [
        f"{n} ({'absent' if n not in old else old[n][:12] + '...'} -> "
        f"{'absent' if n not in new else new[n][:12] + '...'})"
        for n in names
        if old.get(n) != new.get(n)
    ]


def _refuse_changed(
    part: str, recorded: Mapping[str, Any], info: Mapping[str, Any], record_path: Path
) -> None:
    was = recorded.get(f"{part}_sha256")
    if was is None or was == info.get(f"{part}_sha256"):
        return  # records older than the config hash do not name config files
    files = _files_diff(recorded.get(f"{part}_files") or {}, info.get(f"{part}_files") or {})
    raise InputError(
        f"the base model's {part} files are not those the run was trained from: recorded sha256 {was}, "
        f"now {info.get(f'{part}_sha256')}" + (f"; differing files: {', '.join(files)}" if files else ""),
        source=f"{record_path} (model.{part}_sha256) vs {info.get('resolved_path')}",
        fix="restore the base model the run recorded (model.resolved_path, model.revision in record.json)",
    )


def _tokenizer_check(
    recorded: Mapping[str, Any], info: Mapping[str, Any], allow: bool, record_path: Path
) -> dict[str, Any]:
    was, now = recorded.get("tokenizer_sha256"), info.get("tokenizer_sha256")
    files = _files_diff(recorded.get("tokenizer_files") or {}, info.get("tokenizer_files") or {})
    check = {"recorded_sha256": was, "sha256": now, "changed_files": files, "allowed": False}
    if was is None or was == now:
        return check
    if not allow:
        raise InputError(
            f"the tokenizer differs from the one the run was trained with: recorded sha256 {was}, "
            f"now {now}; differing files: {', '.join(files) or '(none listed in the record)'}",
            source=f"{record_path} (model.tokenizer_sha256) vs {info.get('resolved_path')}",
            fix="restore the run's tokenizer files; or, knowing the scores then measure another "
            "tokenizer, pass --allow-tokenizer-change (the eval record says so)",
        )
    return {**check, "allowed": True}


def _eos_token_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """The ids that end a response: the model's generation eos ids, else the tokenizer's eos."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = configured if isinstance(configured, list) else [configured] if configured is not None else []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    if not ids:
        raise InputError(
            "neither the model's generation config nor its tokenizer names an eos token",
            source="model.name",
            fix="use a tokenizer with an eos token, so that a generated response can end",
        )
    return tuple(sorted({int(i) for i in ids}))
