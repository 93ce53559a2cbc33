"""Fixtures of the adversarial tests (issue 16): a tiny project, real small disks, dead processes.

A full disk is a real one: a tmpfs of a few pages, mounted for the test (root only; elsewhere the
tests that need one are skipped, saying so).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tinyrun import TinyProject


@pytest.fixture(scope="session")
def project(tmp_path_factory: pytest.TempPathFactory) -> TinyProject:
    """The tiny model, data (80 rows, 3 categories) and base config, for every adversarial test."""
    return TinyProject.create(tmp_path_factory.mktemp("adversarial-project"))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """``small_disk(size)``: a fresh tmpfs of ``size`` bytes, unmounted after the test."""
    mounts: list[Path] = []

    def mount(size: int) -> Path:
        if os.geteuid() != 0:
            pytest.skip("a real full disk needs a small tmpfs, which only root can mount")
        target = tmp_path / f"disk-{len(mounts)}"
        target.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounts.append(target)
        return target

    yield mount
    for target in mounts:
        subprocess.run(["umount", "-l", str(target)], check=False)
