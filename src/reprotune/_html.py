"""The HTML kit of every page reprotune writes (``report`` of runs and their evals, study and
significance reports): one stylesheet, the page's head, tables whose cells escape what they show,
and figures (an inline SVG from ``_charts``). Self-contained pages: no script, no fetch."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

__all__ = ["CSS", "GENERATOR", "badge", "cell", "escape", "figure_svg", "head", "table"]

#: In the head of every page: how ``report`` and ``significance --report`` know a page they may
#: replace (``_run.outputs.reprotune_page``).
GENERATOR = '<meta name="generator" content="reprotune">'

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { font-size: 1.6em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.92em; max-width: 100%; }
td { overflow-wrap: anywhere; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, td.val { font-family: ui-monospace, monospace; word-break: break-all; }
figure { margin: 0.6em 0; } img, svg { max-width: 100%; height: auto; }
.verdict { padding: 0.1em 0.5em; border-radius: 0.3em; color: #fff; font-weight: 600; }
.verdict.IDENTICAL, .verdict.WITHIN_TOLERANCE, .verdict.within { background: #2e7d32; }
.verdict.DIVERGED, .verdict.beyond { background: #c62828; } .verdict.INCOMPARABLE { background: #6a1b9a; }
"""


def head(title: str, css: str = "") -> list[str]:
    """The page up to ``<body>``: the shared stylesheet and the page's own rules (``css``)."""
    return [
        "<!DOCTYPE html>",
        f'<html lang="en"><head><meta charset="utf-8">{GENERATOR}',
        f"<title>{escape(title)}</title>",
        f"<style>{CSS}{css}</style></head><body>",
    ]


def page_bytes(page: str) -> bytes:
    """A page's UTF-8 bytes. A name that is not UTF-8 (a directory's bytes, which Python holds as
    surrogates) shows as its escape (``\\udce9``): it cannot be written as UTF-8, and was a
    traceback."""
    return page.encode("utf-8", errors="backslashreplace")


def table(
    header: Sequence[str], rows: Iterable[Sequence[Any]], css: str = "", *, absent: str = "(absent)"
) -> str:
    """A table of ``rows`` under ``header`` (every cell through :func:`cell`)."""
    head_row = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(value, absent=absent) for value in row) + "</tr>" for row in rows)
    attr = f' class="{css}"' if css else ""
    return f"<table{attr}><thead><tr>{head_row}</tr></thead><tbody>{body}</tbody></table>"


def cell(value: Any, *, absent: str = "(absent)") -> str:
    """One escaped cell: numbers right-aligned (floats to 6 significant digits), booleans and a
    missing value (``absent``) in monospace, anything else as text."""
    if value is None:
        return f'<td class="val">{escape(absent)}</td>'
    if isinstance(value, bool):
        return f'<td class="val">{str(value).lower()}</td>'
    if isinstance(value, int | float):
        shown = str(value) if isinstance(value, int) else f"{value:.6g}"
        return f'<td class="num">{escape(shown)}</td>'
    return f"<td>{escape(str(value))}</td>"


def badge(kind: str, label: str) -> str:
    """A verdict's coloured label: ``kind`` picks the colour (:data:`CSS`: green for IDENTICAL,
    WITHIN_TOLERANCE and a study's ``within``, red for DIVERGED and ``beyond``, purple for
    INCOMPARABLE), ``label`` is what it says."""
    return f'<span class="verdict {escape(kind)}">{escape(label)}</span>'


def figure_svg(svg: str, caption: str) -> str:
    """An SVG (made by this package, so trusted markup) with its caption."""
    return f"<figure>{svg}<figcaption>{escape(caption)}</figcaption></figure>"
