"""Canonical JSON, atomic writes and file hashes: how every reprotune file reaches the disk."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import hashlib
import json
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from reprotune._errors import InputError, NoSpaceError

_CHUNK = 1 << 20


def _read_umask() -> int:
    """The process's umask (reading it means setting it: done once, at import)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()
#: The modes a plain ``open()`` and ``mkdir`` give a new file and directory (mkstemp's is 0600).
_FILE_MODE = 0o666 & ~_UMASK
_DIR_MODE = 0o777 & ~_UMASK


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


def json_safe(value: Any) -> Any:
    """``value`` as data canonical JSON can hold: enums as their values, dataclasses as dicts, sets
    as sorted lists (by value, else by their JSON), non-finite floats as text, and anything else
    unknown (a path, a dtype) as its ``str``: a record never fails on a value it only describes.

    Example:
        >>> json_safe({"b": {2, 1}, "a": float("inf")})
        {'b': [1, 2], 'a': 'inf'}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        items = [json_safe(v) for v in value]
        try:
            return sorted(items)
        except TypeError:  # mixed types: a stable order all the same
            return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_safe(dataclasses.asdict(value))
    enum_value = getattr(value, "value", None)
    if enum_value is not None and type(value).__module__ != "builtins":
        return json_safe(enum_value)
    return str(value)


@contextlib.contextmanager
def publishing_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Write a file so that a reader (or a crash) sees the old file or the new one, never a part.

    Yields a binary handle on a temporary file in the same directory (mode as ``open`` would make
    it). When the block ends normally, the bytes are fsynced and renamed over ``path``, and the
    directory is fsynced so the rename itself survives a power cut. When the block raises, the
    temporary file is removed and ``path`` is left as it was. ``OSError`` passes through as it came.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` through :func:`publishing_file`: the old file or the new one.

    Raises:
        InputError: the file cannot be written (a full disk, no permission, a parent that is a
            file), naming the path, and for a full disk the space it needs.
    """
    target = Path(path)
    try:
        with publishing_file(target) as handle:
            handle.write(data)
    except OSError as exc:
        raise write_error(target, exc, needed=len(data)) from None
    return target


_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}


def is_no_space(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception that caused it, is a full disk (or quota).

    Libraries that write files (safetensors) wrap the ``OSError`` in their own exception with the
    OS's words, which are looked for too.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
            return True
        text = str(exc)
        if "No space left on device" in text or "Disk quota exceeded" in text or "StorageFull" in text:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Free bytes on the filesystem holding ``path`` (or its nearest existing parent); None if unknown."""
    here = Path(path).absolute()
    for candidate in (here, *here.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def human_bytes(n: int) -> str:
    """``1536`` -> ``1.5 KiB``."""
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover


def no_space_error(
    path: str | os.PathLike[str], *, needed: int | None, fix: str, what: str = "the write takes"
) -> NoSpaceError:
    """The error for a full disk: the path, the space free now and what ``what`` (the write, a
    checkpoint) takes, and what to do. Free is read once the failed write's part is removed, so it
    may be more than the write takes (the disk filled while it was under way, file system blocks)."""
    free = free_bytes(path)
    have = f"{human_bytes(free)} free now" if free is not None else "free space unknown"
    want = f"; {what} about {human_bytes(needed)}" if needed else ""
    return NoSpaceError(f"no space left on the device of {path} ({have}{want})", source=str(path), fix=fix)


def write_error(path: Path, exc: OSError, *, needed: int | None) -> InputError:
    """An ``OSError`` from writing ``path`` as a message naming the path and the fix."""
    if is_no_space(exc):
        return no_space_error(path, needed=needed, fix="free space on that device, or write elsewhere")
    if exc.errno in (errno.ENOTDIR, errno.EEXIST) and not path.parent.is_dir():
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), path.parent)
        return InputError(
            f"cannot write {path}: {blocker} is a file, not a directory",
            source=str(path),
            fix="choose a path whose parent directories are directories",
        )
    return InputError(
        f"cannot write {path}: {exc.strerror or exc}",
        source=str(path),
        fix="choose a path in a directory you can write to (and that is not read-only)",
    )


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


@contextlib.contextmanager
def publishing_dir(target: Path, *, replace: bool) -> Iterator[Path]:
    """Build a directory beside ``target`` and put it in place whole, or not at all.

    Yields an empty temporary directory next to ``target`` (the same filesystem; its mode as
    ``mkdir`` would make it). When the block ends normally, every file in it is flushed to disk, and
    it is renamed to ``target``: an existing ``target`` is replaced when ``replace`` (kept aside until
    the rename has landed, and put back if it fails), else refused. When the block raises, the
    temporary directory is removed and ``target`` is left as it was.

    Raises:
        FileExistsError: ``target`` exists (even empty) and ``replace`` is false.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    aside: Path | None = None
    try:
        os.chmod(tmp, _DIR_MODE)
        yield tmp
        for path in sorted(tmp.rglob("*")):
            if path.is_file() and not path.is_symlink():
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
        fsync_dir(tmp)
        if target.exists() or target.is_symlink():
            if not replace:
                raise FileExistsError(errno.EEXIST, "it already exists", str(target))
            aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, aside / target.name)
        try:
            os.rename(tmp, target)
        except BaseException:
            if aside is not None:
                os.replace(aside / target.name, target)  # if this fails too, aside keeps the old one
                shutil.rmtree(aside, ignore_errors=True)
                aside = None
            raise
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if aside is not None:  # the new directory is in place: the old one can go
        shutil.rmtree(aside, ignore_errors=True)


