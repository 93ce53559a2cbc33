"""Outputs never overwrite inputs: a command's output path is checked against what it reads.

``split --out d.jsonl`` on ``d.jsonl`` (or on a symlink to it) would replace the data with the
manifest; ``report -o RUN/record.json`` would replace a record with HTML; ``pack -o data.jsonl
--with-data`` would replace the data it packs; ``rerun BUNDLE --out runs/A`` would write into the run
it came from. Paths are compared resolved (symlinks followed) and by identity (hard links), and no
output may be, or land inside, a run or verification directory, whose files belong to the run.
One check for every command that writes (split, report, pack, rerun). A command that writes one
file replaces an existing file there only when it is of the command's own kind (:class:`OwnKind`:
a report over a report page, a manifest over a manifest): ``pack -o cfg.yaml`` is refused, not a
config turned into a tarball. A command refused after it began writing its output directory
removes what it made there (:func:`removed_if_refused`). Imports only the standard library,
``_run.layout``'s names and the HTML kit's marks, so commands that need no model stay light.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tarfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from reprotune._errors import InputError
from reprotune._formats import DocumentFormat
from reprotune._html import CSS, GENERATOR
from reprotune._run.layout import RECORD, STUDY, STUDY_RUNS, VERIFICATION


@dataclass(frozen=True)
class OwnKind:
    """The kind of file a command writes, which it may replace; any other file there is refused.

    ``name`` says it in the refusal ("a page reprotune wrote"); ``test`` tells whether an existing file is of
    this kind (it reads no more than it needs).
    """

    name: str
    test: Callable[[Path], bool]

    def holds(self, path: Path) -> bool:
        """Whether ``path`` is a file of this kind (one that cannot be read is not known to be)."""
        try:
            return path.is_file() and self.test(path)
        except OSError:
            return False


def reprotune_page() -> OwnKind:
    """An HTML page reprotune wrote (``report``, ``significance --report``): its head names
    reprotune as its generator, or (a page written before that mark) holds the kit's stylesheet.
    Any other HTML page (a project's ``index.html``) is the user's."""

    def test(path: Path) -> bool:
        with path.open("rb") as handle:
            start = handle.read(4096)
        marks = (GENERATOR.encode(), CSS.strip().split("\n", 1)[0].encode())
        return start.lstrip().lower().startswith(b"<!doctype html") and any(m in start for m in marks)

    return OwnKind("a page reprotune wrote", test)


def json_document(document_format: DocumentFormat) -> OwnKind:
    """A JSON document of ``document_format`` (a split manifest)."""

    def test(path: Path) -> bool:
        # A data file is not read whole: not JSON at all, or JSON Lines (one whole object on its
        # first line and more after it), is told from the first line.
        with path.open("rb") as handle:
            first = handle.readline()
            while first and not first.strip():
                first = handle.readline()
            if not first.lstrip().startswith(b"{"):
                return False
            try:
                document = json.loads(first)
            except (ValueError, UnicodeDecodeError):  # an object over several lines: read it all
                document = None
            else:
                if handle.read(4096).strip():
                    return False
        if document is None:
            try:
                document = json.loads(path.read_bytes())
            except (ValueError, UnicodeDecodeError):
                return False
        return document_format.holds(document)

    return OwnKind(f"a {document_format.what}", test)


def tar_archive(first_member: str, name: str) -> OwnKind:
    """A tar archive whose first member is ``first_member`` (a bundle's ``bundle.json``)."""

    def test(path: Path) -> bool:
        try:
            with tarfile.open(path) as archive:
                member = archive.next()
        except (tarfile.TarError, EOFError, OSError):
            return False
        return member is not None and member.name == first_member

    return OwnKind(name, test)


def refuse_overwrite(
    out: Path, *, reads: Sequence[str | Path], option: str, own: OwnKind | None = None
) -> None:
    """Refuse ``out`` when it is (or would replace) a file the command reads or a run's file, or
    (given ``own``) an existing file of another kind than the command writes.

    Args:
        out: the output path given.
        reads: the files and directories the command reads.
        option: the option that named ``out`` (``--out``), for the message.
        own: the kind of file the command writes; an existing non-empty file at ``out`` that is not
            of this kind is refused (an empty one holds nothing to lose).

    Raises:
        InputError: naming both paths and the fix; or ``out`` cannot be written (a parent that is
            a file, a directory not writable here).
    """
    target = out.resolve()
    for given in reads:
        source = Path(given)
        if not source.exists():
            continue
        if source.is_dir():
            if target.is_relative_to(source.resolve()):
                raise _refusal(out, option, f"is inside {source}, which this command reads")
            continue
        if target == source.resolve() or (out.exists() and os.path.samefile(out, source)):
            raise _refusal(out, option, f"is the input {source} (the same file)")
    for parent in (target, *target.parents):
        if parent == target and (parent / RECORD).is_file():
            raise _refusal(out, option, "is a run directory, whose files belong to its run")
        if parent == target:
            continue
        kind = _owner(parent)
        if kind is not None:
            raise _refusal(out, option, f"is inside the {kind} directory {parent}, whose files belong to it")
    refuse_unwritable_parent(out, source=option)
    if own is not None:
        _refuse_special(out, option)
    if own is not None and target.is_dir():
        raise InputError(
            f"{option} {str(out)!r} is a directory; {option} names the file to write ({own.name})",
            source=option,
            fix=f"give {option} a file path (a new file, in that directory or elsewhere)",
        )
    if own is not None and target.is_file() and target.stat().st_size > 0 and not own.holds(target):
        raise InputError(
            f"{option} {str(out)!r} exists and is not {own.name}: writing it would replace what it holds",
            source=option,
            fix=f"give {option} a new path (or remove {out} first, if it should go)",
        )


def _refuse_special(out: Path, option: str) -> None:
    """Refuse an ``out`` that is a symbolic link, a pipe, a device or a socket: the file is
    written beside it and renamed over it, which replaces the link (its target left as it was),
    the pipe or the device node itself (``/dev/null`` as root) with a plain file."""
    try:
        mode = out.lstat().st_mode
    except OSError:
        return  # nothing there yet (or nothing this user can see): a new file
    if stat.S_ISLNK(mode):
        raise InputError(
            f"{option} {str(out)!r} is a symbolic link (to {os.readlink(out)}): writing would replace "
            "the link with a file and leave what it points to as it was",
            source=option,
            fix=f"give {option} the file itself ({out.resolve()}) or a new path",
        )
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        kind = (
            "a pipe"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket"
        )
        raise InputError(
            f"{option} {str(out)!r} is {kind}, not a file: writing would replace it with a plain file",
            source=option,
            fix=f"give {option} a file path (a new file, or a file it wrote before)",
        )


def refuse_nonempty_dir(out: Path, *, option: str, fix: str | None = None) -> None:
    """Refuse an output directory that exists with something in it, or that is a file: a command
    that fills a directory takes a new or empty one, and so never mixes its files with others'.
    ``fix`` replaces the usual one (give ``option`` a new or empty directory)."""
    if out.is_file() or (out.exists() and not out.is_dir()):
        raise InputError(
            f"{option} {str(out)!r} is a file, not a directory",
            source=option,
            fix=fix or "give a new directory",
        )
    if out.is_dir() and any(out.iterdir()):
        raise InputError(
            f"{option} {str(out)!r} exists and is not empty",
            source=option,
            fix=fix or f"give {option} a new (or empty) directory",
        )


def _owner(directory: Path) -> str | None:
    """What kind of directory owns everything in it: a run, verification or study (else None)."""
    for name, kind in ((RECORD, "run"), (VERIFICATION, "verification"), (STUDY, "study")):
        if (directory / name).is_file():
            return kind
    return None


def refuse_inside_run(out: Path, *, option: str, own: Path | None = None) -> None:
    """Refuse an output that would go inside a run or study directory (its files belong to its run
    or study), but for inside ``own``: the place the command may write in a run it works on (an
    eval's: its run's ``evals/``)."""
    target = out.resolve()
    mine = own.resolve() if own is not None else None
    for parent in target.parents:
        if parent == mine:
            return
        kind = _owner(parent)
        if kind == "study" and target.parent == parent / STUDY_RUNS:
            return  # one of the study's runs (``seeds`` runs them there, --jobs as `reprotune run`)
        if kind in ("run", "study"):
            where = f" (an eval of a run goes in its {mine.name}/)" if mine is not None else ""
            raise InputError(
                f"{option} {str(out)!r} is inside the {kind} directory {parent}, "
                f"whose files belong to its {kind}",
                source=option,
                fix=f"give {option} a path outside any run or study directory{where}",
            )


def refuse_unwritable_parent(out: Path, *, source: str) -> None:
    """Refuse an output whose directory cannot be made or written, before any work: a parent that
    is a file, or the nearest existing directory (``out`` itself, when it is one) not writable
    here. Missing directories are fine: the command creates them."""
    target = out.absolute()
    for parent in (target, *target.parents):
        if not parent.exists() or (parent == target and not parent.is_dir()):
            continue  # a directory to make, or the file to replace: its directory decides
        fix = f"give {source} a path you can write"
        if not parent.is_dir():
            problem, fix = f"{parent} is a file, not a directory", f"give {source} a path in a directory"
        elif os.statvfs(parent).f_flag & os.ST_RDONLY:
            problem = f"{parent} is on a read-only file system"
        elif not os.access(parent, os.W_OK | os.X_OK):
            problem = f"the directory {parent} is not writable here"
        else:
            return
        raise InputError(f"{source} {str(out)!r} cannot be written: {problem}", source=source, fix=fix)


def _refusal(out: Path, option: str, problem: str) -> InputError:
    return InputError(
        f"{option} {str(out)!r} {problem}: writing it would destroy what it holds",
        source=option,
        fix=f"give {option} a new path outside the inputs and run directories",
    )


def first_missing(path: Path) -> Path | None:
    """The outermost directory of ``path`` that does not exist yet (what a command will create),
    or None when ``path`` exists."""
    missing = None
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


@contextlib.contextmanager
def removed_if_refused(out: Path) -> Iterator[None]:
    """On an ``InputError`` from the block, remove what it made of ``out``: ``out`` (and the
    parents it made) when it did not exist, else the entries the block added to it."""
    created = first_missing(out)
    before = set(out.iterdir()) if created is None and out.is_dir() else set()
    try:
        yield
    except InputError:
        if created is not None:
            made = [created]
        else:  # out existed: what the block added to it (nothing, when out is a file)
            made = [p for p in out.iterdir() if p not in before] if out.is_dir() else []
        for path in made:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        raise
