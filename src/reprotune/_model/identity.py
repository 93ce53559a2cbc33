"""A base model's identity: which files make it up, and their sha256.

Every load hashes what it loaded, so the record names the exact bytes the run started from: the
weights, the tokenizer files (chat template included), and every other file that changes the
computation (``config.json``, ``generation_config.json``, custom modelling code).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

from reprotune._errors import InputError
from reprotune._jsonio import read_json_object, sha256_bytes, sha256_file, write_json_atomic

#: Files besides weights and tokenizer that change what a model computes, whichever a directory has.
CONFIG_FILES: tuple[str, ...] = ("config.json", "generation_config.json")

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

# --------------------------------------------------------------------------------------------
# hashing


def files_sha256(
    directory: Path, names: Iterable[str], *, cache: Path | None = None
) -> tuple[str, dict[str, str]]:
    """Hash the named files of ``directory`` as one digest, and each on its own.

    The digest is the sha256 of the ``sha256sum``-style listing ``"<hex>  <name>\\n"`` of the
    files in sorted name order, so ``sha256sum $(ls NAMES) | sha256sum`` in the directory (C
    locale) gives the same value.

    Args:
        directory: where the files are (symlinks, as in the HF cache, are followed).
        names: file names relative to ``directory``.
        cache: a JSON file of earlier hashes keyed by each file's size, modification time and
            inode: a file whose three are unchanged is not read again. Only for directories
            reprotune owns (the converted builtin model), where nothing else writes.

    Returns:
        ``(digest, {name: sha256})``.
    """
    known = read_json_object(cache) if cache is not None else {}
    per_file, fresh = {}, {}
    for name in sorted(set(names)):
        stat = (directory / name).stat()
        key = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        entry = known.get(name)
        if isinstance(entry, dict) and entry.get("stat") == key and isinstance(entry.get("sha256"), str):
            per_file[name] = entry["sha256"]
        else:
            per_file[name] = sha256_file(directory / name)
        fresh[name] = {"stat": key, "sha256": per_file[name]}
    if cache is not None and fresh != {k: known.get(k) for k in fresh}:
        with contextlib.suppress(OSError):  # a cache that cannot be written only costs time
            write_json_atomic(cache, {**known, **fresh})
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


def config_file_names(directory: Path) -> list[str]:
    """The files of ``directory`` that define the computation besides weights and tokenizer.

    :data:`CONFIG_FILES` that are present, and every ``*.py`` file (custom modelling code loaded
    with ``trust_remote_code``), sorted.
    """
    names = [name for name in CONFIG_FILES if (directory / name).is_file()]
    return names + sorted(p.name for p in directory.glob("*.py") if p.is_file())
