"""The one chart engine: small inline SVG charts for every HTML page reprotune writes (a run
report's loss curves, a study's strip plots and variance shares).

Hand-written SVG instead of a plotting library: a study report is written at the end of every
study, and importing and drawing with matplotlib cost about a second a page, which the benchmark of
a study's overhead counted; nor does the install need one. Inline SVG in HTML needs no namespace:
a page refers to nothing outside itself. The same input gives the same bytes. Never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from typing import NamedTuple

_W, _H = 640, 300
_LINE_W, _LINE_H, _LINE_TOP = 900, 400, 58
_LEGEND_ROW = 16  # one more row of the legend, in px
#: Overlaid curves of identical runs would hide each other: each series gets its own dash pattern
#: (``_style``), so that one drawn over another leaves gaps where the one below shows.
_DASHES = ("", "7,4", "2,3", "8,3,2,3", "12,4", "4,4", "1,4", "10,3,2,3,2,3", "6,2", "3,6", "14,3,3,3")
_LEFT, _RIGHT, _TOP, _BOTTOM = 78, 20, 34, 44
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


@dataclass(frozen=True)
class Column:
    """One column of a strip plot: a label, its values, their mean and an interval (or None)."""

    label: str
    values: Sequence[float]
    mean: float
    interval: tuple[float, float] | None


def strip_plot(columns: Sequence[Column], *, title: str, y_label: str) -> str:
    """Each column's values as dots, its mean as a bar and its interval as a whisker."""
    everything = [v for c in columns for v in c.values]
    everything += [x for c in columns if c.interval for x in c.interval]
    low, high, ticks = _axis(min(everything), max(everything))
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def y(value: float) -> float:
        return _TOP + plot_h * (1 - (value - low) / (high - low))

    parts = _frame(title, y_label, ticks, y)
    width = plot_w / max(1, len(columns))
    for i, column in enumerate(columns):
        color = _COLORS[i % len(_COLORS)]
        center = _LEFT + width * (i + 0.5)
        ordered = sorted(range(len(column.values)), key=lambda k: column.values[k])
        spread = min(width * 0.5, 8.0 * len(column.values))
        for rank, k in enumerate(ordered):
            # Dots fan out left to right in value order, so equal values stay visible.
            offset = (rank / (len(ordered) - 1) - 0.5) * spread if len(ordered) > 1 else 0.0
            parts.append(
                f'<circle cx="{center + offset:.1f}" cy="{y(column.values[k]):.1f}" r="4" '
                f'fill="{color}" fill-opacity="0.7"><title>{escape(column.label)}: '
                f"{column.values[k]!r}</title></circle>"
            )
        half = min(width * 0.35, 40.0)
        parts.append(
            f'<line x1="{center - half:.1f}" x2="{center + half:.1f}" y1="{y(column.mean):.1f}" '
            f'y2="{y(column.mean):.1f}" stroke="#222" stroke-width="2"/>'
        )
        if column.interval is not None:
            lo, hi = column.interval
            x = center + half + 8
            parts.append(
                f'<path d="M{x - 5:.1f},{y(lo):.1f}H{x + 5:.1f}M{x:.1f},{y(lo):.1f}V{y(hi):.1f}'
                f'M{x - 5:.1f},{y(hi):.1f}H{x + 5:.1f}" stroke="#222" stroke-width="1.5" fill="none"/>'
            )
        parts.append(
            f'<text x="{center:.1f}" y="{_H - _BOTTOM + 18}" text-anchor="middle" font-size="12">'
            f"{escape(column.label)}</text>"
        )
    return _svg(title, parts)


def bar_chart(bars: Sequence[tuple[str, float]], *, title: str) -> str:
    """Horizontal bars of shares in [0, 1], labelled with their percentage."""
    row = 28
    height = _TOP + row * len(bars) + 16
    label_w, plot_w = 110, _W - 110 - 70
    parts = [f'<text x="{_W / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>']
    for i, (label, share) in enumerate(bars):
        top = _TOP + i * row
        length = max(0.0, min(1.0, share)) * plot_w
        parts.append(
            f'<text x="{label_w - 8}" y="{top + 16}" text-anchor="end" font-size="12">{escape(label)}</text>'
            f'<rect x="{label_w}" y="{top + 4}" width="{length:.1f}" height="{row - 10}" '
            f'fill="{_COLORS[i % len(_COLORS)]}"/>'
            f'<text x="{label_w + length + 6:.1f}" y="{top + 16}" font-size="12">{share:.0%}</text>'
        )
    return _svg(title, parts, height=height)


