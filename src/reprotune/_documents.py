"""Reading reprotune's JSON documents back: parsed with the line and column of a syntax error,
checked to be of the expected schema and version, and validated against the format's model, with
every problem named by its key; a JSON Lines file's lines each validated so, named by their line
(:func:`validated_line`). ``_jsonio`` writes them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from reprotune._errors import InputError, SchemaVersionError

if TYPE_CHECKING:  # pydantic is imported by the formats that use it, not by every JSON reader
    from pydantic import BaseModel, ValidationError

    Model = TypeVar("Model", bound=BaseModel)


def read_json_file(path: str | os.PathLike[str], *, what: str, fix: str) -> Any:
    """Parse the JSON file at ``path``; bad input raises ``InputError`` naming the file and the fix.

    Args:
        path: the file.
        what: what the file is, for messages (``"manifest"``, ``"record"``).
        fix: what the user can do when the file is missing or not JSON.

    Raises:
        InputError: the file is missing or unreadable, not UTF-8, not JSON (with line and column),
            or nested too deeply to parse.
    """
    file = Path(path)
    try:
        text = file.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} file {str(file)!r} does not exist", source=str(file), fix=fix) from None
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc}", source=str(file), fix=fix) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} is not UTF-8 text: {exc}", source=str(file), fix=fix) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{what} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            source=f"{file}:{exc.lineno}:{exc.colno}",
            fix=fix,
        ) from None
    except RecursionError:  # arrays or objects nested thousands deep: no document of reprotune's
        raise InputError(f"{what} is nested too deeply to be one", source=str(file), fix=fix) from None


#: What a parsed JSON file holds when it is no object, for messages.
_JSON_KINDS = {
    list: "a JSON array",
    str: "a JSON string",
    int: "a number",
    float: "a number",
    bool: "true or false",
    type(None): "null",
}


def check_document(
    data: Any, *, schema: str, versions: Collection[int], what: str, source: str, fix: str, version_fix: str
) -> dict[str, Any]:
    """``data`` (parsed JSON) as a reprotune document: an object whose ``schema`` is ``schema`` and
    whose ``schema_version`` is one of ``versions``. Every file reprotune reads back is checked so.

    Args:
        what: what the document is, for messages (``"run record"``, ``"manifest"``).
        source: where it came from (a path), named in the error with the key at fault.
        fix: what to do when it is not such a document at all.
        version_fix: what to do when it is one of a version this reprotune does not read.

    Raises:
        SchemaVersionError: another schema, or a version this reprotune does not read.
    """
    if not isinstance(data, dict):
        raise SchemaVersionError(
            f"not a reprotune {what}: the file holds {_JSON_KINDS.get(type(data), 'a JSON value')}, "
            f"not an object with schema {schema!r}",
            source=source,
            fix=fix,
        )
    if data.get("schema") != schema:
        raise SchemaVersionError(
            f"not a reprotune {what}: schema is {data.get('schema')!r}, expected {schema!r}",
            source=f"{source}: key 'schema'",
            fix=fix,
        )
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version not in versions:
        readable = " or ".join(str(v) for v in sorted(versions))
        raise SchemaVersionError(
            f"{what} schema_version {version!r} is not supported "
            f"(this reprotune reads schema_version {readable})",
            source=f"{source}: key 'schema_version'",
            fix=version_fix,
        )
    return data


def validation_problems(exc: ValidationError) -> list[str]:
    """A pydantic error as one line per problem: ``key.path[0]: what is wrong (got X)``."""
    lines = []
    for error in exc.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]).lstrip(".")
        message = str(error["msg"])
        got = "" if error["type"] == "missing" else f" (got {error.get('input')!r:.60})"
        lines.append(f"{where or '<top level>'}: {message[:1].lower()}{message[1:]}{got}")
    return lines


def validated(model: type[Model], data: Any, *, what: str, source: str, fix: str) -> Model:
    """``data`` (a parsed document, its schema checked by :func:`check_document`) as ``model``.

    Raises:
        InputError: every problem pydantic finds, each naming its key, in one message.
    """
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = validation_problems(exc)
        raise InputError(
            f"invalid {what} ({len(problems)} problem(s)): {'; '.join(problems)}", source=source, fix=fix
        ) from None


def jsonl_lines(text: str) -> list[str]:
    """The lines of a JSON Lines text, split at ``\\n`` only: ``str.splitlines`` would also split
    at U+2028, U+0085 and the like, which canonical JSON leaves raw inside strings (a model's
    generated text may hold them)."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def validated_line(model: type[Model], line: str | bytes, *, what: str, source: str, fix: str) -> Model:
    """One line of a JSON Lines file, parsed and validated as ``model``.

    Args:
        what: what a line is, for messages (``"prediction"``, ``"trace op"``).
        source: the file and line (``path:3``), named in the error.

    Raises:
        InputError: the line is not JSON or not a ``what``: every problem, each naming its key.
    """
    from pydantic import ValidationError

    try:
        return model.model_validate_json(line)
    except ValidationError as exc:
        problems = validation_problems(exc)
        raise InputError(f"not a {what}: {'; '.join(problems)}", source=source, fix=fix) from None
