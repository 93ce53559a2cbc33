"""The HTML kit (reprotune._html): one stylesheet colours every verdict a page shows, and a badge
escapes what it is given."""

from __future__ import annotations

import re
from typing import get_args

from reprotune._eval.compare import EvalVerdict
from reprotune._html import CSS, badge
from reprotune._proof.differences import Verdict


def _colour(kind: str) -> str | None:
    """The background the stylesheet gives ``.verdict.KIND`` (None: no rule names it)."""
    for selectors, colour in re.findall(r"([^{}]+)\{\s*background:\s*(#[0-9a-f]{6});\s*\}", CSS):
        if f".verdict.{kind}" in [s.strip() for s in selectors.split(",")]:
            return str(colour)
    return None


def test_every_verdict_a_page_shows_has_its_colour_in_the_one_stylesheet() -> None:
    """Run comparisons, eval comparisons and a study's test share one rule per meaning: what
    reproduced (or stayed within the noise) is green, what parted is red, what could not be
    compared is purple; no page carries its own colours."""
    same = {"IDENTICAL", "WITHIN_TOLERANCE", "within"}
    parted = {"DIVERGED", "beyond"}
    kinds = {v.value for v in Verdict} | set(get_args(EvalVerdict)) | same | parted
    for kind in kinds:
        expected = "#2e7d32" if kind in same else "#c62828" if kind in parted else "#6a1b9a"
        assert _colour(kind) == expected, kind


def test_a_badge_escapes_its_kind_and_label() -> None:
    assert badge("DIVERGED", "<b>") == '<span class="verdict DIVERGED">&lt;b&gt;</span>'
    assert badge('x" onclick="y', "ok") == '<span class="verdict x&quot; onclick=&quot;y">ok</span>'
