"""The embedded dataset ``builtin:chatterbot-en``: the English chatterbot corpus as rows.

The corpus ships as 21 YAML files in the PyPI package ``chatterbot-corpus`` (``chatterbot_corpus/
data/english/*.yml``). Each file holds ``categories`` and ``conversations``; a conversation is a
list of two or more utterances. Most are a question and its answer, but some hold a longer
exchange (``health.yml`` is one 9-turn conversation; ``trivia.yml`` has one of 88 turns), and in
``emotion.yml`` the turns after the first are alternative answers. One entry is not a list:
by an indentation slip, conversation 14 of ``trivia.yml`` is the single string
``In a game of bingo, ... "two little ducks"? - '22'``; a string conversation is read as the
question and answer it holds, split at its last ``" - "`` with the YAML quotes removed.

One row per conversation, in a fixed order (files sorted by name, conversations in file order):

- ``prompt``: the first utterance;
- ``response``: the remaining utterances joined with ``"\\n"``;
- ``category``: the file's name without ``.yml`` (``ai``, ``tech_support``, ...), a stable
  identifier, where the files' own ``categories`` labels are free text.

That gives 2,026 rows in 21 categories; ``health`` has a single row. The package is located with
``importlib.util.find_spec`` so nothing of it is imported, and YAML is read with PyYAML's safe
loader (C-accelerated where available).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from reprotune._builtins import BUILTIN_DATA, BUILTIN_PREFIX
from reprotune._errors import InputError

CHATTERBOT_EN = BUILTIN_PREFIX + "chatterbot-en"
BUILTIN_NAMES = tuple(BUILTIN_PREFIX + name for name in BUILTIN_DATA)


def chatterbot_dir() -> Path:
    """The directory holding the English corpus YAML files.

    Raises:
        InputError: the ``chatterbot-corpus`` package is not installed.
    """
    spec = importlib.util.find_spec("chatterbot_corpus")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            "the package chatterbot-corpus, which holds builtin:chatterbot-en, is not installed",
            source=CHATTERBOT_EN,
            fix="pip install chatterbot-corpus==1.3.3",
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "english"


def _yaml_load(path: Path) -> Any:
    import yaml  # local: only the builtin dataset needs YAML

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=loader)  # a safe loader (CSafeLoader or SafeLoader)


def load_chatterbot_columns() -> dict[str, list[str]]:
    """Read the corpus into three columns (``prompt``, ``response``, ``category``).

    Returns:
        Column name -> list of string values, one per conversation, in the documented order.

    Raises:
        InputError: the package is missing, or a file does not have the expected structure.
    """
    directory = chatterbot_dir()
    files = sorted(directory.glob("*.yml"), key=lambda p: p.name)
    if not files:
        raise InputError(
            f"no .yml files in {directory}",
            source=CHATTERBOT_EN,
            fix="reinstall chatterbot-corpus==1.3.3",
        )
    prompts: list[str] = []
    responses: list[str] = []
    categories: list[str] = []
    for path in files:
        doc = _yaml_load(path)
        conversations = doc.get("conversations") if isinstance(doc, dict) else None
        if not isinstance(conversations, list):
            raise InputError(
                "expected a mapping with a 'conversations' list",
                source=str(path),
                fix="reinstall chatterbot-corpus==1.3.3",
            )
        for number, turns in enumerate(conversations, start=1):
            if isinstance(turns, str) and " - " in turns:
                question, _, answer = turns.rpartition(" - ")
                turns = [question, answer.strip().strip("'\"")]
            if not isinstance(turns, list) or len(turns) < 2:
                raise InputError(
                    f"conversation {number} is not a list of at least two utterances: {turns!r}",
                    source=f"{path}, conversation {number}",
                    fix="reinstall chatterbot-corpus==1.3.3",
                )
            # YAML may read an utterance such as "yes" or "42" as a bool or a number.
            texts = [str(turn) for turn in turns]
            prompts.append(texts[0])
            responses.append("\n".join(texts[1:]))
            categories.append(path.stem)
    return {"prompt": prompts, "response": responses, "category": categories}
