"""Reproduction bundles: what another machine needs to rerun a run, in one ``.tar.gz``.

``pack`` writes the run's record, resolved config, split manifest (and its row-hash sidecar),
ledger, adapter files (those its record lists) and code patch (with ``with_checkpoints`` its
checkpoints), and with ``with_data`` the data file (checked against the record
first; builtin data is never packed: every reprotune has it), plus ``bundle.json``, first: the
sha256 and size of every member. What a rerun reads is checked against the record first: the
split manifest (``data.manifest_sha256``), the ledger and adapter (``outputs``) and, for a run made
from a dirty tree, the code patch (``code.diff_sha256``). The archive is deterministic (sorted
members, fixed owner, mode and time), so one run packs to the same bytes. Only the run's own files
are packed: a symbolic link in the run directory is refused. Reading a bundle is ``_proof.unpack``.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import tarfile
from pathlib import Path
from typing import Any

from reprotune._config.secrets import credential_in
from reprotune._errors import InputError
from reprotune._formats import BUNDLE
from reprotune._jsonio import canonical_dumps, publishing_file, sha256_file, write_error
from reprotune._run import layout
from reprotune._run.checkpoint_files import STATE_FILE, list_checkpoints, read_state_file, verify_checkpoint
from reprotune._run.drift import RUN_THE_SCRIPT_AGAIN, refuse_trainer_run
from reprotune._run.outputs import refuse_overwrite, tar_archive
from reprotune._run.record import RunRecord, read_record, record_config
from reprotune._run.rundir import check_is_run_dir

MANIFEST = "bundle.json"
RUN = "run"  # members of the run directory live under run/


def run_member(*parts: str) -> str:
    """The member name of a run directory's file in a bundle: ``run/record.json``."""
    return "/".join((RUN, *parts))


DATA = "data"  # the data file, with --with-data, under data/


def pack(
    run_dir: Path,
    out: Path,
    *,
    with_data: bool = False,
    allow_secrets: bool = False,
    with_checkpoints: bool = False,
) -> dict[str, Any]:
    """Write the bundle of the completed run in ``run_dir`` to ``out``; return its ``bundle.json``.

    ``with_checkpoints``: also every checkpoint that verifies (``verify BUNDLE --spot`` replays
    the intervals between them on another machine); one that does not is refused.

    Raises:
        InputError: not a completed run directory, a file a rerun needs missing or not the one
            the record hashed (split manifest, ledger, adapter, code patch of a dirty run), the
            data file is not there (``with_data``), ``out`` is one of the files it packs or lies in
            a run directory (``_run.outputs``), or the run's ``code.patch`` holds a token-shaped
            string (unless ``allow_secrets``).
    """
    check_is_run_dir(run_dir)
    paths = layout.RunLayout(run_dir)
    record = read_record(paths.record)
    if record.status != "completed":
        raise InputError(
            f"the run in {run_dir} did not complete (status {record.status!r})",
            source=str(paths.record),
            fix=f"resume it with `reprotune resume {run_dir}` first; a bundle is for reproducing a result",
        )
    refuse_trainer_run(
        {"config": record.config},
        run_dir,
        why="it has no reprotune config to rerun",
        fix=RUN_THE_SCRIPT_AGAIN,
    )
    check_split_file(
        paths.manifest, record.data.manifest_sha256 if record.data else None, record=paths.record
    )
    _check_outputs(paths, record)
    _check_patch(paths, record)
    if not allow_secrets and paths.patch.is_file():
        refuse_secrets_in_patch(paths.patch)
    data_file = _data_file(record, run_dir) if with_data else None  # None for builtin data
    refuse_overwrite(
        out,
        reads=[run_dir, *([data_file] if data_file else [])],
        option="-o",
        own=tar_archive(MANIFEST, "a reprotune bundle"),
    )
    files: dict[str, Path] = {}
    for path in _run_files(paths, record) + (_checkpoint_files(paths) if with_checkpoints else []):
        files[run_member(path.relative_to(run_dir).as_posix())] = path
    data_info: dict[str, Any] | None = None
    if data_file is not None:
        if "\\" in data_file.name:
            raise InputError(
                f"the data file's name {data_file.name!r} holds a backslash, which no bundle member "
                "may (a path separator elsewhere)",
                source="--with-data",
                fix="pack without --with-data, and give the data to `reprotune rerun BUNDLE --data PATH` "
                "where it reruns (under any name: it is checked against the run's manifest)",
            )
        files[f"{DATA}/{data_file.name}"] = data_file
        data_info = {"member": f"{DATA}/{data_file.name}", "sha256": sha256_file(data_file)}
    members = {
        name: {"sha256": sha256_file(path), "size": path.stat().st_size} for name, path in files.items()
    }
    manifest = BUNDLE.stamp(
        {
            "run_id": record.run_id,
            "config_sha256": record.config_sha256,
            "data": data_info,
            "data_sha256": record.data.file_sha256 if record.data else None,
            "data_builtin": builtin_data(record, run_dir),
            "members": members,
        }
    )
    _write_archive(out, files, canonical_dumps(manifest).encode("utf-8"))
    return manifest


