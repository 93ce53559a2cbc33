"""Unpacking a reproduction bundle, trusting nothing in it.

Every member must be a regular file at a normalised relative path under ``run/`` or ``data/`` (no
absolute path, no ``..``, no link, no device), listed in ``bundle.json`` (which comes first) with its size
and sha256, within the size limits; ``bundle.json``'s claims are checked against those limits and
the archive's own size before any member is read, so a compression bomb costs nothing. Members
are streamed (bounded memory) into a hidden temporary directory renamed into place: a damaged or
hostile bundle is refused with the file tree as it was.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from reprotune._errors import InputError
from reprotune._formats import BUNDLE
from reprotune._jsonio import publishing_dir
from reprotune._proof.bundle import DATA, MANIFEST, RUN, run_member
from reprotune._run import layout
from reprotune._run.outputs import refuse_nonempty_dir

#: Refused above these sizes (a bundle holds a LoRA adapter and a ledger, not a base model).
MAX_MEMBER_BYTES = 4 * 1024**3
MAX_TOTAL_BYTES = 8 * 1024**3
MAX_MEMBERS = 10_000
MAX_MANIFEST_BYTES = 4 * 1024**2
#: The longest member name and the deepest member path read (a run's files are a few levels deep).
MAX_NAME = 1024
MAX_DEPTH = 16
#: Bytes of tar headers and padding allowed around each member (a pack writes 1 KiB at most).
_HEADROOM = 16 * 1024
#: bundle.json may list at most this many bytes per byte of the archive (a gzip bomb expands
#: 1000x; a run's ledger and data about 5-20x, its adapter about 1x).
MAX_EXPANSION = 200

_FIX = "ask for the bundle again, or make it again with `reprotune pack RUN_DIR -o run.tar.gz`"


@dataclass(frozen=True)
class Unpacked:
    """A bundle checked and unpacked: the recorded run directory, and the data file if bundled."""

    root: Path
    run_dir: Path
    data: Path | None
    manifest: dict[str, Any]


def unpack(bundle: Path, target: Path) -> Unpacked:
    """Check every member of ``bundle`` as it is streamed into a hidden temporary directory beside
    ``target`` (new or empty), then rename that into place.

    Memory stays bounded whatever the bundle claims: ``bundle.json`` comes first and is checked
    (sizes, the expansion ratio, every reference a member), then each member is checked (type,
    path, listed, its header size the listed size) before a byte of it is read, and hashed as it
    is copied. Any refusal removes the temporary directory: the file tree is as it was.

    Raises:
        InputError: the bundle is not a readable .tar.gz, ``bundle.json`` is missing, first-but-not,
            malformed or claims more than the limits, a member is a link, device or directory, has
            an absolute, ``..`` or unnormalised path, is not listed, differs from its size or
            sha256, or cannot be written (a name too long, a path that is also a directory); or
            ``target`` is not empty.
    """
    refuse_nonempty_dir(target, option="--out")
    with publishing_dir(target, replace=False) as tmp:
        manifest = _extract_checked(bundle, tmp)
        with contextlib.suppress(FileNotFoundError):
            target.rmdir()  # an empty one is taken; one filled meanwhile is refused (OSError)
    data_member = (manifest.get("data") or {}).get("member")
    return Unpacked(
        root=target,
        run_dir=target / RUN,
        data=target.joinpath(*PurePosixPath(data_member).parts) if data_member else None,
        manifest=manifest,
    )


def read_member(bundle: Path, name: str, *, limit: int = 16 << 20) -> bytes | None:
    """One member's bytes, checked like :func:`unpack` checks it (stopping there), or None when
    the bundle does not hold it or it is larger than ``limit``.

    Raises:
        InputError: as :func:`unpack`, for what is read before the member.
    """
    with _reading(bundle) as (tar, stream):
        manifest = _first_manifest(tar, stream, bundle)
        for member in _after_manifest(tar):
            _check_member(member, bundle, manifest["members"])
            if member.name == name:
                if member.size > limit:
                    return None
                with tempfile.TemporaryFile() as sink:
                    _copy_checked(tar, member, sink, manifest["members"][name], bundle)
                    sink.seek(0)
                    return sink.read()
    return None


def _after_manifest(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The members after ``bundle.json``, one at a time (iterating the TarFile would start over
    from the members it has already read)."""
    while (member := tar.next()) is not None:
        yield member


class _Overrun(Exception):
    """The archive holds more bytes than its bundle.json lets it."""


class _Bounded:
    """The decompressed archive, refusing to yield more than ``limit`` bytes: a tar header (a long
    name, a pax record) is read whole before any check, so the bound is on the stream itself."""

    def __init__(self, raw: Any, limit: int) -> None:
        self._raw = raw
        self.limit = limit
        self.consumed = 0

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._raw.read(size)
        self.consumed += len(data)
        if self.consumed > self.limit:
            raise _Overrun
        return data


