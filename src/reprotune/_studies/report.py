"""The HTML reports of a study and of a significance test: one self-contained file each.

A study's report: for every metric, the values of every run as a strip plot per group with the
mean and its bootstrap interval, and a table; with ``--vary each``, the share of the variance each
source of randomness contributes, as a bar chart; then the runs and their seeds. A significance
report: the verdict, both studies side by side (strip plot, table) and what differs between them.
Charts are inline SVG (``_charts``); no scripts, no external URLs; the same input gives the
same bytes. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from reprotune._charts import Column, bar_chart, strip_plot
from reprotune._html import badge, escape, figure_svg, head, page_bytes, table
from reprotune._jsonio import write_bytes_atomic
from reprotune._studies.significance import Significance
from reprotune._studies.stats import shares_line, source_label
from reprotune._studies.twosample import percent
from reprotune._version import __version__


def write_study_report(study: Mapping[str, Any], out: str | Path) -> Path:
    """Write the HTML report of ``study`` (``study.json`` content) to ``out`` atomically."""
    return write_bytes_atomic(Path(out), page_bytes(render_study(study)))


def write_significance_report(
    result: Significance, study_a: Mapping[str, Any], study_b: Mapping[str, Any], out: str | Path
) -> Path:
    """Write the HTML report of a significance test to ``out`` atomically."""
    return write_bytes_atomic(Path(out), page_bytes(render_significance(result, study_a, study_b)))


def render_study(study: Mapping[str, Any]) -> str:
    """The study report's HTML text."""
    sid = study["study_id"]
    parts = head(f"reprotune seed study: {sid}")
    parts += [
        f"<h1>Seed study <code>{escape(sid)}</code></h1>",
        f"<p>Written by reprotune {escape(__version__)}. Status: {escape(study['status'])}. "
        f"Varies: <b>{escape(study['vary'])}</b>, {study['n']} runs per group "
        f"({len(study['runs'])} runs). Config sha256 <code>{escape(study['config_sha256'])}</code>.</p>",
        f"<p>Seed rule: {escape(study['seed_rule'])}.</p>",
        f"<p>Intervals: {escape(str(study['bootstrap']['method']))}, "
        f"{study['bootstrap']['n_resamples']} resamples, seed {study['bootstrap']['seed']}, "
        f"{percent(study['bootstrap']['confidence_level'])} of the mean.</p>",
    ]
    parts += _notes(list(study["notes"]) + list(study["metric_notes"]))
    for metric in study["metrics"]:
        parts.append(f"<h2>{escape(metric)}</h2>")
        rows = study["summary"]
        columns = [_column(source_label(g), rows[g][metric]) for g in study["groups"]]
        parts.append(
            figure_svg(
                strip_plot(columns, title=f"{metric}: every run", y_label=metric),
                f"{metric} of every run by the seed that moved; bar: mean; whisker: 95% interval",
            )
        )
        parts.append(
            _table(
                ("seeds varied", "runs", "mean", "sd", "min", "max", "95% CI of the mean"),
                (
                    (source_label(g), d["n"], d["mean"], d["std"], d["min"], d["max"], _interval(d))
                    for g in study["groups"]
                    for d in [rows[g][metric]]
                ),
            )
        )
        shares = (study.get("variance") or {}).get(metric)
        if shares:
            bars = [(source_label(g), float(s["share"])) for g, s in shares.items() if s["share"] is not None]
            parts.append(f"<p>Share of the variance: {escape(shares_line(shares))}.</p>")
            if bars:
                parts.append(
                    figure_svg(
                        bar_chart(bars, title=f"{metric}: share of the variance by source"),
                        "each source's variance (only that seed moving) over the sum",
                    )
                )
    if not study["metrics"]:
        parts.append("<p>No metric was measured by every run yet.</p>")
    parts.append("<h2>Runs</h2>")
    parts.append(
        _table(
            ("run", "seed varied", "seed", "status", *study["metrics"], "adapter sha256"),
            (
                (
                    r["name"],
                    source_label(r["varied"]),
                    r["seed"],
                    r["status"],
                    *[(r.get("metrics") or {}).get(m) for m in study["metrics"]],
                    (r.get("adapter_sha256") or "")[:12],
                )
                for r in study["runs"]
            ),
        )
    )
    parts.append("</body></html>\n")
    return "\n".join(parts)


