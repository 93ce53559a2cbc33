"""Installing reprotune into a stack that satisfies its ranges replaces nothing: pip's own resolver,
asked to install the built wheel into the environment running the tests (the lock's, and in CI
also the floors'), would install reprotune and nothing else."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from reprotune._run.stack import pinned

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the source (building in the tree would leave build/ and
    *.egg-info behind), with the setuptools of this environment (no download)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    done = subprocess.run(
        [*command, "-w", str(out), str(source)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("reprotune-*.whl")
    return built


def test_the_wheel_ships_the_stack_files(wheel: Path) -> None:
    """environment.stack compares against the lock and floor files: they are in the wheel."""
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "reprotune/stacks/lock.txt" in names and "reprotune/stacks/floor.txt" in names


def test_installing_the_wheel_replaces_none_of_the_installed_packages(wheel: Path, tmp_path: Path) -> None:
    """pip install --dry-run of the wheel (with its dependencies) into this environment: the
    report installs exactly one package, reprotune; every requirement is met as installed."""
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--disable-pip-version-check"]
    done = subprocess.run(
        [*command, "--report", str(report), str(wheel)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    installs = json.loads(report.read_text(encoding="utf-8"))["install"]
    assert [item["metadata"]["name"] for item in installs] == ["reprotune"]


def test_the_wheel_is_built_with_the_setuptools_the_stack_files_pin() -> None:
    """The setuptools that builds the wheel above (--no-build-isolation) is the one the stack files
    pin (plain pip freeze leaves it out of them) and scripts/install.sh installs, and it is at
    least pyproject's build floor (77: the first to read the license as an SPDX string)."""
    installed = importlib.metadata.version("setuptools")
    assert installed in {pinned("lock")["setuptools"], pinned("floor")["setuptools"]}
    build = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["build-system"]
    (floor,) = [m[1] for spec in build["requires"] if (m := re.fullmatch(r"setuptools>=([0-9]+)", spec))]
    assert int(installed.split(".")[0]) >= int(floor) >= 77