@contextlib.contextmanager
def _reading(bundle: Path) -> Iterator[tuple[tarfile.TarFile, _Bounded]]:
    """The bundle as a tar stream bounded to what bundle.json may list; every way a damaged or
    hostile archive can fail while it is read is an :class:`InputError`."""
    try:
        raw = gzip.open(bundle, "rb")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        raise _refused(bundle, f"not a readable .tar.gz bundle ({exc})") from None
    stream = _Bounded(raw, MAX_MANIFEST_BYTES + _HEADROOM)
    try:
        with raw, tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
            yield tar, stream
    except _Overrun:
        raise _refused(
            bundle, f"the bundle holds more than its bundle.json lists (over {stream.limit} bytes): refused"
        ) from None
    except (OSError, tarfile.TarError, EOFError, zlib.error, RecursionError) as exc:
        raise _refused(bundle, f"the bundle is damaged ({exc})") from None


def _refused(bundle: Path, message: str) -> InputError:
    """A bundle refused: ``message``, naming the bundle, with the fix every refusal shares."""
    return InputError(message, source=str(bundle), fix=_FIX)


def _extract_checked(bundle: Path, root: Path) -> dict[str, Any]:
    """Stream every member of ``bundle`` into ``root``, checking it; return ``bundle.json``."""
    with _reading(bundle) as (tar, stream):
        manifest = _first_manifest(tar, stream, bundle)
        listed: dict[str, dict[str, Any]] = manifest["members"]
        seen: set[str] = set()
        for member in _after_manifest(tar):
            _check_member(member, bundle, listed)
            if member.name in seen:
                raise _refused(bundle, f"member {member.name!r} appears twice")
            seen.add(member.name)
            _write_member(tar, member, root, listed[member.name], bundle)
    missing = sorted(set(listed) - seen)
    if missing:
        raise _refused(bundle, f"bundle.json lists members the bundle lacks: {missing}")
    if run_member(layout.RECORD) not in seen:
        raise _refused(bundle, f"the bundle holds no {run_member(layout.RECORD)}")
    return manifest


def _write_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, root: Path, listing: dict[str, Any], bundle: Path
) -> None:
    """Write ``member`` under ``root`` (checked as it is copied); a path that cannot be written, or
    that is a file and a directory at once, is bad input, not a traceback."""
    name = member.name
    path = root.joinpath(*PurePosixPath(name).parts)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "xb") as sink:
            _copy_checked(tar, member, sink, listing, bundle)
    except (FileExistsError, NotADirectoryError, IsADirectoryError):
        raise _refused(
            bundle,
            f"member {name!r} lies inside another member, or another inside it (one path cannot be "
            "a file and a directory)",
        ) from None
    except OSError as exc:
        raise _refused(bundle, f"member {name[:120]!r} cannot be written here ({exc.strerror})") from None


def _copy_checked(
    tar: tarfile.TarFile, member: tarfile.TarInfo, sink: Any, listing: dict[str, Any], bundle: Path
) -> None:
    """Copy ``member`` to ``sink`` in chunks, hashing it; refuse a sha256 other than listed."""
    handle = tar.extractfile(member)
    assert handle is not None  # a regular file, checked
    digest = hashlib.sha256()
    while chunk := handle.read(1 << 20):
        digest.update(chunk)
        sink.write(chunk)
    if digest.hexdigest() != listing.get("sha256"):
        raise _refused(
            bundle, f"member {member.name!r} does not match its sha256 in bundle.json: the bundle was changed"
        )


def _first_manifest(tar: tarfile.TarFile, stream: _Bounded, bundle: Path) -> dict[str, Any]:
    """``bundle.json``, which ``pack`` writes first: read (size-limited) and checked; the stream
    is then bounded to what it lists (each member's size, and room for its headers)."""
    first = tar.next()
    if first is None or first.name != MANIFEST or not first.isreg():
        raise _refused(bundle, f"the bundle does not start with {MANIFEST}")
    if first.size > MAX_MANIFEST_BYTES:
        raise _refused(bundle, f"{MANIFEST} is {first.size} bytes: refused")
    handle = tar.extractfile(first)
    assert handle is not None
    manifest = _parse_manifest(handle.read(), bundle)
    _check_claims(manifest, bundle)
    members = manifest["members"].values()
    stream.limit = stream.consumed + sum(m["size"] for m in members) + _HEADROOM * (len(members) + 2)
    return manifest


