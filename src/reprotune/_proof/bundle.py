"""Reproduction bundles: what another machine needs to rerun a run, in one ``.tar.gz``.

``pack`` writes the run's record, resolved config, split manifest (and its row-hash sidecar),
ledger, adapter and code patch, and with ``with_data`` the data file, plus ``bundle.json``: the
sha256 and size of every member. The archive is deterministic (sorted members, fixed owner, mode
and time), so one run packs to the same bytes.

``unpack`` trusts nothing in a bundle: every member must be a regular file with a relative path
inside the bundle (no absolute path, no ``..``, no link, no device), listed in ``bundle.json`` with
its sha256 and within the size limits; the members are read and checked before anything is
written, and written into a temporary directory renamed into place, so a damaged or hostile
bundle is refused with nothing written.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from reprotune._errors import InputError
from reprotune._jsonio import canonical_dumps, fsync_dir, sha256_bytes, sha256_file
from reprotune._run import layout
from reprotune._run.outputs import refuse_overwrite
from reprotune._run.record import load_record, record_config
from reprotune._run.rundir import check_is_run_dir

SCHEMA = "reprotune/bundle"
SCHEMA_VERSION = 1
MANIFEST = "bundle.json"
RUN = "run"  # members of the run directory live under run/
DATA = "data"  # the data file, with --with-data, under data/
#: Refused above these sizes (a bundle holds a LoRA adapter and a ledger, not a base model).
MAX_MEMBER_BYTES = 4 * 1024**3
MAX_TOTAL_BYTES = 8 * 1024**3
MAX_MEMBERS = 10_000

_FIX = "ask for the bundle again, or make it again with `reprotune pack RUN_DIR -o run.tar.gz`"


@dataclass(frozen=True)
class Unpacked:
    """A bundle checked and unpacked: the recorded run directory, and the data file if bundled."""

    root: Path
    run_dir: Path
    data: Path | None
    manifest: dict[str, Any]


def pack(run_dir: Path, out: Path, *, with_data: bool = False) -> dict[str, Any]:
    """Write the bundle of the completed run in ``run_dir`` to ``out``; return its ``bundle.json``.

    Raises:
        InputError: not a completed run directory, the data file is not there (``with_data``),
            or ``out`` is one of the files it packs or lies in a run directory (``_run.outputs``).
    """
    check_is_run_dir(run_dir)
    paths = layout.RunLayout(run_dir)
    record = load_record(paths.record)
    if record.get("status") != "completed":
        raise InputError(
            f"the run in {run_dir} did not complete (status {record.get('status')!r})",
            source=str(paths.record),
            fix=f"resume it with `reprotune resume {run_dir}` first; a bundle is for reproducing a result",
        )
    data_file = _data_file(record, run_dir) if with_data else None
    refuse_overwrite(out, reads=[run_dir, *([data_file] if data_file else [])], option="-o")
    files: dict[str, Path] = {}
    for path in _run_files(paths):
        files[f"{RUN}/{path.relative_to(run_dir).as_posix()}"] = path
    data_info: dict[str, Any] | None = None
    if data_file is not None:
        files[f"{DATA}/{data_file.name}"] = data_file
        data_info = {"member": f"{DATA}/{data_file.name}", "sha256": sha256_file(data_file)}
    members = {
        name: {"sha256": sha256_file(path), "size": path.stat().st_size} for name, path in files.items()
    }
    manifest = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "run_id": record.get("run_id"),
        "config_sha256": record.get("config_sha256"),
        "data": data_info,
        "data_sha256": (record.get("data") or {}).get("file_sha256"),
        "members": members,
    }
    _write_archive(out, files, canonical_dumps(manifest).encode("utf-8"))
    return manifest


def _run_files(paths: layout.RunLayout) -> list[Path]:
    """The files of a run directory a rerun elsewhere needs (no checkpoints, no evals)."""
    names = [layout.RECORD, layout.CONFIG, layout.MANIFEST, layout.LEDGER, layout.PATCH]
    found = [paths.root / name for name in names if (paths.root / name).is_file()]
    found += sorted(p for p in paths.root.glob(f"{layout.MANIFEST}.*rowhashes") if p.is_file())
    found += (
        sorted(p for p in paths.adapter_dir.iterdir() if p.is_file()) if paths.adapter_dir.is_dir() else []
    )
    return found


def _data_file(record: dict[str, Any], run_dir: Path) -> Path:
    cfg = record_config(record, run_dir=run_dir, source=str(layout.RunLayout(run_dir).record)).resolve_paths()
    path = Path(cfg.data.path)
    if cfg.data.path.startswith("builtin:"):
        raise InputError(
            f"the run's data is {cfg.data.path}, which ships with reprotune: there is no file to bundle",
            source="--with-data",
            fix="leave --with-data out: every machine with reprotune installed has it",
        )
    if not path.is_file():
        raise InputError(
            f"the run's data file {path} is not there to bundle",
            source="--with-data",
            fix="restore it (its sha256 is in record.json under data.file_sha256), or pack without "
            "--with-data",
        )
    return path


def _write_archive(out: Path, files: dict[str, Path], manifest: bytes) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as raw:
            # mtime 0 and no file name in the gzip header: the same run packs to the same bytes.
            with (
                gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz,
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
            ):
                _add(tar, MANIFEST, manifest)
                for name in sorted(files):
                    _add(tar, name, files[name].read_bytes())
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, out)
        fsync_dir(out.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def unpack(bundle: Path, target: Path) -> Unpacked:
    """Check every member of ``bundle``, then write them under ``target`` (new or empty).

    Raises:
        InputError: the bundle is not a readable .tar.gz, a member is a link or device, has an
            absolute or ``..`` path, is not listed in bundle.json, does not match its sha256, or
            is too large; or ``target`` is not empty. Nothing is written then.
    """
    contents = _read_checked(bundle)
    manifest = _parse_manifest(contents.pop(MANIFEST, None), bundle)
    listed = manifest["members"]
    if set(contents) != set(listed):
        extra, missing = sorted(set(contents) - set(listed)), sorted(set(listed) - set(contents))
        raise InputError(
            f"the bundle's members do not match bundle.json (not listed: {extra}, missing: {missing})",
            source=str(bundle),
            fix=_FIX,
        )
    for name, data in contents.items():
        if sha256_bytes(data) != listed[name].get("sha256"):
            raise InputError(
                f"member {name!r} does not match its sha256 in bundle.json: the bundle was changed",
                source=str(bundle),
                fix=_FIX,
            )
    if f"{RUN}/{layout.RECORD}" not in contents:
        raise InputError(f"the bundle holds no {RUN}/{layout.RECORD}", source=str(bundle), fix=_FIX)
    if target.exists() and any(target.iterdir()):
        raise InputError(f"{target} exists and is not empty", fix="choose a new directory with --out")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        for name, data in sorted(contents.items()):
            path = tmp.joinpath(*PurePosixPath(name).parts)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        if target.exists():
            target.rmdir()
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    data_member = (manifest.get("data") or {}).get("member")
    return Unpacked(
        root=target,
        run_dir=target / RUN,
        data=target.joinpath(*PurePosixPath(data_member).parts) if data_member else None,
        manifest=manifest,
    )


def _read_checked(bundle: Path) -> dict[str, bytes]:
    """Every member's bytes, after checking its type, path and size; nothing is written."""
    try:
        tar = tarfile.open(bundle, mode="r:gz")  # noqa: SIM115 (closed by the with below)
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise InputError(f"not a readable .tar.gz bundle ({exc})", source=str(bundle), fix=_FIX) from None
    contents: dict[str, bytes] = {}
    total = 0
    with tar:
        try:
            members = tar.getmembers()
        except (OSError, tarfile.TarError, EOFError) as exc:
            raise InputError(f"the bundle is damaged ({exc})", source=str(bundle), fix=_FIX) from None
        if len(members) > MAX_MEMBERS:
            raise InputError(f"the bundle has {len(members)} members", source=str(bundle), fix=_FIX)
        for member in members:
            _check_member(member, bundle)
            total += member.size
            if member.size > MAX_MEMBER_BYTES or total > MAX_TOTAL_BYTES:
                raise InputError(
                    f"member {member.name!r} is too large ({member.size} bytes; the limits are "
                    f"{MAX_MEMBER_BYTES} a member, {MAX_TOTAL_BYTES} in all)",
                    source=str(bundle),
                    fix=_FIX,
                )
            if member.name in contents:
                raise InputError(f"member {member.name!r} appears twice", source=str(bundle), fix=_FIX)
            handle = tar.extractfile(member)
            assert handle is not None  # a regular file, checked above
            contents[member.name] = handle.read()
    return contents


