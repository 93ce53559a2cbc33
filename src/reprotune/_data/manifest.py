"""The split manifest: a frozen, schema-versioned record of a split, written as canonical JSON.

The manifest is the truth about a split: loading one never re-runs the algorithm. Loading a
manifest and writing it again gives the same bytes. Per-row hashes live in the JSON for up to
:data:`INLINE_ROW_HASH_LIMIT` rows, and above that in a sidecar file next to the manifest, named in
it with its sha256. The format is documented in docs/manifest.md.

This module writes and copies manifests with their sidecars, and is where callers import the
manifest's names from. The typed manifest and its bytes are in ``_data.manifest_format``, the
strict loader in ``_data.manifest_load``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from reprotune._data.manifest_format import (
    ALGORITHM,
    ALGORITHM_VERSION,
    LISTS,
    SPLITS,
    ClassSummary,
    Decision,
    Manifest,
    Strategy,
    manifest_bytes,
)
from reprotune._data.manifest_load import load_manifest, read_manifest_json
from reprotune._jsonio import sha256_bytes, sha256_file, write_bytes_atomic

__all__ = [
    "ALGORITHM",
    "ALGORITHM_VERSION",
    "INLINE_ROW_HASH_LIMIT",
    "LISTS",
    "SIDECAR_SUFFIX",
    "SPLITS",
    "ClassSummary",
    "Decision",
    "Manifest",
    "Strategy",
    "copy_manifest",
    "load_manifest",
    "manifest_bytes",
    "sidecar_path",
    "write_manifest",
]

# Above this many rows, per-row hashes go to a sidecar file (a JSON list of 10M hex strings
# would be 670 MB; the binary sidecar of a 10M-row, 50-class table is 10 MB).
INLINE_ROW_HASH_LIMIT = 100_000
SIDECAR_SUFFIX = ".rowhashes"


def sidecar_path(manifest_path: str | Path, sha256: str) -> Path:
    """Where the row-hash sidecar with content ``sha256`` of the manifest at ``manifest_path`` goes:
    ``<manifest name>.<first 16 hex of its sha256>.rowhashes``, so a new sidecar never replaces the
    one an existing manifest names."""
    path = Path(manifest_path)
    return path.with_name(f"{path.name}.{sha256[:16]}{SIDECAR_SUFFIX}")


def _sidecars_of(path: Path) -> list[Path]:
    """Every sidecar a manifest at ``path`` may name (this scheme's and the older ``<name>.rowhashes``)."""
    if not path.parent.is_dir():
        return []
    # exactly these names: a neighbour such as split.json.v1 has sidecars of its own
    own = re.compile(rf"{re.escape(path.name)}(\.[0-9a-f]{{16}})?{re.escape(SIDECAR_SUFFIX)}")
    return [p for p in path.parent.iterdir() if own.fullmatch(p.name) and p.is_file()]


def write_manifest(manifest: Manifest, path: str | Path) -> str:
    """Write ``manifest`` to ``path`` atomically; return the sha256 of the bytes written.

    For more than :data:`INLINE_ROW_HASH_LIMIT` rows the per-row hashes go to a sidecar named by
    its content (:func:`sidecar_path`), which the manifest names with its sha256. A manifest and
    its sidecar are replaced together or not at all: the new sidecar is written first under its
    own name, then the manifest; only then are the sidecars of the manifest it replaced removed.
    If the manifest cannot be written, a sidecar this call created is removed and the old
    manifest, with its sidecar, is as it was.
    """
    path = Path(path)
    side: Path | None = None
    created = False
    row_hashes: Any = None
    if manifest.n_rows > INLINE_ROW_HASH_LIMIT:
        data = manifest.row_hashes.to_bytes()
        digest = sha256_bytes(data)
        side = sidecar_path(path, digest)
        created = not side.exists()
        if created or sha256_file(side) != digest:
            write_bytes_atomic(side, data)
        row_hashes = {
            "algorithm": "sha256",
            "file": side.name,
            "file_sha256": digest,
            "n_rows": manifest.n_rows,
        }
    try:
        content = manifest_bytes(manifest, row_hashes=row_hashes)
        write_bytes_atomic(path, content)
    except BaseException:
        if side is not None and created:
            side.unlink(missing_ok=True)
        raise
    for old in _sidecars_of(path):
        if old != side:
            old.unlink(missing_ok=True)  # the replaced manifest's: nothing names it any more
    return sha256_bytes(content)


def copy_manifest(source: str | Path, target: str | Path) -> str:
    """Copy a manifest (and its row-hash sidecar, if it names one) byte for byte; return its sha256.

    Raises:
        InputError: the manifest cannot be loaded (it is validated first).
    """
    source, target = Path(source), Path(target)
    loaded = read_manifest_json(source)
    info = loaded.get("row_hashes") if isinstance(loaded, dict) else None
    load_manifest(source)  # validate before copying anything
    if isinstance(info, dict) and isinstance(info.get("file"), str):
        data = (source.parent / info["file"]).read_bytes()
        write_bytes_atomic(target.parent / info["file"], data)
    content = source.read_bytes()
    write_bytes_atomic(target, content)
    return sha256_bytes(content)
