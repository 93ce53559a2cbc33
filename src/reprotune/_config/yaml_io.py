"""Reading config YAML with the line and column of every key and value, and writing it back.

The dialect is YAML 1.2's core schema where YAML 1.1 surprises people: ``off``/``no``/``yes``
stay strings (``determinism.mode: off`` means the string ``off``), and ``2e-4`` is a float.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from reprotune._config.schema import dotted
from reprotune._errors import ConfigError, InputError


class Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans (only true/false) and floats like ``2e-4``."""


class Dumper(yaml.SafeDumper):
    """SafeDumper that quotes exactly the strings :class:`Loader` would read as another type."""


def _yaml12_resolvers() -> dict[Any, list[tuple[str, re.Pattern[str]]]]:
    bool_tag, float_tag = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"
    resolvers = {
        first: [(tag, regexp) for tag, regexp in entries if tag != bool_tag]
        for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    bool_re = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
    for first in "tTfF":
        resolvers.setdefault(first, []).append((bool_tag, bool_re))
    float_re = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
    for first in "-+0123456789":
        resolvers.setdefault(first, []).append((float_tag, float_re))
    return resolvers


Loader.yaml_implicit_resolvers = _yaml12_resolvers()
Dumper.yaml_implicit_resolvers = _yaml12_resolvers()


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Multi-line strings (the prompt template) read best as literal blocks.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


Dumper.add_representer(str, _represent_str)

# key path -> (mark of the key, mark of the value); paths use str keys and int list indices.
Marks = dict[tuple[str | int, ...], tuple[Any, Any]]


def mark_text(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _collect_marks(node: Any, path: tuple[str | int, ...], marks: Marks, problems: list[str]) -> None:
    """Record where every key and value sits, and report duplicate keys (YAML keeps the last silently)."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            sub = (*path, key)
            if key in seen:
                problems.append(
                    f"{dotted(sub)}: duplicate key [{mark_text(key_node.start_mark)}, first at "
                    f"{mark_text(seen[key])}]; fix: keep one"
                )
            seen[key] = key_node.start_mark
            marks[sub] = (key_node.start_mark, value_node.start_mark)
            _collect_marks(value_node, sub, marks, problems)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            marks[(*path, index)] = (item.start_mark, item.start_mark)
            _collect_marks(item, (*path, index), marks, problems)


def parse_yaml(text: str, source: str) -> tuple[Any, Marks]:
    """Parse YAML text; return (data, marks). Raises ConfigError with line and column."""
    loader = Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return {}, {}
        marks: Marks = {}
        problems: list[str] = []
        _collect_marks(node, (), marks, problems)
        if problems:
            raise ConfigError(problems, source=source)
        return loader.construct_document(node), marks
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" [{mark_text(mark)}]" if mark is not None else ""
        problem = exc.problem or exc.context or "malformed YAML"
        raise ConfigError(
            [f"malformed YAML: {problem}{where}; fix: check indentation, colons and quotes there"],
            source=source,
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"malformed YAML: {exc}; fix: check the file is YAML"], source=source) from None
    finally:
        loader.dispose()


def parse_yaml_value(text: str) -> Any:
    """Parse one ``--set`` value as a YAML scalar or flow collection (``8``, ``2e-4``, ``[a, b]``, ``null``).

    Raises:
        InputError: the value is not valid YAML.
    """
    try:
        return yaml.load(text, Loader=Loader) if text.strip() else ""
    except yaml.YAMLError as exc:
        raise InputError(
            f"value {text!r} is not valid YAML: {exc}", fix="quote it, e.g. key='a: b'"
        ) from None
