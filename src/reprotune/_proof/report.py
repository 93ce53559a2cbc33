"""``write_report``: one self-contained HTML file about one or more runs.

Loss curves of every run overlaid (train and validation, x = optimizer step), the step where each
run parts from the first one marked, and the tables of differences ``compare`` finds. Figures are
inline SVG (``_charts``, the chart engine of every page reprotune writes), so the file needs
nothing else to open: no scripts, no external URLs. The same runs give the same bytes. Never imports torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from reprotune._charts import Mark, Series, line_chart
from reprotune._errors import InputError
from reprotune._eval.html import evals_section
from reprotune._html import badge, escape, figure_svg, head, page_bytes, table
from reprotune._jsonio import write_bytes_atomic
from reprotune._proof.compare import compare_opened
from reprotune._proof.differences import Comparison, largest_differences, show_value
from reprotune._proof.summary import LegView, expand
from reprotune._run.ledger import LedgerEntry, val_by_place
from reprotune._run.rundir import RunDir, open_run_dir
from reprotune._version import __version__

_CSS = """
table.diffs td:nth-child(2) { white-space: nowrap; } table.runs td:nth-child(4) { white-space: nowrap; }
.glance li { margin: 0.3em 0; }
"""


def write_report(run_dirs: Sequence[str | Path], out: str | Path) -> Path:
    """Write the HTML report on ``run_dirs`` to ``out`` atomically; return ``out``.

    Args:
        run_dirs: one or more run directories; the first is the reference each other run is
            compared with.
        out: the HTML file to write (its directory is created if missing).

    Returns:
        The path written.

    Raises:
        InputError: no run directory given, ``out`` is a directory, or a run directory is not one
            (see ``open_run_dir``).
        SchemaVersionError: a record is of an unknown schema.

    Example:
        >>> write_report(["runs/A", "runs/B"], "report.html")  # doctest: +SKIP
    """
    if not run_dirs:
        raise InputError("no run directory given", fix="pass at least one run directory")
    target = Path(out)
    if target.is_dir():
        raise InputError(
            f"the report path {target} is a directory",
            source="-o/--out",
            fix="pass a file name such as report.html",
        )
    given = expand([Path(p) for p in run_dirs])  # a verify or bundle-rerun dir stands for its runs
    runs = [open_run_dir(path) for path in given.runs]
    comparisons = [
        compare_opened(runs[0], other, prefix=common)
        for other, common in zip(runs[1:], given.prefix[1:], strict=True)
    ]
    html = render_report(runs, comparisons, summaries=given.summaries, legs=given.legs[1:])
    return write_bytes_atomic(target, page_bytes(html))


def render_report(
    runs: Sequence[RunDir],
    comparisons: Sequence[Comparison],
    *,
    summaries: Sequence[str] = (),
    legs: Sequence[LegView | None] = (),
) -> str:
    """The report's HTML text for ``runs`` and the comparisons of the first with each other;
    ``summaries`` (what a verification or a bundle rerun proved) open it; ``legs`` says, for each
    comparison, the verification's leg it is (and verify's verdict on it), where it is one."""
    labels = _labels(runs)
    views = [*legs, *([None] * (len(comparisons) - len(legs)))]
    divergences = [(labels[i + 1], c.where.first_divergence_step) for i, c in enumerate(comparisons)]
    train_chart = _plot(runs, labels, divergences, kind="train")
    val_chart = _plot(runs, labels, divergences, kind="val")
    parted = [f"{label} parts from {labels[0]} at step {at}" for label, at in divergences if at is not None]
    marks = f"; dashed vertical lines: {', '.join(parted)}" if parted else ""
    parts = [
        *head(f"reprotune report: {', '.join(r.run_id for r in runs)}", _CSS),
        "<h1>reprotune report</h1>",
        f"<p>Written by reprotune {escape(__version__)}. Run {escape(labels[0])} is the reference.</p>",
        *_glance(labels, comparisons, views),
        *summaries,
        "<h2>Runs</h2>",
        table(
            ("run", "directory", "run id", "status", "train steps", "validation lines"),
            (
                (label, str(r.path), r.run_id, r.status, len(r.ledger.train), len(r.ledger.val))
                for label, r in zip(labels, runs, strict=True)
            ),
            css="runs",
        ),
        "<h2>Loss</h2>",
        figure_svg(train_chart, "Training loss of every run by optimizer step" + marks),
        figure_svg(val_chart, "Validation loss of every run by optimizer step" + marks),
    ]
    if comparisons:
        parts.append("<h2>Comparisons</h2>")
        for label, comparison, view in zip(labels[1:], comparisons, views, strict=True):
            parts.extend(_comparison_html(labels[0], label, comparison, view))
    else:
        parts.append("<p>One run: nothing to compare.</p>")
    parts.extend(evals_section(labels, [r.path for r in runs]))  # none without evals (docs/eval.md)
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _glance(
    labels: Sequence[str], comparisons: Sequence[Comparison], views: Sequence[LegView | None]
) -> Iterable[str]:
    """Each comparison's verdict and where the runs part, with what makes them incomparable or else
    the first cause, on the first screen: the details follow below. A leg verify judged otherwise
    (a replay whose end state differs, beyond the steps compared here) says verify's verdict."""
    if not comparisons:
        return
    yield '<ul class="glance">'
    for label, c, view in zip(labels[1:], comparisons, views, strict=True):
        at = c.where.first_divergence_step
        # An INCOMPARABLE pair: why the runs are not of one experiment, before any cause.
        why = _named(next(iter((*c.incomparable, *c.causes)), ""), label)
        where = f" from step {at}" if at is not None else ""
        judged = ""
        if view is not None and view.verdict and view.verdict != c.verdict.value:
            judged = f" (verify judged leg {escape(view.name)} {badge(view.verdict, view.verdict)})"
        yield (
            f"<li>{escape(labels[0])} vs {escape(label)}: {badge(c.verdict.value, c.verdict.label)}"
            f"{judged}{escape(where)}{': ' + escape(why) if why else ''}</li>"
        )
    yield "</ul>"


