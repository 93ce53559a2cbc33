"""Helpers of the adversarial tests: fill a small disk, find a dead process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def fill_leaving(disk: Path, free: int) -> None:
    """Fill ``disk`` with a file until ``free`` bytes (rounded to pages) are left."""
    stat = os.statvfs(disk)
    have = stat.f_bavail * stat.f_frsize
    if have > free:
        (disk / "filler").write_bytes(b"\0" * (have - free))


def free_bytes(disk: Path) -> int:
    stat = os.statvfs(disk)
    return stat.f_bavail * stat.f_frsize


def dead_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(done.stdout)


def file_tree(root: Path) -> dict[str, bytes | None]:
    """Every file under ``root`` with its bytes, and every directory or link (None): a refusal
    that leaves the tree as it was leaves this equal."""
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() and not p.is_symlink() else None
        for p in sorted(root.rglob("*"))
    }
