"""The YAML dialect of configs: YAML 1.2's core booleans and numbers (``int_value``, and
``number_problem`` for a plain scalar that stands for no one number), no timestamps, the
``!not-secret`` tag, and a Dumper that quotes exactly the strings the Loader would read as another
type (see :mod:`reprotune._config.yaml_io`, which reads configs with it)."""

from __future__ import annotations

import re
import sys
from typing import Any

import yaml

from reprotune._config.secrets import NOT_SECRET_TAG


class Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core booleans, numbers and no timestamps (see the module doc)."""


class Dumper(yaml.SafeDumper):
    """SafeDumper that quotes exactly the strings :class:`Loader` would read as another type."""


BOOL_TAG, INT_TAG, FLOAT_TAG = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
MERGE_TAG = "tag:yaml.org,2002:merge"
# YAML 1.2 core, with ``_`` between digits as 1.1 and Python allow. A decimal with a leading zero
# resolves as an int so that it is refused (``number_problem``) and a string like it is quoted.
_INT_RE = re.compile(r"^(?:[-+]?[0-9][0-9_]*|0o[0-7][0-7_]*|0x[0-9a-fA-F][0-9a-fA-F_]*)$")
_FLOAT_RE = re.compile(
    r"""^(?:[-+]?(?:\.[0-9][0-9_]*|[0-9][0-9_]*\.[0-9_]*|[0-9][0-9_]*(?=[eE]))(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""",
    re.X,
)
_LEADING_ZERO = re.compile(r"[-+]?0[0-9_]*[0-9]")


def _yaml12_resolvers() -> dict[Any, list[tuple[str, re.Pattern[str]]]]:
    # 1.1's timestamps (``2024-02-30`` crashed) and ``=`` (a "value" tag no constructor builds) go.
    dropped = {BOOL_TAG, INT_TAG, FLOAT_TAG, "tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:value"}
    resolvers = {
        first: [(tag, regexp) for tag, regexp in entries if tag not in dropped]
        for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    bool_re = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
    for first in "tTfF":
        resolvers.setdefault(first, []).append((BOOL_TAG, bool_re))
    for first in "-+0123456789":
        resolvers.setdefault(first, []).append((INT_TAG, _INT_RE))
    for first in "-+.0123456789":
        resolvers.setdefault(first, []).append((FLOAT_TAG, _FLOAT_RE))
    return {first: entries for first, entries in resolvers.items() if entries}


def int_value(text: str) -> int:
    """The int a scalar that :data:`_INT_RE` matched stands for (``0o17``, ``0x1F``, ``1_000``).

    Raises:
        ValueError: a decimal longer than Python converts (``sys.get_int_max_str_digits``).
    """
    digits = text.replace("_", "")
    if digits[:2] in ("0o", "0x"):
        return int(digits[2:], 8 if digits[1] == "o" else 16)
    return int(digits)


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    return int_value(str(loader.construct_scalar(node)))  # type: ignore[arg-type]


def _cut(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:12]}..."


def _same_either_way(text: str) -> bool:
    """Whether YAML 1.1 (octal) and 1.2 (decimal) read a leading-zero number alike: ``00``,
    ``07``, ``0_1`` (one octal digit after the zeros)."""
    digits = text.lstrip("+-").replace("_", "").lstrip("0")
    return len(digits) <= 1 and digits in ("", *"01234567")


def number_problem(text: str) -> tuple[str, str] | None:
    """(problem, fix) for a plain scalar that resolves as an int but stands for no one number."""
    if _LEADING_ZERO.fullmatch(text) and not _same_either_way(text):
        body = text.lstrip("+-")
        sign, digits = text[: len(text) - len(body)], body.replace("_", "")
        decimal = _cut(sign + (digits.lstrip("0") or "0"))
        octal, as_octal = "", "as text"
        if set(digits) <= set("01234567"):
            as_octal = f"as octal {int(sign + digits, 8)}" if len(digits) <= 24 else "as octal"
            if not sign and len(digits.lstrip("0")) > 1:  # 0o7 would be 7 either way
                octal = f", 0o{_cut(digits.lstrip('0'))} for octal"
        return (
            f"{_cut(text)} has a leading zero: YAML 1.1 reads it {as_octal}, YAML 1.2 as {decimal}; "
            "refused as ambiguous",
            f'write {decimal}{octal}, or quote it ("{_cut(text)}") for text',
        )
    try:
        int_value(text)
    except ValueError:
        count = sum(ch.isdigit() for ch in text)
        return (
            f"the number {text[:12]}... has {count:,} digits, more than Python reads "
            f"({sys.get_int_max_str_digits():,})",
            "write a smaller number (a seed is below 2**64), or quote it for text",
        )
    return None


Loader.yaml_implicit_resolvers = _yaml12_resolvers()
Dumper.yaml_implicit_resolvers = _yaml12_resolvers()
Loader.add_constructor(INT_TAG, _construct_int)


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Multi-line strings (the prompt template) read best as literal blocks.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


Dumper.add_representer(str, _represent_str)


class NotSecret(str):
    """A text the user marked ``!not-secret``: dumped with that tag, so it loads again."""


def _construct_not_secret(loader: yaml.SafeLoader, node: yaml.Node) -> str:
    if not isinstance(node, yaml.ScalarNode):
        raise yaml.constructor.ConstructorError(
            None, None, f"{NOT_SECRET_TAG} marks one text value, not a list or mapping", node.start_mark
        )
    return str(loader.construct_scalar(node))


def _represent_not_secret(dumper: yaml.SafeDumper, value: NotSecret) -> yaml.ScalarNode:
    return dumper.represent_scalar(NOT_SECRET_TAG, str(value))


Loader.add_constructor(NOT_SECRET_TAG, _construct_not_secret)
Dumper.add_representer(NotSecret, _represent_not_secret)
