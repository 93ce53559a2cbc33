"""Canonical JSON, atomic writes and file hashes: how every reprotune file reaches the disk."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from reprotune._errors import InputError
from reprotune._faults import kill_point

_CHUNK = 1 << 20


def _default_mode() -> int:
    """The mode a plain ``open()`` would give a new file (mkstemp's is 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


_FILE_MODE = _default_mode()


def canonical_dumps(obj: Any, *, indent: int | None = 1) -> str:
    """Serialize ``obj`` as canonical JSON: sorted keys, no NaN, UTF-8, trailing newline.

    The same object gives the same text on any machine and in any process, so the sha256 of
    a manifest or a record is a stable identity.
    """
    encoder = _ENCODERS.get(indent) or _encoder(indent)
    return encoder.encode(obj) + "\n"


def _encoder(indent: int | None) -> json.JSONEncoder:
    return json.JSONEncoder(
        sort_keys=True,
        ensure_ascii=False,
        allow_nan=False,
        indent=indent,
        separators=(",", ": ") if indent is not None else (",", ":"),
    )


# Built once: ``json.dumps`` with options builds a new encoder per call, which the ledger's
# per-step line would pay every step.
_ENCODERS: dict[int | None, json.JSONEncoder] = {indent: _encoder(indent) for indent in (None, 1)}


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` so that a reader (or a crash) sees the old file or the new one.

    The bytes go to a temporary file in the same directory, are fsynced, then renamed over
    ``path``; the directory is fsynced so the rename itself survives a power cut.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        kill_point(f"replace:{target.name}")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
    return target


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 1) -> str:
    """Write ``obj`` as canonical JSON atomically; return the sha256 of the bytes written."""
    data = canonical_dumps(obj, indent=indent).encode("utf-8")
    write_bytes_atomic(path, data)
    return hashlib.sha256(data).hexdigest()


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory entry to disk (a no-op where the OS does not allow it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of every byte of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def read_json_file(path: str | os.PathLike[str], *, what: str, fix: str) -> Any:
    """Parse the JSON file at ``path``; bad input raises ``InputError`` naming the file and the fix.

    Args:
        path: the file.
        what: what the file is, for messages (``"manifest"``, ``"record"``).
        fix: what the user can do when the file is missing or not JSON.

    Raises:
        InputError: the file is missing or unreadable, not UTF-8, or not JSON (with line and column).
    """
    file = Path(path)
    try:
        text = file.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} file {str(file)!r} does not exist", source=str(file), fix=fix) from None
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc}", source=str(file), fix=fix) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} is not UTF-8 text: {exc}", source=str(file), fix=fix) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{what} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            source=f"{file}:{exc.lineno}:{exc.colno}",
            fix=fix,
        ) from None