_RUN_B = re.compile(r"\brun B\b")


def _named(text: str, label: str) -> str:
    """``compare``'s text of a pair, which calls the other run "run B", with the report's letter
    for it ("run C" from the third run on: the report's own B is another run)."""
    return _RUN_B.sub(f"run {label.split()[0]}", text)


def _labels(runs: Sequence[RunDir]) -> list[str]:
    """'A', 'B', ... and the directory name, so runs with equal run ids stay apart."""
    letters = [chr(ord("A") + i) if i < 26 else f"R{i}" for i in range(len(runs))]
    return [f"{letter} ({run.path.name})" for letter, run in zip(letters, runs, strict=True)]


def _plot(
    runs: Sequence[RunDir], labels: Sequence[str], divergences: Sequence[tuple[str, int | None]], *, kind: str
) -> str:
    """One chart: the ``train`` or ``val`` loss of every run, divergence steps as vertical lines.
    Each run keeps its index's colour and dash pattern in both charts, a run without entries
    included (its legend says it has no points), and each mark takes the colour of the run that
    parts there (run ``i + 1`` for the ``i``-th divergence)."""
    series = []
    for i, (label, run) in enumerate(zip(labels, runs, strict=True)):
        curves = [list(run.ledger.train)] if kind == "train" else _eval_sets(run)
        for place, entries in enumerate(curves):
            # a second set's curve takes a style no run's takes (a run's own: its first set's)
            named = label if len(curves) == 1 else f"{label}, {_set_name(run, place)}"
            xs, ys = [e.step for e in entries], [e.number("loss") for e in entries]
            series.append(Series(named, xs, ys, i + place * len(runs)))
    marks = [
        Mark(step, f"{label.split()[0]} parts from A at step {step}", i)
        for i, (label, step) in enumerate(divergences, start=1)
        if step is not None
    ]
    name = "training loss" if kind == "train" else "validation loss"
    return line_chart(series, title=name.capitalize(), x_label="optimizer step", y_label=name, marks=marks)


def _eval_sets(run: RunDir) -> list[list[LedgerEntry]]:
    """A run's val lines as one curve per eval set: a Trainer's dict of eval datasets writes one
    line a set at each evaluation, in the dict's order, so a set is a line's place at its step
    (drawn as one curve, the sets' losses made a zigzag). At least one curve, maybe empty."""
    curves: list[list[LedgerEntry]] = [[]]
    for (_, place), entry in val_by_place(run.ledger.val).items():
        curves.extend([] for _ in range(place + 1 - len(curves)))
        curves[place].append(entry)
    return curves


def _set_name(run: RunDir, place: int) -> str:
    """The eval set at ``place``: its name where the record lists the sets, else its number."""
    names = (run.record.get("data") or {}).get("eval_sets")
    if isinstance(names, list) and place < len(names) and isinstance(names[place], str):
        return f"eval set {names[place]!r}"
    return f"eval set {place + 1}"


