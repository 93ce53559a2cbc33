"""``reprotune._formats``: one table of every JSON document reprotune writes. Each format stamps
documents its own check accepts and every other format's check refuses; no module spells a schema
name of its own; the typed models agree with the table; docs/run-directory.md lists every format."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pytest

from reprotune import _formats
from reprotune._errors import SchemaVersionError
from reprotune._formats import ALL, DocumentFormat

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "reprotune"


def test_every_format_has_its_own_schema_name() -> None:
    names = [f.schema for f in ALL]
    assert len(set(names)) == len(names)
    constants = [v for v in vars(_formats).values() if isinstance(v, DocumentFormat)]
    assert sorted(c.schema for c in constants) == sorted(names)  # ALL misses none


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.schema)
def test_a_stamped_document_passes_its_own_check_and_no_other(fmt: DocumentFormat) -> None:
    document = fmt.stamp({"x": 1})
    assert document == {"schema": fmt.schema, "schema_version": fmt.version, "x": 1}
    assert fmt.check(document, source="f.json", fix="f") is document
    assert fmt.holds(document)
    for other in ALL:
        if other is not fmt:
            assert not other.holds(document)
            with pytest.raises(SchemaVersionError, match=f"not a reprotune {re.escape(other.what)}"):
                other.check(document, source="f.json", fix="f")


def test_a_version_this_reprotune_does_not_read_is_refused_with_the_key() -> None:
    fmt = _formats.COMPARISON
    newer = {**fmt.stamp({}), "schema_version": fmt.version + 1}
    with pytest.raises(SchemaVersionError, match=f"reads schema_version {fmt.version}") as caught:
        fmt.check(newer, source="v.json", fix="f", version_fix="upgrade")
    assert caught.value.source == "v.json: key 'schema_version'"
    assert caught.value.fix == "upgrade"


def test_an_older_version_a_format_still_reads_is_accepted_and_no_other() -> None:
    fmt = _formats.VERIFICATION
    assert fmt.versions == {1, 2, 3, 4, 5} and fmt.version == 5
    for version in fmt.older:
        old = {**fmt.stamp({}), "schema_version": version}
        assert fmt.check(old, source="v.json", fix="f") is old
    with pytest.raises(SchemaVersionError, match="reads schema_version 1 or 2 or 3 or 4 or 5"):
        fmt.check({**fmt.stamp({}), "schema_version": 0}, source="v.json", fix="f")
    assert _formats.RECORD.versions == {1}


def test_a_body_stamped_already_keeps_its_own_keys() -> None:
    old = {"schema": "reprotune/record", "schema_version": 0, "run_id": "r"}
    assert _formats.RECORD.stamp(old) == old


def _literal_strings(tree: ast.AST) -> set[int]:
    """The ids of string constants inside ``Literal[...]`` annotations (a pydantic model's schema)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Literal":
            inside.update(id(n) for n in ast.walk(node.slice) if isinstance(n, ast.Constant))
    return inside


def test_no_module_spells_a_schema_name_of_its_own() -> None:
    names = {f.schema for f in ALL}
    spelled = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "_formats.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typed = _literal_strings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in typed:
                spelled.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value!r}")
    assert spelled == []


def test_the_typed_models_agree_with_the_table() -> None:
    from reprotune._run.checkpoint_files import StateFile
    from reprotune._run.record import RunRecord
    from reprotune._studies.studyfile import StudyFile

    for model, fmt in (
        (RunRecord, _formats.RECORD),
        (StateFile, _formats.CHECKPOINT),
        (StudyFile, _formats.STUDY),
    ):
        fields = model.model_fields
        assert typing.get_args(fields["schema_"].annotation) == (fmt.schema,), model
        assert typing.get_args(fields["schema_version"].annotation) == (fmt.version,), model


def test_docs_list_every_format_with_its_version() -> None:
    text = (ROOT / "docs" / "run-directory.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(reprotune/[a-z-]+)` \| (\d+) \|", text, flags=re.MULTILINE))
    assert rows == {f.schema: str(f.version) for f in ALL}
