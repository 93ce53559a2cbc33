"""The one chart engine (``reprotune._charts``): line charts for run reports beside the studies'
strip plots and bars, inline SVG, the same input giving the same bytes."""

from __future__ import annotations

import math
import re

from reprotune._charts import Column, Series, line_chart, strip_plot


def test_a_line_chart_draws_every_series_and_mark_and_breaks_at_a_nan() -> None:
    series = [
        Series("A (ref)", [1, 2, 3, 4], [2.0, 1.5, 1.25, 1.0]),
        Series("B <odd>", [1, 2, 3, 4], [2.0, math.nan, 1.5, 1.125]),
    ]
    svg = line_chart(
        series, title="Training loss", x_label="optimizer step", y_label="loss", marks=[(2, "B parts")]
    )
    assert svg.startswith("<svg ") and svg.endswith("</svg>")
    assert svg.count("<polyline") == 3  # B's NaN at step 2 breaks its line in two
    assert "<title>B &lt;odd&gt;</title>" in svg and "<odd>" not in svg  # labels escaped
    assert 'stroke-dasharray="6,4"' in svg and ">B parts</text>" in svg
    assert svg.count("<circle") == 7  # a dot on every finite point
    assert (
        line_chart(
            series, title="Training loss", x_label="optimizer step", y_label="loss", marks=[(2, "B parts")]
        )
        == svg
    )


def test_points_land_in_order_inside_the_plot() -> None:
    svg = line_chart([Series("A", [0, 10], [5.0, 1.0])], title="t", x_label="x", y_label="y")
    points = re.search(r'<polyline points="([^"]+)"', svg)
    assert points is not None
    (x0, y0), (x1, y1) = [tuple(map(float, p.split(","))) for p in points.group(1).split()]
    assert x0 < x1 and y0 < y1  # later step to the right; a lower loss lower on the page (larger y)
    assert all(0 < v < 900 for v in (x0, x1)) and all(0 < v < 400 for v in (y0, y1))


def test_nothing_to_draw_says_so() -> None:
    svg = line_chart([], title="Validation loss", x_label="x", y_label="y")
    assert "no entries in any ledger" in svg and "<polyline" not in svg


def test_the_studies_charts_come_from_the_same_engine() -> None:
    svg = strip_plot([Column("seed", [1.0, 2.0], 1.5, (1.0, 2.0))], title="t", y_label="y")
    assert svg.startswith("<svg ") and svg.count("<circle") == 2


def test_entries_that_are_all_nan_are_not_called_no_entries() -> None:
    """A ledger whose losses are all NaN has entries: the chart says how many and that none is a
    finite number (it said "no entries in any ledger"); where some are, it counts those not drawn."""
    all_nan = line_chart([Series("A", [1, 2, 3], [math.nan] * 3)], title="t", x_label="step", y_label="loss")
    assert "3 entries, none of them a finite number" in all_nan and "no entries" not in all_nan
    some = line_chart(
        [Series("A", [1, 2, 3], [1.0, math.inf, 0.5])], title="t", x_label="step", y_label="loss"
    )
    assert (
        '<text x="880" y="20" text-anchor="end" font-size="11">1 of 3 points NaN or infinite, not drawn'
        in some
    )


def test_steps_are_whole_numbers_on_the_axis() -> None:
    """One step (or a few): whole-number ticks, never 0.990, 0.995, 1.000 ..."""
    for steps in ([1], [1, 2], [3, 4, 5]):
        svg = line_chart([Series("A", steps, [1.0] * len(steps))], title="t", x_label="step", y_label="loss")
        ticks = re.findall(r'text-anchor="middle" font-size="11">([^<]*)</text>', svg)
        assert ticks and all(re.fullmatch(r"-?\d+", tick) for tick in ticks), ticks


def test_labels_stay_on_the_canvas() -> None:
    """Five runs with long names: the legend wraps to a second row and the plot starts below it
    (the fifth label started past the 900 px canvas); a mark at the last step ends at its line
    instead of running off the right edge."""
    names = [f"{letter} (20260101-000000-abcdef0{i}-run)" for i, letter in enumerate("ABCDE")]
    series = [Series(name, [1, 30], [1.0, 0.5]) for name in names]
    svg = line_chart(
        series, title="t", x_label="step", y_label="loss", marks=[(30, "B parts from A at step 30")]
    )
    width = int(re.search(r'<svg width="(\d+)"', svg).group(1))  # type: ignore[union-attr]
    starts = [float(x) for x in re.findall(r'<text x="([\d.]+)" y="\d+" font-size="11">', svg)]
    assert starts and max(starts) < width, starts
    assert len(set(re.findall(r'<line x1="[\d.]+" x2="[\d.]+" y1="(\d+)" y2="\1" stroke="#', svg))) >= 2
    assert 'text-anchor="end" y=' in svg and "B parts from A at step 30" in svg
