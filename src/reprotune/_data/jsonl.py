"""Reading a JSONL file into columns: one JSON object a line, each line checked and named on
error (not UTF-8, not JSON, not an object, nested too deep, a lone surrogate, a key given twice,
an integer too long for Python to read).
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from reprotune._data.table import Column
from reprotune._errors import InputError


def decode_line(raw: bytes, source: str, lineno: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"line {lineno} is not UTF-8 (byte {exc.start + 1}: {raw[exc.start : exc.start + 1]!r})",
            source=f"{source}:{lineno}:{exc.start + 1}",
            fix="save the file as UTF-8",
        ) from exc


def parse_jsonl(data: bytes, source: str) -> dict[str, Column]:
    rows: list[dict[str, Any]] = []
    names: dict[str, None] = {}  # insertion-ordered set: columns in order of first appearance
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        text = decode_line(raw, source, lineno)
        if lineno == 1:
            text = text.removeprefix("\ufeff")  # a byte order mark (Notepad's) is no content
        if not text.strip():
            continue  # blank lines (a trailing newline, spacing) hold no row
        try:
            row = json.loads(text)
            if isinstance(row, dict) and len(_KEY.findall(text)) != len(row):  # nested, or repeated
                json.loads(text, object_pairs_hook=_refuse_repeated_keys)
            if text.count("[") + text.count("{") > MAX_DEPTH and _depth(row) > MAX_DEPTH:
                raise RecursionError
        except RecursionError:
            raise InputError(
                f"line {lineno} nests values more than {MAX_DEPTH} levels deep",
                source=f"{source}:{lineno}",
                fix="make every line one flat JSON object of columns (values nest a few levels at most)",
            ) from None
        except _RepeatedKey as exc:
            raise InputError(
                f"line {lineno} gives key {exc.key!r} twice: JSON keeps only the last value, so the "
                "first would be lost without a word",
                source=f"{source}:{lineno}",
                fix=f"keep one {exc.key!r} in that object (or rename one)",
            ) from None
        except json.JSONDecodeError as exc:
            raise InputError(
                f"line {lineno} is not valid JSON: {exc.msg} (line {lineno}, column {exc.colno}): "
                f"{text[:80]!r}",
                source=f"{source}:{lineno}:{exc.colno}",
                fix="make every non-blank line one JSON object",
            ) from exc
        except ValueError as exc:  # json.loads's one other: int() refuses a number of too many digits
            where = f", column {key!r}," if (key := _long_integer_key(text)) is not None else ""
            raise InputError(
                f"line {lineno}{where} holds an integer of more than {sys.get_int_max_str_digits():,} "
                "digits, the most Python reads as a number",
                source=f"{source}:{lineno}",
                fix="write the number as a string (in quotes)",
            ) from exc
        if not isinstance(row, dict):
            raise InputError(
                f"line {lineno} is a JSON {type(row).__name__}, not an object: {text[:80]!r}",
                source=f"{source}:{lineno}:1",
                fix='make every non-blank line one JSON object such as {"prompt": ..., "response": ...}',
            )
        if "\\u" in text and (column := _surrogate_column(row)) is not None:
            raise InputError(
                f"line {lineno}, column {column!r} holds a lone UTF-16 surrogate (a \\ud800-\\udfff "
                "escape that is half a character): no text can be hashed, tokenized or written with it",
                source=f"{source}:{lineno}",
                fix="write the character itself, or its full surrogate pair (e.g. \\ud83d\\ude00)",
            )
        for key in row:
            names.setdefault(key, None)
        rows.append(row)
    if rows and not names:
        raise InputError(
            f"every one of the {len(rows)} rows is an empty object {{}}: no row holds a column",
            source=source,
            fix='give each row its columns, e.g. {"prompt": ..., "response": ...}',
        )
    return {name: [row.get(name) for row in rows] for name in names}


#: Where a key ends (a string, then its colon): never fewer than the keys of a line's objects.
_KEY = re.compile(r'"\s*:')


class _RepeatedKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s object hook: the object, or :class:`_RepeatedKey` for a key given twice."""
    row: dict[str, Any] = {}
    for key, value in pairs:
        if key in row:
            raise _RepeatedKey(key)
        row[key] = value
    return row


def _surrogate_column(row: dict[str, Any]) -> str | None:
    """The first column of ``row`` whose name or value holds a lone surrogate, or None."""
    for key, value in row.items():
        stack: list[Any] = [key, value]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                if not item.isascii() and any("\ud800" <= ch <= "\udfff" for ch in item):
                    return key
            elif isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
    return None


def _long_integer_key(text: str) -> str | None:
    """The first key of the line's object whose value holds an integer of more digits than
    ``int()`` reads (``sys.get_int_max_str_digits``), or None (the line is no object)."""
    limit, too_long = sys.get_int_max_str_digits(), object()
    row = json.loads(text, parse_int=lambda digits: too_long if len(digits.lstrip("-")) > limit else 0)
    if not isinstance(row, dict):
        return None
    for key, value in row.items():
        stack: list[Any] = [value]
        while stack:
            item = stack.pop()
            if item is too_long:
                return str(key)
            if isinstance(item, dict | list):
                stack.extend(item.values() if isinstance(item, dict) else item)
    return None


#: Deepest nesting of lists and objects accepted in a JSONL value (rows are hashed recursively).
MAX_DEPTH = 100


def _depth(value: Any) -> int:
    """How deep lists and dicts nest in ``value`` (a scalar is 0), without recursion."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level + 1)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest
