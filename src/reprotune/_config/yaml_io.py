"""Reading config YAML with the line and column of every key and value, and writing it back.

The dialect is YAML 1.2's core schema where YAML 1.1 surprises people: ``off``/``no``/``yes``
stay strings (``determinism.mode: off`` means the string ``off``), ``2e-4`` is a float, ``1:30``
and ``2024-02-30`` are strings (1.1 reads 90 and a date), ``0o17`` is octal and a number with a
leading zero that 1.1 and 1.2 read otherwise (``0123``, octal 83 in 1.1, 123 in 1.2; not ``07``) is
refused as ambiguous. ``_`` may group
digits (``1_000``). Merge keys (``<<: *common``) work, and a merged key is located where its value
is written ("merged in by << at ...").

Hostile input is bounded before anything walks it: a character YAML does not allow (a NUL, an
ESC) is named with its line and column; a document that expands to more than :data:`MAX_NODES`
values through its aliases (a "billion laughs" alias bomb), or that nests deeper than Python can
parse, is refused by a walk that visits each node once, so the walk that then locates every value
(aliases and merges written out) is bounded too. A value that looks like a credential is refused
unless tagged ``!not-secret`` (``_config.secrets``).

The dialect itself (the Loader, the Dumper, numbers) is :mod:`reprotune._config.yaml_dialect`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from reprotune._config.schema import dotted
from reprotune._config.secrets import NOT_SECRET_TAG, TOKEN_FIX, mask_url_credentials, token_problem
from reprotune._config.yaml_dialect import INT_TAG, MERGE_TAG, Loader, NotSecret, number_problem
from reprotune._errors import ConfigError, InputError

#: Most values (mapping keys, values, list items, counted as if every alias were written out)
#: a config may expand to. A whole experiment config is a few hundred.
MAX_NODES = 10_000


# key path -> (mark of the key, mark of the value); paths use str keys and int list indices.
Marks = dict[tuple[str | int, ...], tuple[Any, Any]]


@dataclass(frozen=True)
class MergedMark:
    """Where a value that a ``<<`` merge key brought in is written, and the ``<<``'s own mark."""

    line: int
    column: int
    merge: Any


def mark_text(mark: Any) -> str:
    """``line L, column C`` (1-based), and for a merged value ``, merged in by << at line L, column C``."""
    text = f"line {mark.line + 1}, column {mark.column + 1}"
    merge = getattr(mark, "merge", None)
    return text if merge is None else f"{text}, merged in by << at {mark_text(merge)}"


def _at(mark: Any, merge: Any) -> Any:
    return mark if merge is None else MergedMark(mark.line, mark.column, merge)


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


def _entries(node: Any) -> list[tuple[Any, Any, Any]]:
    """(key node, value node, mark of the ``<<`` that merged it in or None) for each entry of a
    mapping: its own entries first, then the merged ones in order (the first of a key wins)."""
    own = [(key, value, None) for key, value in node.value if key.tag != MERGE_TAG]
    for key, value in node.value:
        if key.tag == MERGE_TAG:
            sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
            for source in sources:
                if isinstance(source, yaml.MappingNode):  # else the constructor refuses it
                    own.extend((k, v, key.start_mark) for k, v, _ in _entries(source))
    return own


def _collect_marks(root: Any, marks: Marks, problems: list[str], start: tuple[str | int, ...] = ()) -> None:
    """Record where every key and value sits, report duplicate keys (YAML keeps the last silently),
    values that look like credentials, numbers that read as no one number and flow-mapping keys
    missing the space after their colon. A value reached through an alias or a ``<<`` merge is
    located where it is written; ``check_expansion`` has bounded how many values that is. Each node
    is checked once (a credential at the first path that flags it)."""
    checked: set[int] = set()
    flagged: set[int] = set()

    def secret(scalar: Any, at: tuple[str | int, ...]) -> None:
        if id(scalar) not in flagged:
            count = len(problems)
            check_secret(scalar, at, problems)
            if len(problems) > count:
                flagged.add(id(scalar))

    stack: list[tuple[Any, tuple[str | int, ...], Any]] = [(root, start, None)]
    while stack:
        node, path, merge = stack.pop()
        first_visit = id(node) not in checked
        checked.add(id(node))
        if isinstance(node, yaml.MappingNode):
            merges = [key for key, _ in node.value if key.tag == MERGE_TAG]
            if first_visit and len(merges) > 1:  # PyYAML would merge both, the last winning
                problems.append(
                    f"{dotted((*path, '<<'))}: duplicate key [{mark_text(merges[1].start_mark)}, first at "
                    f"{mark_text(merges[0].start_mark)}]; fix: keep one (merge several: <<: [*a, *b])"
                )
            seen: dict[str, Any] = {}
            for key_node, value_node, merged_by in _entries(node):
                key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "<key>"
                sub = (*path, key)
                if key in seen:
                    if merged_by is not None:
                        continue  # a merged key the mapping (or an earlier merge) sets itself
                    if first_visit:
                        problems.append(
                            f"{dotted(sub)}: duplicate key [{mark_text(key_node.start_mark)}, first at "
                            f"{mark_text(seen[key])}]; fix: keep one"
                        )
                seen[key] = key_node.start_mark
                via = merged_by or merge
                marks[sub] = (_at(key_node.start_mark, via), _at(value_node.start_mark, via))
                if first_visit and node.flow_style and merged_by is None:
                    _check_flow_entry(key_node, value_node, path, problems)
                if isinstance(key_node, yaml.ScalarNode):
                    secret(key_node, path)
                stack.append((value_node, sub, via))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                marks[(*path, index)] = (_at(item.start_mark, merge), _at(item.start_mark, merge))
                stack.append((item, (*path, index), merge))
        elif isinstance(node, yaml.ScalarNode):
            if first_visit and node.tag == INT_TAG and node.style is None:
                found = number_problem(node.value)
                if found is not None:
                    where = mark_text(_at(node.start_mark, merge))
                    problems.append(f"{dotted(path)}: {found[0]} [{where}]; fix: {found[1]}")
            secret(node, path)


def _check_flow_entry(
    key_node: Any, value_node: Any, path: tuple[str | int, ...], problems: list[str]
) -> None:
    """``{lora_init:7}`` is the key ``lora_init:7`` with no value: YAML wants ``{lora_init: 7}``."""
    key = key_node.value
    if (
        isinstance(key_node, yaml.ScalarNode)
        and key_node.style is None
        and ":" in str(key)
        and isinstance(value_node, yaml.ScalarNode)
        and value_node.tag == "tag:yaml.org,2002:null"
        and value_node.value == ""
    ):
        name, _, value = str(key).partition(":")
        problems.append(
            f"{dotted(path)}: {key!r} is read as a key with no value [{mark_text(key_node.start_mark)}]; "
            f"fix: put a space after the colon, as YAML flow mappings need: {{{name}: {value.strip()}}}"
        )


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


_LINE_BREAK = re.compile("\r\n|[\n\r\x85\u2028\u2029]")  # as PyYAML counts lines
_CHARACTER_FIX = (
    "delete it; a value that needs a control character writes it as an escape inside double "
    'quotes, e.g. "a\\x1bb"'
)


def unreadable_character(text: str) -> tuple[str, int, int, int] | None:
    """(``the character U+0000 ('\\x00')``, line, column, how many in all) for the first character
    YAML does not allow in ``text`` (control characters but tab and line breaks), or None."""
    match = yaml.reader.Reader.NON_PRINTABLE.search(text)
    if match is None:
        return None
    breaks = list(_LINE_BREAK.finditer(text, 0, match.start()))
    column = match.start() - (breaks[-1].end() if breaks else 0) + 1
    count = len(yaml.reader.Reader.NON_PRINTABLE.findall(text))
    return f"the character U+{ord(match.group()):04X} ({match.group()!r})", len(breaks) + 1, column, count


def parse_yaml(text: str, source: str) -> tuple[Any, Marks]:
    """Parse YAML text; return (data, marks). Raises ConfigError with line and column."""
    bad = unreadable_character(text)
    if bad is not None:
        what, line, column, count = bad
        more = f"; {count:,} such characters in all" if count > 1 else ""
        raise ConfigError(
            [f"{what} is not allowed in YAML [line {line}, column {column}]{more}; fix: {_CHARACTER_FIX}"],
            source=source,
        )
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
    except (ValueError, OverflowError) as exc:  # a value YAML matched but Python cannot build
        raise ConfigError(
            [f"YAML cannot build a value: {exc}; fix: quote it to keep it as text"], source=source
        ) from None
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
        InputError: the value is not valid YAML, holds a control character or a comment (which
            YAML would drop: ``#1 rule`` would be null), is an alias bomb, or looks like a credential.
    """
    if not text.strip():
        return ""
    shown = mask_url_credentials(repr(text[:80]))
    bad = unreadable_character(text)
    if bad is not None:
        raise InputError(
            f"value {shown} holds {bad[0]} at column {bad[2]}, which YAML does not allow", fix=_CHARACTER_FIX
        )
    loader = Loader(text)
    try:
        node = loader.get_single_node()
        comment = text[node.end_mark.index :].strip() if node is not None else text.strip()
        if comment.startswith("#"):
            raise _comment_problem(text, shown, path, whole=node is None)
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
    except (ValueError, OverflowError) as exc:
        raise InputError(
            f"YAML cannot build the value {shown}: {exc}", fix="quote it to keep it as text"
        ) from None
    except (yaml.YAMLError, RecursionError) as exc:
        if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
            mark = exc.problem_mark
            detail = exc.problem + (f" at column {mark.column + 1}" if mark is not None else "")
        else:
            detail = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise InputError(
            mask_url_credentials(f"value {shown} is not valid YAML: {detail}"),
            fix="close its brackets and braces; to pass the value as text, put YAML quotes inside "
            "the shell's, e.g. --set \"key='a: [b'\"",
        ) from None
    finally:
        loader.dispose()


def _comment_problem(text: str, shown: str, path: tuple[str | int, ...], *, whole: bool) -> InputError:
    """A ``--set`` value with a ``#`` comment, which YAML drops without a word."""
    what = (
        "is all YAML comment (# starts one), so it would be null"
        if whole
        else "ends in a YAML comment, which YAML drops"
    )
    plain = not set(text) & set("'\"\\") and len(text) <= 80 and mask_url_credentials(text) == text
    example = f"--set '{dotted(path)}=\"{text}\"'" if path and plain else "--set 'key=\"#1 rule\"'"
    return InputError(
        f"value {shown} {what}",
        fix=f"to pass it as text, put YAML quotes inside the shell's: {example}",
    )


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