@dataclass(frozen=True)
class Series:
    """One line of a line chart: its label and its points (a point whose y is not finite, such as
    a NaN loss, breaks the line there). ``style``: which colour and dash pattern it takes (a run's
    index, the same in every chart of a page); by default its place among the series."""

    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    style: int | None = None


class Mark(NamedTuple):
    """A labelled dashed vertical line at ``x``, in the colour of ``style`` (a series' style, such
    as the run that parts there); by default the colour of its place among the marks, from 1."""

    x: float
    text: str
    style: int | None = None


def _style(index: int) -> tuple[str, str]:
    """The colour and dash pattern of series ``index``: no two series share both, nor a dash pattern
    (beyond the table's, patterns with a dot whose dash and gap grow with the index)."""
    if index < len(_DASHES):
        dashes = _DASHES[index]
    else:
        k = index - len(_DASHES)
        dashes = f"{2 + k % 9},{3 + k // 9},1,{3 + k // 9}"
    return _COLORS[index % len(_COLORS)], dashes


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    marks: Sequence[Mark | tuple[float, str]] = (),
) -> str:
    """Lines over a shared x axis, each with its own colour and dash pattern (dots on its points
    when there are at most 50), a legend (a series without a point to draw says so there), and
    ``marks`` as labelled dashed vertical lines."""
    width, height = _LINE_W, _LINE_H
    points = [(x, y) for s in series for x, y in zip(s.xs, s.ys, strict=True) if math.isfinite(y)]
    entries = sum(len(s.xs) for s in series)
    if not points:
        said = (
            f"{entries} entries, none of them a finite number (NaN or infinite)"
            if entries
            else "no entries in any ledger"
        )
        parts = [
            f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>',
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" font-size="13">{said}</text>',
        ]
        return _svg(title, parts, width=width, height=height)
    lines = [Mark(*mark) for mark in marks]
    xs = [x for x, _ in points] + [mark.x for mark in lines]
    # optimizer steps are whole numbers: so are the ticks (one step gave 0.990, 0.995, ...)
    x_low, x_high, x_ticks = _axis(min(xs), max(xs), whole=all(float(x).is_integer() for x in xs))
    y_low, y_high, y_ticks = _axis(min(y for _, y in points), max(y for _, y in points))
    legend, rows = _legend(series, width)
    top = _LINE_TOP + _LEGEND_ROW * (rows - 1)  # the legend takes its rows under the title
    plot_w, plot_h = width - _LEFT - _RIGHT, height - top - _BOTTOM

    def px(value: float) -> float:
        return _LEFT + plot_w * (value - x_low) / (x_high - x_low)

    def py(value: float) -> float:
        return top + plot_h * (1 - (value - y_low) / (y_high - y_low))

    parts = _frame(title, y_label, y_ticks, py, width=width, height=height, top=top)
    parts += _x_axis(x_label, x_ticks, px, width=width, height=height)
    for i, line in enumerate(series):
        parts += _line(line, *_style(i if line.style is None else line.style), px, py)
    for row, (x, text, style) in enumerate(lines, start=1):
        color = _style(row if style is None else style)[0]
        # a label that would run past the right edge ends at its line instead
        right = px(x) + 4 + 6 * len(text) > width - _RIGHT
        at = f'x="{px(x) - 4:.1f}" text-anchor="end"' if right else f'x="{px(x) + 4:.1f}"'
        parts.append(
            f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{top}" y2="{height - _BOTTOM}" '
            f'stroke="{color}" stroke-dasharray="6,4" stroke-width="1.2"/>'
            f'<text {at} y="{top + 12 * row}" font-size="11" fill="{color}">{escape(text)}</text>'
        )
    parts += legend
    if entries > len(points):  # a line broken where its value is NaN or infinite: say so
        parts.append(  # beside the title, clear of the axis label
            f'<text x="{width - _RIGHT}" y="20" text-anchor="end" font-size="11">'
            f"{entries - len(points)} of {entries} points NaN or infinite, not drawn</text>"
        )
    return _svg(title, parts, width=width, height=height)


def _line(
    line: Series, color: str, dashes: str, px: Callable[[float], float], py: Callable[[float], float]
) -> list[str]:
    """A series as polylines (broken where y is not finite), with dots on up to 50 points."""
    runs: list[list[str]] = [[]]
    dots: list[str] = []
    for x, y in zip(line.xs, line.ys, strict=True):
        if not math.isfinite(y):
            runs.append([])
            continue
        runs[-1].append(f"{px(x):.1f},{py(y):.1f}")
        if len(line.xs) <= 50:
            dots.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
    dash = f' stroke-dasharray="{dashes}"' if dashes else ""
    parts = [
        f'<polyline points="{" ".join(run)}" fill="none" stroke="{color}" stroke-width="1.6"{dash}>'
        f"<title>{escape(line.label)}</title></polyline>"
        for run in runs
        if run
    ]
    return parts + dots


