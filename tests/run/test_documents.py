"""``_jsonio.check_document``: the one check every reprotune file read back passes (its schema and
schema version), with the key at fault in the error's source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reprotune._documents import check_document, read_json_file
from reprotune._errors import InputError, SchemaVersionError

KW: dict[str, Any] = {
    "schema": "reprotune/thing",
    "versions": {1, 2},
    "what": "thing",
    "source": "t.json",
    "fix": "pass a thing",
    "version_fix": "use the reprotune that wrote it",
}


def test_a_document_of_a_version_read_is_returned_as_it_is() -> None:
    data = {"schema": "reprotune/thing", "schema_version": 2, "x": [1]}
    assert check_document(data, **KW) is data


@pytest.mark.parametrize(
    ("data", "message", "source", "fix"),
    [
        (
            [1, 2],
            "not a reprotune thing: the file holds a JSON array, not an object",
            "t.json",
            "pass a thing",
        ),
        ("x", "not a reprotune thing: the file holds a JSON string, not an object", "t.json", "pass a thing"),
        (None, "not a reprotune thing: the file holds null, not an object", "t.json", "pass a thing"),
        (
            {"schema": "other"},
            "schema is 'other', expected 'reprotune/thing'",
            "t.json: key 'schema'",
            "pass a thing",
        ),
        (
            {"schema": "reprotune/thing", "schema_version": 3},
            "thing schema_version 3 is not supported (this reprotune reads schema_version 1 or 2)",
            "t.json: key 'schema_version'",
            "use the reprotune that wrote it",
        ),
        (
            {"schema": "reprotune/thing", "schema_version": True},
            "schema_version True is not supported",
            "t.json: key 'schema_version'",
            "use the reprotune that wrote it",
        ),
        (
            {"schema": "reprotune/thing", "schema_version": [1]},
            "schema_version [1] is not supported",
            "t.json: key 'schema_version'",
            "use the reprotune that wrote it",
        ),
        (
            {"schema": "reprotune/thing"},
            "schema_version None is not supported",
            "t.json: key 'schema_version'",
            "use the reprotune that wrote it",
        ),
    ],
    ids=[
        "array",
        "string",
        "null",
        "other-schema",
        "future-version",
        "bool-version",
        "list-version",
        "no-version",
    ],
)
def test_anything_else_is_refused_naming_the_key_and_the_fix(
    data: Any, message: str, source: str, fix: str
) -> None:
    with pytest.raises(SchemaVersionError) as info:
        check_document(data, **KW)
    assert message in info.value.message
    assert (info.value.source, info.value.fix) == (source, fix)


def test_a_document_nested_too_deeply_to_parse_is_bad_input(tmp_path: Path) -> None:
    """200,000 nested arrays: an InputError naming the file (before, a RecursionError traceback
    from every reader: report, compare, verify's files)."""
    deep = tmp_path / "verification.json"
    deep.write_text("[" * 200_000 + "]" * 200_000, encoding="utf-8")
    with pytest.raises(InputError, match="verification is nested too deeply to be one") as info:
        read_json_file(deep, what="verification", fix="pass a verification directory")
    assert info.value.source == str(deep)
