"""Two small inline SVG charts for the study reports: a strip plot and a bar chart.

Hand-written SVG instead of matplotlib: a study report is written at the end of every study, and
importing and drawing with matplotlib would cost about a second per study, which the benchmark
of a study's overhead would count. Inline SVG in HTML needs no namespace: the report refers to nothing
outside itself. The same input gives the same bytes. Never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

_W, _H = 640, 300
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


def _frame(title: str, y_label: str, ticks: Sequence[float], y: Callable[[float], float]) -> list[str]:
    parts = [
        f'<text x="{_W / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>',
        f'<line x1="{_LEFT}" x2="{_LEFT}" y1="{_TOP}" y2="{_H - _BOTTOM}" stroke="#888"/>',
        f'<text transform="translate(16,{(_TOP + _H - _BOTTOM) / 2}) rotate(-90)" text-anchor="middle" '
        f'font-size="12">{escape(y_label)}</text>',
    ]
    digits = _digits(ticks)
    for tick in ticks:
        ty = y(tick)
        parts.append(
            f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#eee"/>'
            f'<text x="{_LEFT - 6}" y="{ty + 4:.1f}" text-anchor="end" font-size="11">'
            f"{tick:.{digits}f}</text>"
        )
    return parts


def _svg(title: str, parts: Sequence[str], *, height: int = _H) -> str:
    return (
        f'<svg width="{_W}" height="{height}" '
        f'viewBox="0 0 {_W} {height}" role="img" aria-label="{escape(title)}" '
        'font-family="system-ui, sans-serif">' + "".join(parts) + "</svg>"
    )


def _axis(low: float, high: float) -> tuple[float, float, list[float]]:
    """An axis range with some margin and 'nice' ticks (1, 2 or 5 times a power of ten)."""
    if high == low:
        pad = abs(low) * 0.01 or 1.0
        low, high = low - pad, high + pad
    margin = (high - low) * 0.08
    low, high = low - margin, high + margin
    raw = (high - low) / 5
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step) * step
    ticks = [first + i * step for i in range(int((high - first) / step) + 1)]
    return low, high, ticks


def _digits(ticks: Sequence[float]) -> int:
    if len(ticks) < 2:
        return 3
    step = abs(ticks[1] - ticks[0])
    return max(0, -math.floor(math.log10(step))) if step > 0 else 3