def _check_claims(manifest: dict[str, Any], bundle: Path) -> None:
    """What bundle.json lists fits the limits and the archive's own size, and its data reference
    is one of its members, before any member is read."""
    listed: dict[str, dict[str, Any]] = manifest["members"]
    if len(listed) > MAX_MEMBERS:
        raise _refused(bundle, f"bundle.json lists {len(listed)} members")
    claimed = [entry.get("size") for entry in listed.values()]
    sizes = [size for size in claimed if isinstance(size, int) and not isinstance(size, bool) and size >= 0]
    if len(sizes) != len(claimed):
        raise _refused(bundle, "bundle.json gives a member no valid size")
    total = sum(sizes)
    compressed = bundle.stat().st_size
    if max(sizes, default=0) > MAX_MEMBER_BYTES or total > MAX_TOTAL_BYTES:
        raise _refused(
            bundle,
            f"bundle.json claims {total} bytes (the limits are {MAX_MEMBER_BYTES} a member, "
            f"{MAX_TOTAL_BYTES} in all)",
        )
    if total > MAX_EXPANSION * compressed + (1 << 20):
        raise _refused(
            bundle,
            f"bundle.json claims {total} bytes from a {compressed}-byte archive (more than "
            f"{MAX_EXPANSION}x): a compression bomb, refused before reading",
        )
    stray = sorted(name for name in listed if not name.startswith((f"{RUN}/", f"{DATA}/")))
    if stray:
        raise _refused(
            bundle,
            f"bundle.json lists members outside {RUN}/ and {DATA}/ ({', '.join(map(repr, stray[:3]))}), "
            "which pack never writes: refused before anything is read",
        )
    data = manifest.get("data")
    if data is not None:
        member = data.get("member") if isinstance(data, dict) else None
        if not isinstance(member, str) or member not in listed or not member.startswith(f"{DATA}/"):
            raise _refused(
                bundle,
                f"bundle.json's data member {member!r} is not one of its data/ members: refused "
                "before anything is read",
            )


def _check_member(member: tarfile.TarInfo, bundle: Path, listed: dict[str, dict[str, Any]]) -> None:
    """A member may be read only if it is a regular file at a normalised relative path, listed in
    bundle.json with its own size."""
    name = member.name
    if not member.isreg():
        kind = "link" if member.issym() or member.islnk() else "directory" if member.isdir() else "device"
        raise _refused(bundle, f"member {name!r} is a {kind}, not a regular file: refused")
    path = PurePosixPath(name)
    if not path.parts or len(name) > MAX_NAME or len(path.parts) > MAX_DEPTH:
        raise _refused(
            bundle,
            f"member {name[:120]!r} has no name, or a name over {MAX_NAME} characters or "
            f"{MAX_DEPTH} levels: refused",
        )
    if path.is_absolute() or name.startswith(("/", "\\")) or ":" in path.parts[0]:
        raise _refused(bundle, f"member {name!r} has an absolute path: refused")
    if "\\" in name:
        raise _refused(bundle, f"member {name!r} holds a backslash (a path separator elsewhere): refused")
    if ".." in path.parts or not path.parts:
        raise _refused(bundle, f"member {name!r} points outside the bundle ('..'): refused")
    if path.as_posix() != name or "." in name.split("/"):
        raise _refused(
            bundle,
            f"member {name!r} is not a normalised path (it would be written as {path.as_posix()!r}): refused",
        )
    if name not in listed:
        raise _refused(bundle, f"member {name!r} is not listed in bundle.json: refused")
    if member.size != listed[name].get("size"):
        raise _refused(
            bundle, f"member {name!r} is {member.size} bytes, bundle.json says {listed[name].get('size')}"
        )


def _parse_manifest(raw: bytes, bundle: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(raw)
    except RecursionError:
        raise _refused(bundle, f"{MANIFEST} is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _refused(bundle, f"{MANIFEST} is not JSON ({exc})") from None
    manifest = BUNDLE.check(
        manifest,
        what=f"bundle manifest ({MANIFEST})",
        source=str(bundle),
        fix=_FIX,
        version_fix="use the reprotune version that packed it",
    )
    members = manifest.get("members")
    if not isinstance(members, dict) or not all(isinstance(v, dict) for v in members.values()):
        raise _refused(bundle, f"{MANIFEST} lists no members")
    return manifest


def named_in_the_bundle(exc: InputError, unpacked: Path, bundle: Path) -> InputError:
    """``exc`` about a file of the bundle's run unpacked at ``unpacked``, which is removed after a
    refusal: the same error naming the bundle's member (``BUNDLE: run/split.json``) instead."""

    def named(text: str | None) -> str | None:
        return None if text is None else text.replace(str(unpacked), f"{bundle}: {RUN}")

    return type(exc)(named(exc.message) or exc.message, source=named(exc.source), fix=named(exc.fix))
