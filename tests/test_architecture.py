"""The layout of src/reprotune stays what docs/architecture.md says: pillars import downwards only,
modules stay small unless they say why, and the run path's functions fit on a screen."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "reprotune"

#: Lowest first. A module may import its own pillar and any pillar below it, never one above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_errors", "_version", "_jsonio", "_documents", "_formats", "_compat", "_html", "_charts", "_builtins"),
    ("_determinism",),
    ("_config",),
    ("_data",),
    ("_model",),
    ("_run",),
    ("_trackers",),
    ("_train",),
    ("integrations",),
    ("_eval",),
    ("_proof", "_doctor"),
    ("_studies",),
    ("_cli", "__init__", "__main__", "testing"),
)
_LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}
#: Modules of the run path (``reprotune run``), whose functions must fit on one screen.
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py"))


def _pillar(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imported_pillars(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "reprotune" and len(parts) > 1 and parts[1] in _LEVEL:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_point_downwards(path: Path) -> None:
    """Every reprotune import goes to the module's own pillar or one below it."""
    pillar = _pillar(path)
    assert pillar in _LEVEL, f"{pillar} is not in LAYERS (docs/architecture.md)"
    upward = sorted(p for p in _imported_pillars(path) if _LEVEL[p] > _LEVEL[pillar])
    assert not upward, f"{path.relative_to(SRC)} ({pillar}) imports from a pillar above it: {upward}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_modules_are_small_or_say_why(path: Path) -> None:
    """A module over 400 lines says in its docstring why its size is earned."""
    text = path.read_text(encoding="utf-8")
    if text.count("\n") <= MAX_MODULE_LINES:
        return
    docstring = ast.get_docstring(ast.parse(text)) or ""
    assert "over 400 lines on purpose" in docstring, f"{path.relative_to(SRC)}: {text.count(chr(10))} lines"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_functions_fit_on_a_screen(path: Path) -> None:
    """No function is longer than 80 lines (once the run path's rule; now every module's)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            where = f"{path.relative_to(SRC)}:{node.lineno} {node.name}"
            assert length <= MAX_FUNCTION_LINES, f"{where}: {length} lines"


#: The one import of a reprotune module inside a function outside the CLI, with its reason: the
#: entry of a run loads the distributed modules only under torchrun (no cycle: they do not import
#: ``_train.run``), so that a plain run neither calls nor imports them (tests/train/test_run.py).
_LOADED_WHEN_NEEDED = {("_train/run.py", "reprotune._train.dist_run")}


def test_no_import_inside_a_function_dodges_a_cycle() -> None:
    """Imports inside functions are only of heavy third-party modules (torch, transformers, ...)
    or of the CLI's command modules, never of another reprotune module to dodge a cycle."""
    offenders = []
    for path in _modules():
        if _pillar(path) == "_cli":
            continue  # commands import their work when run, so `--help` stays fast (documented there)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("reprotune"):
                    if (path.relative_to(SRC).as_posix(), node.module) in _LOADED_WHEN_NEEDED:
                        continue
                    offenders.append(f"{path.relative_to(SRC)}:{node.lineno} {node.module}")
    assert not offenders, offenders


def test_no_test_knob_in_the_product() -> None:
    """Fault injection (kill points, injected noise, a broken resume) lives in tests/inject and
    patches a process from outside; the overhead benchmark's switch is tests/recording.py's.
    No module of reprotune reads a test's variable or carries a test's hook."""
    knobs = (
        "REPROTUNE_KILL_AT",
        "REPROTUNE_NOISE_AT_STEP",
        "REPROTUNE_SKIP_RNG_RESTORE",
        "kill_point",
        "recording=",
    )
    offenders = [
        f"{path.relative_to(SRC)}: {knob}"
        for path in _modules()
        for knob in knobs
        if knob in path.read_text(encoding="utf-8")
    ]
    assert offenders == []


def test_test_modules_have_unique_names() -> None:
    """pytest imports test modules by their base name (rootdir mode, no packages): two test files
    of one name in different folders stop the whole collection."""
    names = [p.name for p in (SRC.parents[1] / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_one_run_writer() -> None:
    """Every path that writes a run directory ends an attempt in ``_train.writer.RunWriter``: the
    Trainer callback imports from ``_train`` that module alone, and no other module writes a run's
    ``outputs`` or finishes its trackers."""
    for path in sorted((SRC / "integrations").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        train_imports = {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("reprotune._train")
        }
        assert train_imports <= {"reprotune._train.writer"}, f"{path.relative_to(SRC)}: {train_imports}"
    finishers = sorted(
        str(path.relative_to(SRC))
        for path in _modules()
        if 'record["outputs"] =' in path.read_text(encoding="utf-8")
        or "trackers.finish(" in path.read_text(encoding="utf-8")
    )
    assert finishers == ["_train/writer.py"], finishers


def test_every_code_path_the_docs_name_exists() -> None:
    """A path to code or tests quoted in README.md or docs/ (`src/reprotune/_model/lora.py`) names a
    file that exists: modules moved in the renovation left docs naming `_model.py`, `tests/test_resume.py`."""
    root = Path(__file__).resolve().parent.parent
    quoted = re.compile(r"`((?:src/reprotune|tests|bench|scripts|examples)/[\w./-]+)`")
    missing = [
        f"{doc.relative_to(root)}: {path}"
        for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]
        for path in quoted.findall(doc.read_text(encoding="utf-8"))
        if not (root / path).exists()
    ]
    assert missing == []
