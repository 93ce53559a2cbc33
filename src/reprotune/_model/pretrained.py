"""Reading a model folder into a tokenizer and a model: every weight from the files, or a refusal.

transformers fills a weight the checkpoint lacks (or holds in another shape) with values drawn
from torch's global generator, and says so only in its log. At load time that generator is not
seeded yet (a run seeds it after the model loads), so two runs of one config would start from two
models while the record's file hashes agree: :func:`load_pretrained` refuses such a checkpoint.
A weight tied to another (``lm_head.weight`` under ``tie_word_embeddings``) is not missing:
transformers takes it from its source and does not report it. See ``docs/models.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from reprotune._compat import load_tokenizer
from reprotune._errors import InputError

log = logging.getLogger(__name__)

#: Keys a refusal or warning names before it counts the rest.
SHOWN_KEYS = 5


def load_pretrained(directory: Path, torch_dtype: Any) -> tuple[Any, Any]:
    """(tokenizer, model) from a local folder, every weight read from its files; nothing downloaded.

    Args:
        directory: a Hugging Face model folder (config, safetensors weights, tokenizer).
        torch_dtype: the dtype of the loaded weights.

    Returns:
        ``(tokenizer, model)``.

    Raises:
        InputError: the folder does not load (a damaged weights file is named; code of its own is
            never run), or its checkpoint lacks weights the model has, or holds some in another
            shape (:func:`refuse_incomplete`).
    """
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    try:
        tokenizer = load_tokenizer(directory)
        # trust_remote_code False, never None: with None transformers asks on stdin whether to run
        # the directory's own Python code, and a "y" (piped, or typed) runs it.
        # ignore_mismatched_sizes: a weight of another shape is then listed in the loading info
        # (refused below, naming it) rather than raised with its details only in transformers' log.
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            directory,
            dtype=torch_dtype,
            local_files_only=True,
            trust_remote_code=False,
            output_loading_info=True,
            ignore_mismatched_sizes=True,
        )
        model, loading_info = loaded  # with output_loading_info: (model, info dict)
    except (OSError, ValueError, KeyError) as exc:
        if "trust_remote_code" in str(exc):
            raise InputError(
                f"{directory} needs its own Python code to load (config.json's auto_map names it), "
                "and reprotune never runs a model's code",
                source="model.name",
                fix="use a model whose architecture transformers ships (config.json model_type such as "
                "'llama'), or save this one as such where its code is trusted",
            ) from None
        raise InputError(
            f"cannot load a causal LM and tokenizer from {directory}: {exc}",
            source="model.name",
            fix="check that the folder is a complete Hugging Face causal-LM checkpoint with its tokenizer",
        ) from exc
    except SafetensorError as exc:  # a weights file cut short, or not safetensors at all
        raise InputError(
            f"cannot read the model's weights: {', '.join(map(str, _unreadable_weights(directory)))}: "
            f"damaged, or not a whole safetensors file ({exc})",
            source="model.name",
            fix="restore the file: copy the model again, or save it again with save_pretrained",
        ) from None
    refuse_incomplete(directory, loading_info, buffers={name for name, _ in model.named_buffers()})
    return tokenizer, model


def refuse_incomplete(
    directory: Path, loading_info: dict[str, Any], *, buffers: Collection[str] = ()
) -> None:
    """Refuse a checkpoint that does not give the model every weight, in its shape; warn of the
    rest of what transformers' loading info reports.

    Args:
        directory: the model folder, named in the messages.
        loading_info: what ``from_pretrained(..., output_loading_info=True)`` returned beside the
            model (``missing_keys``, ``unexpected_keys``, ``mismatched_keys``, ``error_msgs``;
            sets in transformers 5, lists in 4).
        buffers: the model's buffer names. A buffer the file lacks keeps the value the model
            computes from its config (the record hashes it under ``buffers``): warned, not refused.

    Raises:
        InputError: weights missing from the checkpoint, weights of another shape, or errors
            transformers reported, each named with the fix.
    """
    missing = sorted(set(loading_info.get("missing_keys") or ()))
    weights = [key for key in missing if key not in buffers]
    if weights:
        raise InputError(
            f"the checkpoint in {directory} lacks {_count(weights, 'weight')} the model has: "
            f"{_first(weights)}. transformers would fill a missing weight with random values from "
            "torch's generator, not seeded at load, so no two runs would agree",
            source="model.name",
            fix="use the complete checkpoint (every weight file, and the *.index.json of a sharded one), "
            "or load the model where it is whole and save it again with save_pretrained, which writes "
            "every weight",
        )
    if mismatched := sorted(map(_with_shapes, loading_info.get("mismatched_keys") or ())):
        raise InputError(
            f"the checkpoint in {directory} holds {_count(mismatched, 'weight')} in another shape than "
            f"config.json gives: {_first(mismatched)}. transformers would replace such a weight with "
            "random values from torch's generator, not seeded at load, so no two runs would agree",
            source="model.name",
            fix="use the config.json that was saved with these weights, or load the model where it is "
            "whole and save it again with save_pretrained",
        )
    errors = [str(message) for message in loading_info.get("error_msgs") or ()]
    if errors:
        raise InputError(
            f"transformers could not load every weight from {directory}: {_first(errors)}",
            source="model.name",
            fix="save the model again with save_pretrained, then load that folder",
        )
    if buffered := [key for key in missing if key in buffers]:
        log.warning(
            "%s: the checkpoint lacks %s; the model computes them from its config (the record hashes "
            "them under model.buffers): %s",
            directory,
            _count(buffered, "buffer"),
            _first(buffered),
        )
    # Weights the model does not use change nothing it computes (the file hash still names them).
    if unexpected := sorted(set(loading_info.get("unexpected_keys") or ())):
        log.warning(
            "%s: the checkpoint holds %s the model does not use (ignored): %s",
            directory,
            _count(unexpected, "tensor"),
            _first(unexpected),
        )


def _with_shapes(entry: Any) -> str:
    """A mismatched key, with its shapes where transformers gives them (``(key, file shape, model
    shape)`` in transformers 5; the key alone in 4)."""
    if isinstance(entry, str):
        return entry
    key, file, model = entry
    return f"{key} (file {tuple(file)}, model {tuple(model)})"


def _count(items: Collection[Any], noun: str) -> str:
    return f"{len(items):,} {noun}{'' if len(items) == 1 else 's'}"


def _first(items: Iterable[str]) -> str:
    """The first :data:`SHOWN_KEYS` of ``items``, and how many more."""
    listed = list(items)
    shown = ", ".join(listed[:SHOWN_KEYS])
    return shown if len(listed) <= SHOWN_KEYS else f"{shown} and {len(listed) - SHOWN_KEYS:,} more"


def _unreadable_weights(directory: Path) -> list[Path]:
    """The safetensors files whose header does not read (a file cut short), else all of them."""
    from safetensors import SafetensorError, safe_open

    files, bad = sorted(directory.glob("*.safetensors")), []
    for path in files:
        try:
            safe_open(str(path), framework="pt")  # reads and checks the header, nothing more
        except (SafetensorError, OSError):
            bad.append(path)
    return bad or files
