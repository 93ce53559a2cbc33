"""Per-row hashes of a table in a compact, ordered encoding (the manifest's sidecar format).

:class:`RowHashes` keeps each distinct sha256 once and, per row, the index of its hash, so a table
of ten million rows with few distinct rows stays small; :meth:`RowHashes.to_bytes` is the binary
encoding written to a manifest's sidecar and hashed into a non-file table's identity.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from reprotune._errors import InputError
from reprotune._jsonio import canonical_dumps, sha256_bytes

ROWHASH_MAGIC = "reprotune-rowhashes"
ROWHASH_VERSION = 1
DIGEST_SIZE = 32


def _index_dtype(n_distinct: int) -> np.dtype[Any]:
    for dtype in (np.uint8, np.uint16, np.uint32):
        if n_distinct <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype).newbyteorder("<")
    return np.dtype(np.uint64).newbyteorder("<")


class RowHashes:
    """Per-row sha256 digests, dictionary-encoded: the distinct digests and, per row, which one.

    Args:
        digests: ``(k, 32)`` uint8 array of distinct digests, sorted ascending, no repeats.
        codes: ``(n,)`` unsigned array; row ``i`` has digest ``digests[codes[i]]``.
    """

    def __init__(self, digests: np.ndarray, codes: np.ndarray) -> None:
        self.digests = digests
        self.codes = codes

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    @classmethod
    def from_digests(cls, distinct: Sequence[bytes], row_codes: np.ndarray) -> RowHashes:
        """Build from (possibly unsorted, repeated) digests and row codes into them."""
        # Sorting by bytes makes the encoding independent of how the rows were factorized.
        keys = np.array([bytes(d) for d in distinct], dtype=f"S{DIGEST_SIZE}")
        uniq, inverse = np.unique(keys, return_inverse=True)
        digests = np.frombuffer(uniq.tobytes(), dtype=np.uint8).reshape(len(uniq), DIGEST_SIZE)
        dtype = _index_dtype(len(uniq))
        remap = inverse.astype(dtype)
        codes = remap[row_codes] if len(row_codes) else np.zeros(0, dtype=dtype)
        return cls(digests, codes.astype(dtype, copy=False))

    @classmethod
    def from_hex(cls, hexes: Sequence[str]) -> RowHashes:
        """Build from one hex digest per row."""
        index: dict[str, int] = {}
        codes = np.fromiter(
            (index.setdefault(h, len(index)) for h in hexes), dtype=np.int64, count=len(hexes)
        )
        return cls.from_digests([bytes.fromhex(h) for h in index], codes)

    def hex_list(self) -> list[str]:
        """One hex digest per row, in row order."""
        table = [bytes(row).hex() for row in self.digests]
        return [table[c] for c in self.codes.tolist()]

    def hex_at(self, i: int) -> str:
        """Hex digest of row ``i``."""
        return bytes(self.digests[int(self.codes[i])]).hex()

    def to_bytes(self) -> bytes:
        """The row-hash file layout (docs/manifest.md): a JSON header line, digests, row codes."""
        header = {
            "digest": "sha256",
            "format": ROWHASH_MAGIC,
            "index_bytes": int(self.codes.dtype.itemsize),
            "n_distinct": int(self.digests.shape[0]),
            "n_rows": len(self),
            "version": ROWHASH_VERSION,
        }
        head = canonical_dumps(header, indent=None).encode("utf-8")
        codes = self.codes.astype(self.codes.dtype.newbyteorder("<"), copy=False)
        return b"".join((head, self.digests.tobytes(), codes.tobytes()))

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str) -> RowHashes:
        """Parse the row-hash file layout.

        Raises:
            InputError: the bytes are not a row-hash file this version can read.
        """
        fix = "make the manifest again with `reprotune split`"
        end = data.find(b"\n")
        try:
            header = json.loads(data[: end + 1]) if end >= 0 else None
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("format") != ROWHASH_MAGIC:
            raise InputError("not a reprotune row-hash file (bad header line)", source=source, fix=fix)
        if header.get("version") != ROWHASH_VERSION:
            raise InputError(
                f"row-hash file version {header.get('version')!r} is not supported (this reads "
                f"{ROWHASH_VERSION})",
                source=source,
                fix="use the reprotune version that wrote it, or make the manifest again",
            )
        try:
            n_rows, k, width = int(header["n_rows"]), int(header["n_distinct"]), int(header["index_bytes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"row-hash header is missing a field: {exc}", source=source, fix=fix) from exc
        if width not in (1, 2, 4, 8) or end + 1 + k * DIGEST_SIZE + n_rows * width != len(data):
            raise InputError(
                f"row-hash file size {len(data)} does not match its header {header}", source=source, fix=fix
            )
        start = end + 1
        digests = np.frombuffer(data, dtype=np.uint8, count=k * DIGEST_SIZE, offset=start).reshape(
            k, DIGEST_SIZE
        )
        dtype = np.dtype(f"<u{width}")
        codes = np.frombuffer(data, dtype=dtype, count=n_rows, offset=start + k * DIGEST_SIZE)
        if n_rows and int(codes.max()) >= k:
            raise InputError("a row code points past the digest table", source=source, fix=fix)
        return cls(digests, codes)

    def sha256(self) -> str:
        """Hex sha256 of :meth:`to_bytes`."""
        return sha256_bytes(self.to_bytes())


def smallest_codes(codes: np.ndarray, k: int) -> np.ndarray:
    return codes.astype(_index_dtype(k).newbyteorder("="), copy=False)
