"""Reading config YAML with the line and column of every key and value, and writing it back.

The dialect is YAML 1.2's core schema where YAML 1.1 surprises people: ``off``/``no``/``yes``
stay strings (``determinism.mode: off`` means the string ``off``), and ``2e-4`` is a float.

Hostile input is bounded before anything walks it: a document that expands to more than
:data:`MAX_NODES` values through its aliases (a "billion laughs" alias bomb), or that nests
deeper than Python can parse, is refused; the node graph is walked once per node, not once per
alias. A value that looks like a credential is refused unless tagged ``!not-secret``
(``_config.secrets``).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from reprotune._config.schema import dotted
from reprotune._config.secrets import NOT_SECRET_TAG, TOKEN_FIX, mask_url_credentials, token_problem
from reprotune._errors import ConfigError, InputError

#: Most values (mapping keys, values, list items, counted as if every alias were written out)
#: a config may expand to. A whole experiment config is a few hundred.
MAX_NODES = 10_000


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

# key path -> (mark of the key, mark of the value); paths use str keys and int list indices.
Marks = dict[tuple[str | int, ...], tuple[Any, Any]]


def mark_text(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def check_expansion(root: Any, source: str) -> None:
    """Refuse a node graph that expands (aliases written out) to more than :data:`MAX_NODES`.

    Walks each node once, without recursion; an alias that refers to its own ancestor (an
    endless document) is refused too.

    Raises:
        ConfigError: with the line of the first anchor and the fix.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > MAX_NODES:
                if len(sizes) > MAX_NODES:  # as many distinct values: a big document, no alias trick
                    raise ConfigError(
                        [
                            f"the YAML document holds more than {MAX_NODES:,} values (a config has a "
                            "few dozen); fix: pass the experiment config, not a data or results file"
                        ],
                        source=source,
                    )
                _refuse_expansion(node, source, f"expands to more than {MAX_NODES:,} values")
            continue
        if key in sizes:
            continue
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                _refuse_expansion(child, source, "refers to itself through an alias (it never ends)")
            if id(child) not in sizes:
                stack.append((child, False))


def _refuse_expansion(node: Any, source: str, problem: str) -> None:
    raise ConfigError(
        [
            f"the YAML document {problem} through its aliases (*name) [{mark_text(node.start_mark)}]; "
            "fix: write the values out instead of aliases that repeat aliases"
        ],
        source=source,
    )


def _collect_marks(root: Any, marks: Marks, problems: list[str], start: tuple[str | int, ...] = ()) -> None:
    """Record where every key and value sits, report duplicate keys (YAML keeps the last silently)
    and values that look like credentials. Each node is walked once (an alias is not re-walked)."""
    seen_nodes: set[int] = set()
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(root, start)]
    while stack:
        node, path = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "<key>"
                sub = (*path, key)
                if key in seen:
                    problems.append(
                        f"{dotted(sub)}: duplicate key [{mark_text(key_node.start_mark)}, first at "
                        f"{mark_text(seen[key])}]; fix: keep one"
                    )
                seen[key] = key_node.start_mark
                marks[sub] = (key_node.start_mark, value_node.start_mark)
                if isinstance(key_node, yaml.ScalarNode):
                    check_secret(key_node, path, problems)
                stack.append((value_node, sub))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                marks[(*path, index)] = (item.start_mark, item.start_mark)
                stack.append((item, (*path, index)))
        elif isinstance(node, yaml.ScalarNode):
            check_secret(node, path, problems)


def check_secret(node: Any, path: tuple[str | int, ...], problems: list[str]) -> None:
    """Append a problem when the scalar ``node`` looks like a credential and is not marked, or,
    outside ``tracking``, holds URL credentials, which the record masks whatever the mark."""
    if not isinstance(node.value, str):
        return
    if path[:1] != ("tracking",) and mask_url_credentials(node.value) != node.value:
        where = mark_text(node.start_mark)
        problems.append(
            f"{dotted(path)}: holds a URL with credentials or a secret query parameter, which the record "
            f"masks, so a rerun from the record would compute with other text [{where}]; "
            "fix: take the credentials out of the value (set them in the environment)"
        )
        return
    if node.tag == NOT_SECRET_TAG:
        return
    problem = token_problem(path, node.value)
    if problem is not None:
        problems.append(f"{dotted(path)}: {problem} [{mark_text(node.start_mark)}]; fix: {TOKEN_FIX}")


def parse_yaml(text: str, source: str) -> tuple[Any, Marks]:
    """Parse YAML text; return (data, marks). Raises ConfigError with line and column."""
    loader = Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return {}, {}
        check_expansion(node, source)
        marks: Marks = {}
        problems: list[str] = []
        _collect_marks(node, marks, problems)
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
    except RecursionError:
        raise ConfigError(
            ["the YAML document nests too deeply to read; fix: a config nests a few levels, not hundreds"],
            source=source,
        ) from None
    finally:
        loader.dispose()


def parse_yaml_value(text: str, path: tuple[str | int, ...] = ()) -> Any:
    """Parse one ``--set`` value as a YAML scalar or flow collection (``8``, ``2e-4``, ``[a, b]``, ``null``).

    Args:
        text: the value.
        path: the key it sets, for the credential check.

    Raises:
        InputError: the value is not valid YAML, is an alias bomb, or looks like a credential.
    """
    if not text.strip():
        return ""
    loader = Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_expansion(node, "--set")
        problems: list[str] = []
        _collect_marks(node, {}, problems, start=path)
        if problems:
            raise _set_problem(problems[0], path)
        return loader.construct_document(node)
    except ConfigError as exc:
        raise _set_problem(exc.problems[0], path) from None
    except (yaml.YAMLError, RecursionError) as exc:
        if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
            mark = exc.problem_mark
            detail = exc.problem + (f" at column {mark.column + 1}" if mark is not None else "")
        else:
            detail = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise InputError(
            mask_url_credentials(f"value {text[:80]!r} is not valid YAML: {detail}"),
            fix="close its brackets and braces; to pass the value as text, put YAML quotes inside "
            "the shell's, e.g. --set \"key='a: [b'\"",
        ) from None
    finally:
        loader.dispose()


def _set_problem(problem: str, path: tuple[str | int, ...]) -> InputError:
    """A problem found in one ``--set`` value, without what only a file has: the key (the caller
    names the ``--set``) and a line and column (always line 1)."""
    message, _, fix = problem.partition("; fix: ")
    message = re.sub(r" \[line \d+, column \d+[^\]]*\]", "", message)
    key = f"{dotted(path)}: "
    return InputError(message[len(key) :] if path and message.startswith(key) else message, fix=fix)


def not_secret_marked(data: Any, path: tuple[str | int, ...] = ()) -> Any:
    """``data`` with each text that :func:`token_problem` would refuse as a :class:`NotSecret`,
    so that a config written back to YAML (``config.yaml``) loads again as it was accepted."""
    if isinstance(data, dict):
        return {key: not_secret_marked(value, (*path, str(key))) for key, value in data.items()}
    if isinstance(data, list):
        return [not_secret_marked(value, (*path, index)) for index, value in enumerate(data)]
    if isinstance(data, str) and token_problem(path, data) is not None:
        return NotSecret(data)
    return data
