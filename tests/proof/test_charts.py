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