def _legend(series: Sequence[Series], width: int) -> tuple[list[str], int]:
    """Rows under the title, as many as the labels take within ``width``: each series' line style
    and its label (saying when it has no point to draw); and how many rows that is (the plot
    starts below them)."""
    parts, x, row = [], float(_LEFT), 0
    for i, line in enumerate(series):
        label = line.label
        if not line.xs:
            label += " (no points)"
        elif not any(math.isfinite(y) for y in line.ys):
            label += " (no finite points)"
        wide = 34 + 6.5 * len(label) + 24  # about the label's width at 11 px, and a gap
        if x > _LEFT and x + wide - 24 > width - _RIGHT:  # past the right edge: the next row
            x, row = float(_LEFT), row + 1
        color, dashes = _style(i if line.style is None else line.style)
        dash = f' stroke-dasharray="{dashes}"' if dashes else ""
        y = 38 + _LEGEND_ROW * row
        parts.append(
            f'<line x1="{x:.1f}" x2="{x + 28:.1f}" y1="{y}" y2="{y}" stroke="{color}" '
            f'stroke-width="2"{dash}/>'
            f'<text x="{x + 34:.1f}" y="{y + 4}" font-size="11">{escape(label)}</text>'
        )
        x += wide
    return parts, row + 1


def _x_axis(
    label: str, ticks: Sequence[float], px: Callable[[float], float], *, width: int, height: int
) -> list[str]:
    digits = _digits(ticks)
    parts = [
        f'<line x1="{_LEFT}" x2="{width - _RIGHT}" y1="{height - _BOTTOM}" y2="{height - _BOTTOM}" '
        'stroke="#888"/>',
        f'<text x="{(_LEFT + width - _RIGHT) / 2}" y="{height - 8}" text-anchor="middle" font-size="12">'
        f"{escape(label)}</text>",
    ]
    for tick in ticks:
        parts.append(
            f'<text x="{px(tick):.1f}" y="{height - _BOTTOM + 16}" text-anchor="middle" font-size="11">'
            f"{tick:.{digits}f}</text>"
        )
    return parts


def _frame(
    title: str,
    y_label: str,
    ticks: Sequence[float],
    y: Callable[[float], float],
    *,
    width: int = _W,
    height: int = _H,
    top: int = _TOP,
) -> list[str]:
    parts = [
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>',
        f'<line x1="{_LEFT}" x2="{_LEFT}" y1="{top}" y2="{height - _BOTTOM}" stroke="#888"/>',
        f'<text transform="translate(16,{(top + height - _BOTTOM) / 2}) rotate(-90)" text-anchor="middle" '
        f'font-size="12">{escape(y_label)}</text>',
    ]
    digits = _digits(ticks)
    for tick in ticks:
        ty = y(tick)
        parts.append(
            f'<line x1="{_LEFT}" x2="{width - _RIGHT}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#eee"/>'
            f'<text x="{_LEFT - 6}" y="{ty + 4:.1f}" text-anchor="end" font-size="11">'
            f"{tick:.{digits}f}</text>"
        )
    return parts


def _svg(title: str, parts: Sequence[str], *, width: int = _W, height: int = _H) -> str:
    return (
        f'<svg width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" '
        'font-family="system-ui, sans-serif">' + "".join(parts) + "</svg>"
    )


def _axis(low: float, high: float, *, whole: bool = False) -> tuple[float, float, list[float]]:
    """An axis range with some margin and 'nice' ticks (1, 2 or 5 times a power of ten; for
    ``whole`` numbers, such as steps, whole ticks one apart at the least)."""
    if high == low:
        pad = 1.0 if whole else abs(low) * 0.01 or 1.0
        low, high = low - pad, high + pad
    margin = (high - low) * 0.08
    low, high = low - margin, high + margin
    raw = (high - low) / 5
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    if whole:
        step = max(step, 1.0)
    first = math.ceil(low / step) * step
    ticks = [first + i * step for i in range(int((high - first) / step) + 1)]
    return low, high, ticks


def _digits(ticks: Sequence[float]) -> int:
    if len(ticks) < 2:
        return 3
    step = abs(ticks[1] - ticks[0])
    return max(0, -math.floor(math.log10(step))) if step > 0 else 3