def _check_member(member: tarfile.TarInfo, bundle: Path) -> None:
    name = member.name
    if not member.isreg():
        kind = "link" if member.issym() or member.islnk() else "directory" if member.isdir() else "device"
        raise InputError(
            f"member {name!r} is a {kind}, not a regular file: refused", source=str(bundle), fix=_FIX
        )
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith(("/", "\\")) or ":" in path.parts[0]:
        raise InputError(f"member {name!r} has an absolute path: refused", source=str(bundle), fix=_FIX)
    if ".." in path.parts or "\\" in name or not path.parts:
        raise InputError(
            f"member {name!r} points outside the bundle ('..'): refused", source=str(bundle), fix=_FIX
        )


def _parse_manifest(raw: bytes | None, bundle: Path) -> dict[str, Any]:
    if raw is None:
        raise InputError(f"the bundle has no {MANIFEST}", source=str(bundle), fix=_FIX)
    try:
        manifest = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{MANIFEST} is not JSON ({exc})", source=str(bundle), fix=_FIX) from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise InputError(f"{MANIFEST} is not a reprotune bundle manifest", source=str(bundle), fix=_FIX)
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise InputError(
            f"bundle schema_version {manifest.get('schema_version')!r} is not supported "
            f"(this reprotune reads {SCHEMA_VERSION})",
            source=str(bundle),
            fix="use the reprotune version that packed it",
        )
    members = manifest.get("members")
    if not isinstance(members, dict) or not all(isinstance(v, dict) for v in members.values()):
        raise InputError(f"{MANIFEST} lists no members", source=str(bundle), fix=_FIX)
    return manifest