def _comparison_html(ref: str, label: str, c: Comparison, view: LegView | None = None) -> Iterable[str]:
    """One comparison's section: verdict, causes, where, adapter, differences, split, notes."""
    verdict = c.verdict.value
    tol = f" (tolerance {c.tolerance:g})" if c.tolerance is not None else ""
    yield (f"<h3>{escape(ref)} vs {escape(label)}: {badge(verdict, c.verdict.label)}{escape(tol)}</h3>")
    b = label.split()[0]  # compare's "run B" is this run: C, D... from the third run on
    if c.prefix and view is not None and view.replay:
        yield (
            f"<p>Compared over the {c.where.steps_compared} steps both ran: leg {escape(view.name)} "
            "replays an interval of the recorded run and holds the steps to its end; verify also "
            f"compared its end state, and judged it {escape(str(view.verdict))} "
            f"(it must be {escape(view.expected)}).</p>"
        )
    elif c.prefix:
        yield (
            f"<p>Compared over the {c.where.steps_compared} steps both ran: this negative control "
            "stops once it parts from the reference, by design (its length and adapter are not "
            "compared).</p>"
        )
    if c.incomparable:
        yield "<p>Not the same experiment:</p><ul>"
        yield from (f"<li>{escape(_named(reason, label))}</li>" for reason in c.incomparable)
        yield "</ul>"
    if c.causes:
        yield "<p>Why, most likely first:</p><ol>"
        yield from (f"<li>{escape(_named(cause, label))}</li>" for cause in c.causes)
        yield "</ol>"
    w = c.where
    rows: list[tuple[str, Any]] = [
        ("train steps compared", w.steps_compared),
        ("first step with different batch rows", w.first_batch_step),
        ("first step with different loss bits", w.first_loss_step),
        ("first step with different weights hash", w.first_weights_step),
        ("first step with different validation loss", w.first_val_step),
        ("first step with other differences", w.first_other_step),
        ("ledger lines that differ", w.lines_differing),
    ]
    rows += largest_differences(w)
    yield "<h4>Where</h4>"
    yield table(("what", "step or value"), ((name, "never" if v is None else v) for name, v in rows))
    yield from _adapter_html(c, b)
    if c.differences:
        yield "<h4>What differs</h4>"
        yield table(
            ("category", "key", "A", b),
            (
                (
                    d.category,
                    d.key,
                    show_value(d.a, d.change == "added"),
                    show_value(d.b, d.change == "removed"),
                )
                for d in c.differences
            ),
            css="diffs",
        )
    else:
        yield "<p>Nothing recorded differs (config, seeds, code, data, model, LoRA, environment).</p>"
    if c.split is not None and c.split.sha256_a != c.split.sha256_b:
        s = c.split
        verb = "row differs" if s.rows_differing == 1 else "rows differ"
        yield f"<h4>Split manifests: {s.rows_differing} {verb}</h4>"
        split_rows = [(row, "content changed", "", "") for row in s.content_changed]
        split_rows += [
            (m.row, "in another split", m.split_a or "(none)", m.split_b or "(none)") for m in s.moved
        ]
        yield table(("row", "difference", "split in A", f"split in {b}"), sorted(split_rows))
        if s.reordered:
            yield f"<p>Same rows in another order: {escape(', '.join(s.reordered))}</p>"
    if c.notes:
        yield "<ul>" + "".join(f"<li>{escape(_named(note, label))}</li>" for note in c.notes) + "</ul>"


def _adapter_html(c: Comparison, b: str) -> Iterable[str]:
    """The adapters of a comparison: identical, or both sha256 (a missing one: absent) and the
    tensors that differ (``b``: the other run's letter)."""
    adapter = c.adapter
    if adapter is None:
        return
    yield "<h4>Adapter</h4>"
    if adapter.identical:
        yield f"<p>Identical: sha256 <code>{escape(str(adapter.sha256_a))}</code></p>"
        return
    sides = (adapter.sha256_a, adapter.sha256_b)
    shown = [f"<code>{escape(side)}</code>" if side else "(absent)" for side in sides]
    yield f"<p>Differs: sha256 {shown[0]} vs {shown[1]}</p>"
    if adapter.tensors:
        yield table(
            ("tensor", "shape A", f"shape {b}", "max |difference|"),
            ((t.name, str(t.shape_a), str(t.shape_b), t.max_abs_diff) for t in adapter.tensors),
        )