def render_significance(result: Significance, study_a: Mapping[str, Any], study_b: Mapping[str, Any]) -> str:
    """The significance report's HTML text: verdict, both studies side by side, what differs."""
    t = result.test
    css = "beyond" if t.beyond_noise else "within"
    parts = head(f"reprotune significance: {result.study_id_a} vs {result.study_id_b}")
    parts += [
        "<h1>Beyond seed noise?</h1>",
        f"<p>{badge(css, result.verdict)}</p>",
        f"<p>Metric <code>{escape(result.metric)}</code>; alpha {t.alpha:g}. Written by reprotune "
        f"{escape(__version__)}.</p>",
    ]
    parts += _notes(result.notes)
    sides = [("A", study_a, result.values_a), ("B", study_b, result.values_b)]
    columns = [
        _column(f"{label}: {s['study_id']}", s["summary"][s["groups"][0]][result.metric])
        for label, s, _ in sides
    ]
    parts.append(
        figure_svg(
            strip_plot(columns, title=result.metric, y_label=result.metric),
            "each study's runs; bar: mean; whisker: the study's 95% bootstrap interval",
        )
    )
    parts.append("<h2>The two studies</h2>")
    parts.append(
        _table(
            ("", "A", "B"),
            [
                ("study", result.study_a, result.study_b),
                ("study id", result.study_id_a, result.study_id_b),
                ("seeds varied", study_a["vary"], study_b["vary"]),
                ("runs", t.n_a, t.n_b),
                ("mean", t.mean_a, t.mean_b),
                ("sd", t.std_a, t.std_b),
                ("values", _values(result.values_a), _values(result.values_b)),
            ],
        )
    )
    parts.append("<h2>The test</h2>")
    level = percent(1 - t.alpha)
    parts.append(
        _table(
            ("what", "value"),
            [
                ("difference of means, B - A", t.difference),
                (
                    f"{level} CI of the difference (Welch)",
                    f"{t.ci_low:.6g} .. {t.ci_high:.6g}" if t.welch_p is not None else "exact: no spread",
                ),
                ("Welch's t-test p", t.welch_p if t.welch_p is not None else "not defined"),
                (
                    "Welch's t, df",
                    f"{t.welch_t:.4g}, {t.welch_df:.3g}" if t.welch_t is not None else "not defined",
                ),
                ("permutation test p", t.permutation_p),
                (
                    "permutation test",
                    f"{'exact' if t.permutation_exact else 'resampled, seed ' + str(t.permutation_seed)}"
                    f", {t.permutation_resamples} arrangements; "
                    f"smallest possible p {t.permutation_smallest_p:.3g}",
                ),
                ("Cohen's d", t.cohens_d if t.cohens_d is not None else "not defined"),
                (
                    "seeds per side for 80% power",
                    t.seeds_for_power if t.seeds_for_power is not None else "not defined",
                ),
            ],
        )
    )
    parts.append("<h2>What differs between the studies</h2>")
    if result.differences:
        parts.append(
            _table(("key", "A", "B"), ((d["key"], _text(d["a"]), _text(d["b"])) for d in result.differences))
        )
    else:
        parts.append(f"<p>{escape(result.nothing_differs)}</p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _column(label: str, d: Mapping[str, Any]) -> Column:
    interval = (d["ci_low"], d["ci_high"]) if d.get("ci_low") is not None else None
    return Column(label, d["values"], d["mean"], interval)


def _interval(d: Mapping[str, Any]) -> str:
    if d.get("ci_low") is None:
        return "-"
    return f"{d['ci_low']:.6g} .. {d['ci_high']:.6g} ({d['ci_method']})"


def _values(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.6g}" for v in values)


def _text(value: Any) -> str:
    return "(absent)" if value is None else str(value)


def _notes(notes: Sequence[str]) -> list[str]:
    if not notes:
        return []
    return ["<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>"]


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    return table(header, rows, absent="-")  # a study shows what it lacks as "-"
