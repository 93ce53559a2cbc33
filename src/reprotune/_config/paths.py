"""Config paths checked on disk: the data file, the split manifest and a local model directory,
each problem located where its value was set (line and column, or ``--set``).

Importing this module never imports torch.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from reprotune._builtins import BUILTIN_PREFIX
from reprotune._config.schema import ExperimentConfig
from reprotune._config.yaml_io import Marks, mark_text
from reprotune._jsonio import path_kind


def path_problems(cfg: ExperimentConfig, marks: Marks, overridden: set[tuple[str, ...]]) -> list[str]:
    """Every config path that does not name what it must, located (``cfg`` has its config_dir)."""
    return [problem.located(marks, overridden) for problem in _missing_paths(cfg.resolve_paths())]


def with_config_dir(cfg: ExperimentConfig, base_dir: str | Path | None) -> ExperimentConfig:
    """``cfg`` with its ``config_dir`` made absolute against the config file's directory."""
    if base_dir is None:
        return cfg
    configured = Path(cfg.config_dir) if cfg.config_dir is not None else Path(".")
    return cfg.model_copy(update={"config_dir": str((Path(base_dir) / configured).resolve())})


def paths_only(raw: Mapping[str, Any], base_dir: str | Path | None) -> ExperimentConfig | None:
    """A config of defaults with only ``raw``'s data, manifest, model and config_dir paths: what
    is checked on disk when other keys are invalid (None when the paths themselves are)."""
    picked: dict[str, Any] = {"config_dir": raw.get("config_dir")}
    for section, key in _PATH_KEYS:
        value = raw.get(section)
        if isinstance(value, Mapping) and key in value:
            picked[section] = {key: value[key]}
    try:
        return with_config_dir(ExperimentConfig.model_validate(picked), base_dir)
    except ValidationError:
        return None


_PATH_KEYS = (("data", "path"), ("split", "manifest"), ("model", "name"))


class _PathProblem(NamedTuple):
    """A config path that does not name what it must: its key, what is wrong, the fix."""

    key: tuple[str, ...]
    problem: str
    fix: str

    def located(self, marks: Marks, overridden: set[tuple[str, ...]]) -> str:
        """``data.path: file not found (got ...) [line 3, column 9]; fix: ...``."""
        if self.key in overridden:
            where = " [from --set]"
        elif self.key in marks:
            where = f" [{mark_text(marks[self.key][1])}]"
        else:
            where = ""
        return f"{'.'.join(self.key)}: {self.problem}{where}; fix: {self.fix}"


def _missing_paths(cfg: ExperimentConfig) -> list[_PathProblem]:
    problems = []
    data_suffixes = (".jsonl", ".ndjson", ".csv", ".parquet", ".pq")
    if not cfg.data.path.startswith(BUILTIN_PREFIX):
        expected = "a JSONL, CSV or Parquet file"
        problems += _file_problem(("data", "path"), Path(cfg.data.path), expected, data_suffixes)
    if cfg.split.manifest is not None:
        problems += _file_problem(
            ("split", "manifest"), Path(cfg.split.manifest), "a manifest file", (".json",)
        )
    model = Path(cfg.model.name)
    if model.is_absolute() and not (model / "config.json").is_file():
        kind = path_kind(model)
        problem = (
            "local model directory not found"
            if kind == "missing"
            else "a directory without config.json, not a Hugging Face model directory"
            if kind == "directory"
            else f"is a {kind}, not a model directory"
        )
        problems.append(
            _PathProblem(
                ("model", "name"),
                f"{problem} (got {cfg.model.name!r})",
                "point it at a directory with config.json and weights, or use a hub id",
            )
        )
    return problems


def _file_problem(
    key: tuple[str, ...], path: Path, expected: str, suffixes: tuple[str, ...]
) -> list[_PathProblem]:
    """The problem with a config path that must name a regular file (none when it does)."""
    kind = path_kind(path)
    if kind == "file":
        return []
    if kind == "missing":
        return [_PathProblem(key, f"file not found (got {str(path)!r})", file_hint(path))]
    return [
        _PathProblem(
            key,
            f"is a {kind}, not {expected} (got {str(path)!r})",
            f"point it at {expected}{inside_hint(path, suffixes)}",
        )
    ]


def inside_hint(path: Path, suffixes: tuple[str, ...]) -> str:
    """``, e.g. 'dir/a.yaml'`` when ``path`` is a directory holding files with those suffixes."""
    if not path.is_dir():
        return ""
    try:
        found = sorted(p.name for p in path.iterdir() if p.suffix.lower() in suffixes and p.is_file())
    except OSError:
        return ""
    return f", e.g. {str(path / found[0])!r}" if found else ""


def file_hint(path: Path) -> str:
    """'did you mean' among the siblings of a missing file, else a generic hint."""
    parent = path.parent if path.parent.is_dir() else None
    if parent is not None:
        siblings = [p.name for p in parent.iterdir() if p.name != path.name]
        close = difflib.get_close_matches(path.name, siblings, n=1, cutoff=0.6)
        if close:
            return f"did you mean {str(parent / close[0])!r}?"
    return "check the path (relative paths in a config resolve against the config file's directory)"
