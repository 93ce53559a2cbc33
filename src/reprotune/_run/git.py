"""Running git to read a work tree (the record's ``code``): without taking the locks, or writing
the index, of the people working in it. No torch."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path


@contextlib.contextmanager
def index_copy(root: Path) -> Iterator[dict[str, str]]:
    """The variables that point git at a private copy of the repository's index: ``git diff HEAD``
    refreshes the index it reads and writes it back (GIT_OPTIONAL_LOCKS or not), under the feet of
    the user's own git commands, as a file reprotune does not say it writes. No copy where there is
    no index yet, or no room for one (then git reads, and may refresh, the real one)."""
    where = git(["rev-parse", "--git-path", "index"], root)
    index = root / os.fsdecode(where.stdout.strip()) if where.returncode == 0 else None
    if index is None or not index.is_file():
        yield {}
        return
    with tempfile.TemporaryDirectory(prefix="reprotune-index-") as folder:
        copy = Path(folder) / "index"
        try:
            shutil.copy2(index, copy)  # its time too: git's racy-entry check compares against it
        except OSError:  # no room for it (a small tmpfs): the real index, as git alone would
            yield {}
            return
        yield {"GIT_INDEX_FILE": str(copy)}


def git(
    args: list[str], cwd: Path, env_extra: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """``git ARGS`` in ``cwd``, its output captured, in the C locale, paths unquoted, with
    ``env_extra`` (a private index: :func:`index_copy`)."""
    # GIT_OPTIONAL_LOCKS=0: reading status must not take index.lock from people working here.
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C", **(env_extra or {})}
    return subprocess.run(
        ["git", "-c", "core.quotepath=off", *args],
        cwd=cwd,
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
    )