def _check_outputs(paths: layout.RunLayout, record: RunRecord) -> None:
    """Refuse a run whose ledger or adapter files are missing or not the ones its record hashed:
    its bundle would rerun, elsewhere and at length, to a verdict about damaged files."""
    problems = output_problems(paths, record)
    if problems:
        path, problem = problems[0]
        raise InputError(
            f"{path} {problem}: a bundle of this run would not reproduce what the run recorded",
            source=str(paths.record),
            fix="pack a run whose files are whole (copy the run directory again from where it was made)",
        )


def output_problems(paths: layout.RunLayout, record: RunRecord) -> list[tuple[Path, str]]:
    """Each ledger or adapter file of the run that is missing or not the one its record hashed
    (``outputs``: the ledger, the adapter files it lists, or the weights alone for a record without
    the list), with what is wrong, both sha256 named: ``pack`` refuses such a run, and
    ``verify --spot`` fails it (its replays are judged against these very files). A listed name
    that is no file name in ``adapter/`` is not followed (``pack`` refuses it by name)."""
    outputs = record.outputs
    expected = {paths.ledger: ("outputs.ledger_sha256", outputs.ledger_sha256 if outputs else None)}
    for name, sha256 in (outputs.adapter_files if outputs else {}).items():
        if _is_file_name(name):
            expected[paths.adapter_dir / name] = (f"outputs.adapter_files[{name!r}]", sha256)
    if len(expected) == 1:
        weights = outputs.adapter_sha256 if outputs else None
        expected[paths.adapter_weights] = ("outputs.adapter_sha256", weights)
    problems = []
    for path, (key, recorded) in expected.items():
        found = sha256_file(path) if path.is_file() else None
        if found is None:
            problems.append((path, "is missing"))
        elif recorded is not None and found != recorded:
            problem = (
                f"is not the file the run wrote: its sha256 is {found}, the record's {key} is {recorded}"
            )
            problems.append((path, problem))
    return problems


def _is_file_name(name: str) -> bool:
    """Whether ``name`` names a file in its directory (no separator, not ``.`` or ``..``)."""
    return name not in ("", ".", "..") and Path(name).name == name and "\\" not in name


def _check_patch(paths: layout.RunLayout, record: RunRecord) -> None:
    """Refuse a run made from a dirty tree whose ``code.patch`` (the uncommitted diff) is missing or
    not the diff its record hashed: a rerun elsewhere needs it to rebuild the code (a run whose
    tree was dirty by untracked files alone has no diff, and no patch)."""
    recorded = record.code.diff_sha256 if record.code is not None and record.code.dirty else None
    if recorded is None:
        return
    found = sha256_file(paths.patch) if paths.patch.is_file() else None
    if found == recorded:
        return
    problem = "is missing" if found is None else "is not the diff the run was made with"
    if found is not None:
        problem += f" (its sha256 is {found}, the record's code.diff_sha256 is {recorded})"
    raise InputError(
        f"{paths.patch} {problem}: the run was made from a tree with uncommitted changes, which a "
        "rerun elsewhere needs to rebuild its code",
        source=str(paths.record),
        fix="pack a run whose files are whole (copy the run directory again from where it was made)",
    )