def unpublished(parent: Path, names: str) -> list[Path]:
    """What killed :func:`publishing_dir` blocks for targets named ``names`` (a glob) left in ``parent``.

    A process killed inside the block leaves its temporary directory; one killed between setting the
    old target aside and the rename leaves the set-aside one. Both are hidden, and both are garbage to
    a writer that is about to publish such a target again.
    """
    return sorted([*parent.glob(f".{names}.tmp-*"), *parent.glob(f".{names}.old-*")])


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def flattened(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as ``{"a.b.c": leaf}`` under ``prefix``; lists and empty mappings are leaves."""
    out: dict[str, Any] = {}
    if isinstance(value, Mapping) and value:
        for key in value:
            out.update(flattened(value[key], f"{prefix}.{key}" if prefix else str(key)))
    elif prefix:
        out[prefix] = value
    return out


def empty_beside_keys(key: str, flat_a: Mapping[str, Any], flat_b: Mapping[str, Any]) -> bool:
    """Whether ``key`` is an empty mapping on one side of two :func:`flattened` values and absent on
    the other, which lists keys under it (``seed.overrides: {}`` beside ``seed.overrides.split``):
    those keys are the difference, and the empty mapping is no other."""
    for here, there in ((flat_a, flat_b), (flat_b, flat_a)):
        value = here.get(key)
        if isinstance(value, Mapping) and not value and key not in there:
            return any(other.startswith(f"{key}.") for other in there)
    return False


def read_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in ``path``, or ``{}`` when the file is missing, unreadable, not JSON or
    not an object: for files read as hints (caches, lock holders, metadata), never trusted."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def canonical_sha256(obj: Any, *, indent: int | None = None) -> str:
    """Hex sha256 of ``obj``'s :func:`canonical_dumps` (one line unless ``indent``): the identity
    of a JSON value, the same on any machine."""
    return sha256_bytes(canonical_dumps(obj, indent=indent).encode("utf-8"))


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of every byte of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def path_kind(path: str | os.PathLike[str]) -> str:
    """What is at ``path``: ``file``, ``missing``, ``directory``, ``named pipe (FIFO)``,
    ``character device``, ``block device``, ``socket`` or ``unreadable`` (symlinks followed).

    Reading a FIFO or a device blocks or never ends, so readers check this first.
    """
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError:
        return "unreadable"
    for test, name in (
        (stat.S_ISREG, "file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "named pipe (FIFO)"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "unreadable"
