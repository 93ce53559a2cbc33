"""The report's evaluation section (``reprotune report``): each run's evals with their metrics,
and for a run compared with the reference, the eval comparison with the rows whose outputs differ
side by side. HTML fragments only; ``_proof.report`` places them. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from reprotune._errors import InputError
from reprotune._eval.compare import EvalComparison, adapter_label, compare_evals, latest_pairs
from reprotune._eval.evalfile import open_eval_dir
from reprotune._eval.layout import run_evals
from reprotune._eval.metrics import CORPUS_METRICS
from reprotune._html import badge, escape, table

#: Rows shown side by side per comparison (the rest are counted).
SHOWN_ROWS = 50


def evals_section(labels: Sequence[str], run_dirs: Sequence[Path]) -> list[str]:
    """The "Evaluations" section for the report's runs; empty when no run has an eval."""
    rows: list[tuple[Any, ...]] = []
    for label, run_dir in zip(labels, run_dirs, strict=True):
        for path in run_evals(run_dir):
            try:
                e = open_eval_dir(path)
            except InputError as exc:  # shown as such; the runs' comparison still stands
                rows.append(
                    (
                        label,
                        path.name,
                        f"damaged, left out: {exc.message}",
                        *[None] * (3 + len(CORPUS_METRICS)),
                    )
                )
                continue
            g, split, metrics = e.section("generation"), e.section("split"), e.metrics
            rows.append(
                (
                    label,
                    e.eval_id,
                    f"{split.get('name')} ({split.get('n_rows')} rows)",
                    adapter_label(e),
                    _decoding(g),
                    "yes" if g.get("batch_invariant") else f"no (batch {g.get('batch_size')})",
                    *(metrics.get(name) for name in CORPUS_METRICS),
                )
            )
    if not rows:
        return []
    parts = [
        "<h2>Evaluations</h2>",
        "<p>Each run's evals (<code>reprotune eval</code>): generated on the rows of the run's own split, "
        "scored with sacreBLEU and rouge-score.</p>",
        table(("run", "eval", "split", "adapter", "decoding", "batch-invariant", *CORPUS_METRICS), rows),
    ]
    for label, run_dir in zip(labels[1:], run_dirs[1:], strict=True):
        for a, b in latest_pairs(run_dirs[0], run_dir, damaged=lambda path, exc: None):
            parts.extend(comparison_html(labels[0], label, compare_evals(a, b)))
    return parts


def comparison_html(ref: str, label: str, c: EvalComparison) -> Iterable[str]:
    """One eval comparison: verdict, causes, metric deltas and the differing rows side by side."""
    yield (
        f"<h3>Evals {escape(Path(c.a).name)} ({escape(ref)}) vs {escape(Path(c.b).name)} ({escape(label)}): "
        f"{badge(c.verdict, c.verdict)}</h3>"
    )
    n = len(c.rows_differing)
    yield f"<p>{n} of {c.rows_compared} rows differ.</p>"
    if c.causes:
        yield "<p>Why, most likely first:</p><ol>"
        yield from (f"<li>{escape(cause)}</li>" for cause in c.causes)
        yield "</ol>"
    deltas = [d for d in c.metric_deltas if d.delta]
    if deltas:
        yield table(
            ("metric", ref, label, "difference"),
            ((d.name, d.a, d.b, d.delta) for d in deltas),
        )
    if n:
        yield f"<h4>Rows whose outputs differ{f' (first {SHOWN_ROWS} of {n})' if n > SHOWN_ROWS else ''}</h4>"
        yield table(
            ("row", "first differing token", f"output of {ref}", f"output of {label}"),
            ((r.index, r.first_token, r.text_a, r.text_b) for r in c.rows_differing[:SHOWN_ROWS]),
            css="diffs",
        )


def _decoding(g: Any) -> str:
    if g.get("decoding") == "sample":
        return (
            f"sample (T {g.get('temperature')}, top-k {g.get('top_k')}, top-p {g.get('top_p')}, "
            f"seed {g.get('eval_seed')}), max {g.get('max_new_tokens')}"
        )
    return f"greedy, max {g.get('max_new_tokens')}"