def check_split_file(path: Path, recorded: str | None, *, record: Path) -> None:
    """Refuse a run whose split manifest is missing, or is not the file its record hashed
    (``data.manifest_sha256``; a record without it is not checked): a rerun trains and validates on
    that split, so an edited one (test rows moved to ``dropped``) would rerun to IDENTICAL.

    Raises:
        InputError: naming the file, the recorded and found sha256, and the fix.
    """
    if not path.is_file():
        raise InputError(
            f"{path} is missing: a rerun trains and validates on the run's own split",
            source=str(record),
            fix="copy the run directory again from where it was made, with its split.json (and pack "
            "it again there, for a bundle)",
        )
    found = sha256_file(path)
    if recorded is not None and found != recorded:
        raise InputError(
            f"{path} is not the split the run was made with: its sha256 is {found}, the record's "
            f"data.manifest_sha256 is {recorded}",
            source=str(record),
            fix="restore the run's own split.json (copy the run directory again from where it was made); "
            "a run's split is never edited: to train on another split, start a new run with "
            "split.manifest set to it",
        )


def _run_files(paths: layout.RunLayout, record: RunRecord) -> list[Path]:
    """The files of a run directory a rerun elsewhere needs (no checkpoints, no evals): of the
    adapter directory, only the files the record lists (``outputs.adapter_files``; the weights
    alone for a record without the list), never a stray file beside them (a ``.env``).

    Raises:
        InputError: one of them is a symbolic link (a bundle holds the run's own files, never
            what a link points to).
    """
    names = [layout.RECORD, layout.CONFIG, layout.MANIFEST, layout.LEDGER, layout.PATCH]
    found = [paths.root / name for name in names if (paths.root / name).is_file()]
    found += sorted(p for p in paths.root.glob(f"{layout.MANIFEST}.*rowhashes") if p.is_file())
    listed = sorted(record.outputs.adapter_files) if record.outputs and record.outputs.adapter_files else []
    for name in listed:
        if not _is_file_name(name):
            raise InputError(
                f"the record lists adapter file {name!r}, which is no file name in adapter/",
                source=f"{paths.record} (key outputs.adapter_files)",
                fix="pack a run whose record is whole (copy the run directory again from where it was made)",
            )
    found += [paths.adapter_dir / name for name in listed or [layout.ADAPTER_WEIGHTS]]
    for path in (*found, paths.adapter_dir):
        if path.is_symlink():
            raise InputError(
                f"{path} is a symbolic link (to {os.readlink(path)}): a bundle packs only the run's own "
                "files",
                source=str(paths.root),
                fix="replace the link by the file itself (cp --remove-destination TARGET LINK), then pack",
            )
    return found


def _checkpoint_files(paths: layout.RunLayout) -> list[Path]:
    """The files of every checkpoint of the run, each checkpoint verified first: its ``state.json``
    and the files it lists (and hashes), never a stray file beside them (a ``.env``), as of the
    adapter directory only the files the record lists.

    Raises:
        InputError: a checkpoint does not verify, or one of its files is a symbolic link.
    """
    if paths.checkpoints.is_symlink():
        raise InputError(
            f"{paths.checkpoints} is a symbolic link (to {os.readlink(paths.checkpoints)}): a bundle "
            "packs only the run's own files",
            source=str(paths.root),
            fix="replace the link by the directory itself (copy it in place of the link), or pack "
            "without --checkpoints",
        )
    found: list[Path] = []
    for checkpoint in list_checkpoints(paths.checkpoints):
        problem = verify_checkpoint(checkpoint)
        listed = [] if problem is not None else [STATE_FILE, *sorted(read_state_file(checkpoint).files)]
        files = [checkpoint / name for name in listed]
        if problem is not None or any(p.is_symlink() for p in (checkpoint, *files)):
            raise InputError(
                f"checkpoint {checkpoint} {problem or 'holds a symbolic link'}: a bundle carries only "
                "whole, verified checkpoints",
                source=str(checkpoint),
                fix="pack without --checkpoints, or remove that checkpoint",
            )
        found += files
    if not found:
        raise InputError(
            f"the run in {paths.root} has no checkpoint to pack",
            source="--checkpoints",
            fix="set train.save_every (and train.keep_checkpoints) for the run, or pack without "
            "--checkpoints",
        )
    return found


def refuse_secrets_in_patch(patch: Path) -> None:
    """Refuse to ship a ``code.patch`` that holds a token-shaped string: the run directory keeps it
    (a rerun here needs it), but a bundle leaves the machine.

    Raises:
        InputError: naming the changed file and its line, and what the token looks like.
    """
    found = first_token_in_patch(patch.read_text(encoding="utf-8", errors="replace"))
    if found is None:
        return
    file, line, what = found
    raise InputError(
        f"the run's code.patch holds what looks like {what}, in {file} line {line}: a bundle would carry "
        "it to every machine it is sent to",
        source=str(patch),
        fix="take the secret out of that file (commit, rerun), or pack anyway with --allow-secrets",
    )


def first_token_in_patch(patch: str) -> tuple[str, int, str] | None:
    """``(file, line, what)`` of the first credential (:func:`credential_in`) in a git diff, the line
    numbered in the file's new version (its old one for a removed line), or None."""
    file, old, new = "?", 0, 0
    for text in patch.splitlines():
        if text.startswith("diff --git "):
            file = text.rsplit(" b/", 1)[-1]
        elif text.startswith("@@"):
            header = re.match(r"@@ -(\d+)(?:,\d+)? \+(\d+)", text)
            old, new = (int(header[1]), int(header[2])) if header else (0, 0)
            continue
        what = credential_in(text)
        if what is not None:
            return file, (old if text.startswith("-") else new), what
        if text.startswith("-"):
            old += 1
        elif text.startswith("+"):
            new += 1
        elif text.startswith(" "):
            old, new = old + 1, new + 1
    return None


def builtin_data(record: RunRecord, run_dir: Path) -> str | None:
    """The run's data when it ships with reprotune (``builtin:...``), else None."""
    path = str(record_config(record, run_dir=run_dir, source=str(layout.RunLayout(run_dir).record)).data.path)
    return path if path.startswith("builtin:") else None


def _data_file(record: RunRecord, run_dir: Path) -> Path | None:
    """The run's data file, checked against the record (None for builtin data: every reprotune
    has it, and a rerun checks it against the run's manifest like any data).

    Raises:
        InputError: the file is missing, or is not the file the run was made from.
    """
    cfg = record_config(record, run_dir=run_dir, source=str(layout.RunLayout(run_dir).record)).resolve_paths()
    if cfg.data.path.startswith("builtin:"):
        return None
    path = Path(cfg.data.path)
    if not path.is_file():
        raise InputError(
            f"the run's data file {path} is not there to bundle",
            source="--with-data",
            fix="restore it (its sha256 is in record.json under data.file_sha256), or pack without "
            "--with-data",
        )
    recorded = record.data.file_sha256 if record.data else None
    if recorded is not None and sha256_file(path) != recorded:
        raise InputError(
            f"the data file {path} has changed since the run (sha256 {sha256_file(path)[:12]}..., the "
            f"run's {recorded[:12]}...): it would not rerun the run",
            source="--with-data",
            fix=f"restore the original file, or compare them with `reprotune check-split "
            f"{layout.RunLayout(run_dir).manifest} {path}`",
        )
    return path


def _write_archive(out: Path, files: dict[str, Path], manifest: bytes) -> None:
    """Write the archive to ``out`` (the old file or the new one, never a part).

    Raises:
        InputError: ``out`` cannot be written (a directory that takes no new file, as ``/proc``,
            even where its permissions say it is writable; a full disk), naming it.
    """
    try:
        with (
            publishing_file(out) as raw,
            # mtime 0 and no file name in the gzip header: the same run packs to the same bytes.
            gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            _add(tar, MANIFEST, manifest)
            for name in sorted(files):
                _add(tar, name, files[name].read_bytes())
    except OSError as exc:
        if exc.filename is not None and Path(exc.filename) in files.values():
            raise  # reading one of the run's files (hashed a moment ago): not about -o
        raise write_error(out, exc, needed=None) from None


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))
