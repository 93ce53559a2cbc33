"""Compare two evals: IDENTICAL when every generated token id matches; otherwise how many rows
differ, which (row index, first differing token), the metric deltas, and why.

Verdicts, as for runs (docs/compare.md): ``IDENTICAL`` (exit 0), ``DIVERGED`` (exit 1: the same
rows gave other tokens), ``INCOMPARABLE`` (exit 1: the evals cover other rows, or other data).
Causes, most likely first: the base model, the adapter (its weights, then its other files:
``adapter_config.json``'s scaling and target modules change the outputs of the same weights), the
tokenizer, the generation settings,
the eval seed (sampling), the batch size (only where an eval does not claim batch invariance),
and when nothing recorded differs, the environment (or nondeterminism in this one).

Reads ``eval.json`` and ``predictions.jsonl`` only: never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from reprotune._errors import InputError
from reprotune._eval.evalfile import EvalDir, Prediction, open_eval_dir
from reprotune._eval.layout import run_evals
from reprotune._eval.settings import GENERATION_IDENTITY
from reprotune._formats import EVAL_COMPARISON
from reprotune._run.drift import section_drift
from reprotune._run.layout import ADAPTER_WEIGHTS

EvalVerdict = Literal["IDENTICAL", "DIVERGED", "INCOMPARABLE"]
_SHOWN_ROWS = 10


@dataclass(frozen=True)
class RowDiff:
    """A row whose outputs differ: its data index, the first token position that differs, and
    both outputs."""

    index: int
    first_token: int
    tokens_a: int
    tokens_b: int
    text_a: str
    text_b: str


@dataclass(frozen=True)
class MetricDelta:
    name: str
    a: float | None
    b: float | None
    delta: float | None


@dataclass(frozen=True)
class EvalComparison:
    """The result of :func:`compare_evals`."""

    a: str
    b: str
    verdict: EvalVerdict
    rows_compared: int
    rows_differing: tuple[RowDiff, ...]
    rows_only_a: tuple[int, ...]
    rows_only_b: tuple[int, ...]
    metric_deltas: tuple[MetricDelta, ...]
    causes: tuple[str, ...]
    differences: tuple[str, ...] = field(default=())

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict == "IDENTICAL" else 1

    def to_json(self) -> dict[str, Any]:
        return EVAL_COMPARISON.stamp(asdict(self))

    def format(self) -> str:
        return "\n".join(_format_lines(self)) + "\n"


def compare_evals(a: str | Path, b: str | Path) -> EvalComparison:
    """Compare eval directory ``a`` (the reference) with ``b``.

    Raises:
        InputError: a path is not an eval directory, or a file in it is malformed.
        SchemaVersionError: an ``eval.json`` of another schema or version.
    """
    return compare_opened(open_eval_dir(a), open_eval_dir(b))


def compare_opened(ea: EvalDir, eb: EvalDir) -> EvalComparison:
    """:func:`compare_evals` on opened eval directories."""
    by_a = {p.index: p for p in ea.predictions}
    by_b = {p.index: p for p in eb.predictions}
    common = [i for i in by_a if i in by_b]
    only_a = tuple(sorted(set(by_a) - set(by_b)))
    only_b = tuple(sorted(set(by_b) - set(by_a)))
    differing = tuple(_row_diff(by_a[i], by_b[i]) for i in common if by_a[i].output_ids != by_b[i].output_ids)
    data_differs = any(by_a[i].row_sha256 != by_b[i].row_sha256 for i in common)
    differences = tuple(_differences(ea, eb))
    if only_a or only_b or data_differs:
        verdict: EvalVerdict = "INCOMPARABLE"
    else:
        verdict = "DIVERGED" if differing else "IDENTICAL"
    return EvalComparison(
        a=str(ea.path),
        b=str(eb.path),
        verdict=verdict,
        rows_compared=len(common),
        rows_differing=differing,
        rows_only_a=only_a,
        rows_only_b=only_b,
        metric_deltas=tuple(_metric_deltas(ea.metrics, eb.metrics)),
        causes=tuple(_causes(ea, eb, data_differs, bool(only_a or only_b), bool(differing))),
        differences=differences,
    )


def _row_diff(pa: Prediction, pb: Prediction) -> RowDiff:
    first = next(
        (i for i, (x, y) in enumerate(zip(pa.output_ids, pb.output_ids, strict=False)) if x != y),
        min(len(pa.output_ids), len(pb.output_ids)),
    )
    return RowDiff(pa.index, first, len(pa.output_ids), len(pb.output_ids), pa.text, pb.text)


def _metric_deltas(ma: Mapping[str, Any], mb: Mapping[str, Any]) -> Iterable[MetricDelta]:
    for name in sorted(set(ma) | set(mb)):
        x, y = ma.get(name), mb.get(name)
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (x, y))
        yield MetricDelta(name, x, y, (y - x) if numbers else None)  # type: ignore[operator]


def _get(e: EvalDir, section: str, key: str) -> Any:
    return e.section(section).get(key)


def _causes(
    ea: EvalDir, eb: EvalDir, data_differs: bool, rows_differ: bool, outputs_differ: bool
) -> Iterable[str]:
    """Why the outputs differ (or why they could), most likely first; the environment or
    nondeterminism only when some row both hold was generated differently and nothing else
    recorded explains it."""
    if rows_differ:
        yield (
            f"the evals cover different rows: {_split_text(ea)} vs {_split_text(eb)}{_sampled_text(ea, eb)}; "
            "only the rows both hold are compared"
        )
    if data_differs:
        yield "the data differs: some rows with the same index have different row hashes"
    found = False
    for key, what in (("weights_sha256", "base model weights"), ("config_sha256", "base model config files")):
        if _get(ea, "model", key) != _get(eb, "model", key):
            found = True
            yield f"{what} differ: {_short(_get(ea, 'model', key))} vs {_short(_get(eb, 'model', key))}"
    adapter = _adapter_cause(ea, eb)
    if adapter is not None:
        found = True
        yield adapter
    if _get(ea, "model", "tokenizer_sha256") != _get(eb, "model", "tokenizer_sha256"):
        found = True
        yield (
            f"tokenizer differs: {_short(_get(ea, 'model', 'tokenizer_sha256'))} vs "
            f"{_short(_get(eb, 'model', 'tokenizer_sha256'))}"
        )
    ga, gb = ea.section("generation"), eb.section("generation")
    changed = [k for k in GENERATION_IDENTITY if ga.get(k) != gb.get(k)]
    if adapter is not None and "gemm_blocks" in changed:
        changed.remove("gemm_blocks")  # the adapter's own layers are probed: it follows the adapter
    if changed:
        found = True
        shown = "; ".join(f"{k} {ga.get(k)!r} vs {gb.get(k)!r}" for k in changed)
        yield f"generation config differs: {shown}"
    sampling = "sample" in (ga.get("decoding"), gb.get("decoding"))
    if sampling and ga.get("eval_seed") != gb.get("eval_seed"):
        found = True
        yield f"eval seed differs (sampling): {ga.get('eval_seed')} vs {gb.get('eval_seed')}"
    claims = [bool(ga.get("batch_invariant")), bool(gb.get("batch_invariant"))]
    if ga.get("batch_size") != gb.get("batch_size") and not all(claims):
        found = True
        who = "one eval does not" if any(claims) else "neither eval does"
        yield (
            f"batch size differs ({ga.get('batch_size')} vs {gb.get('batch_size')}) and {who} claim "
            "batch invariance: the batch size is part of the eval's identity here"
        )
    if found or not outputs_differ:
        return
    env = section_drift(ea.section("environment"), eb.section("environment"), prefix="environment")
    if env:
        yield f"environment only: {len(env)} difference(s), e.g. {'; '.join(env[:3])}"
    else:
        yield (
            "nothing recorded differs: nondeterminism in this environment; run `reprotune doctor` "
            "and check the eval on this machine twice"
        )


def _differences(ea: EvalDir, eb: EvalDir) -> Iterable[str]:
    """Every recorded fact that differs, outside metrics, predictions, timings and identities."""
    skip = {
        "metrics",
        "predictions",
        "timings",
        "created_at",
        "eval_id",
        "identity_sha256",
        "environment",
        "split",
    }
    for key in sorted(set(ea.record) | set(eb.record)):
        if key in skip:
            continue
        old, new = ea.record.get(key), eb.record.get(key)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            # whether the block plan came from the cache, and how long probing took: no fact of the eval
            yield from (
                line
                for line in section_drift(old, new, prefix=key)
                if line.split(":", 1)[0].rsplit(".", 1)[-1] not in ("cached", "probe_s")
            )
        elif old != new:
            yield f"{key}: {old!r} vs {new!r}"
    yield from section_drift(ea.section("environment"), eb.section("environment"), prefix="environment")


def _adapter_cause(ea: EvalDir, eb: EvalDir) -> str | None:
    """How the adapters differ: their weights, or else their other files (``adapter_config.json``:
    its lora_alpha scales the same weights otherwise, its target_modules apply them elsewhere; the
    eval's identity holds the weights' sha256 alone); None when they do not."""
    adapter_a, adapter_b = adapter_label(ea), adapter_label(eb)
    if adapter_a != adapter_b:
        return f"adapter differs: {adapter_a} vs {adapter_b}"
    if ea.record.get("base_only") or eb.record.get("base_only"):
        return None
    fa, fb = (_get(e, "adapter", "files") for e in (ea, eb))
    fa, fb = (f if isinstance(f, Mapping) else {} for f in (fa, fb))
    files = [
        f"{name} {_short(fa.get(name))} vs {_short(fb.get(name))}"
        for name in sorted(set(fa) | set(fb))
        if name != ADAPTER_WEIGHTS and fa.get(name) != fb.get(name)
    ]
    if not files:
        return None
    return f"adapter files differ, with the same weights {adapter_a}: {'; '.join(files)}"


def adapter_label(e: EvalDir) -> str:
    """The adapter an eval scored, as its sha256's first 12 characters, or the base model alone."""
    if e.record.get("base_only"):
        return "none (base model alone)"
    return _short(_get(e, "adapter", "sha256"))


def _split_text(e: EvalDir) -> str:
    split = e.section("split")
    return f"{split.get('n_rows')} {split.get('name')} rows"


def _sampled_text(ea: EvalDir, eb: EvalDir) -> str:
    """How two capped evals chose their rows, where that tells why the rows differ: drawn with
    other eval seeds, or one the split's first rows (made before rows were drawn: the rerun of an
    older run draws them)."""
    drawn = [_drawn_with(e) for e in (ea, eb)]
    if drawn[0] is None or drawn[1] is None or drawn[0] == drawn[1]:
        return ""
    if "first" in (drawn[0], drawn[1]):
        said = [
            "the split's first rows (made before reprotune drew a capped eval's rows)"
            if d == "first"
            else f"drawn with eval seed {d}"
            for d in drawn
        ]
        return f" (A: {said[0]}; B: {said[1]})"
    return f", drawn with eval seeds {drawn[0]} vs {drawn[1]}"


def _drawn_with(e: EvalDir) -> Any:
    """A capped eval's eval seed, "first" for one made before rows were drawn, None uncapped."""
    split = e.section("split")
    sample = split.get("sample")
    if isinstance(sample, Mapping):
        return sample.get("seed")
    capped = isinstance(split.get("n_rows"), int) and split.get("n_rows") != split.get("split_rows")
    return "first" if capped and "sample" not in split else None


def _short(value: Any) -> str:
    return f"{value[:12]}..." if isinstance(value, str) and len(value) > 12 else repr(value)


def _format_lines(c: EvalComparison) -> Iterable[str]:
    yield f"{c.verdict}: eval {c.a} vs {c.b}"
    n = len(c.rows_differing)
    if c.verdict == "IDENTICAL":
        yield f"  every generated token id matches ({c.rows_compared} rows)"
    else:
        yield f"  {n} of {c.rows_compared} rows differ"
        for row in c.rows_differing[:_SHOWN_ROWS]:
            yield (
                f"    row {row.index}: first differing token at position {row.first_token} "
                f"({row.tokens_a} vs {row.tokens_b} tokens): {row.text_a[:40]!r} vs {row.text_b[:40]!r}"
            )
        if n > _SHOWN_ROWS:
            yield f"    ... and {n - _SHOWN_ROWS} more (--json lists all)"
    if c.rows_only_a or c.rows_only_b:
        yield f"  rows only in A: {len(c.rows_only_a)}; only in B: {len(c.rows_only_b)}"
    moved = [d for d in c.metric_deltas if d.delta]
    if moved:
        yield "  metrics (A -> B):"
        for d in moved:
            yield f"    {d.name}: {d.a:.6g} -> {d.b:.6g} ({d.delta:+.6g})"
    if c.causes:
        yield "why:" if c.verdict != "IDENTICAL" else "notes:"
        for cause in c.causes:
            yield f"  - {cause}"
    if c.differences:
        yield f"what differs in the records ({len(c.differences)}):"
        for line in c.differences[:20]:
            yield f"  {line}"
        if len(c.differences) > 20:
            yield f"  ... and {len(c.differences) - 20} more (--json lists all)"


def latest_pairs(
    run_a: Path, run_b: Path, *, damaged: Callable[[Path, InputError], None] | None = None
) -> list[tuple[Path, Path]]:
    """Evals of two runs to compare: for each split both runs evaluated with the same settings
    (generation identity, rows, base-only; sampling: the eval seed), the latest eval of each run
    (by the time it was made: an eval directory may have any name, given with ``--out``).

    ``damaged``: told of each eval that does not open (damaged), which is then left out; without
    it, such an eval's :class:`InputError` is raised (verify's eval leg fails on it).
    """
    pairs: dict[str, tuple[Path, Path]] = {}
    keys_b: dict[str, Path] = {}
    for path, opened in _by_time(run_b, damaged):
        keys_b[_pair_key(opened)] = path  # the later wins
    for path, opened in _by_time(run_a, damaged):
        key = _pair_key(opened)
        if key in keys_b:
            pairs[key] = (path, keys_b[key])
    return sorted(pairs.values())


def _by_time(run_dir: Path, damaged: Callable[[Path, InputError], None] | None) -> list[tuple[Path, EvalDir]]:
    """A run's evals, oldest first by the time each was made (its name where two say the same)."""
    opened = []
    for path in run_evals(run_dir):
        try:
            opened.append((path, open_eval_dir(path)))
        except InputError as exc:
            if damaged is None:
                raise
            damaged(path, exc)
    return sorted(opened, key=lambda item: (str(item[1].record.get("created_at") or ""), item[0].name))


def _pair_key(e: EvalDir) -> str:
    g = e.section("generation")
    sampling = g.get("decoding") == "sample"
    parts: Sequence[Any] = (
        e.section("split").get("name"),
        e.section("split").get("n_rows"),
        bool(e.record.get("base_only")),
        *(g.get(k) for k in ("decoding", "temperature", "top_k", "top_p", "max_new_tokens")),
        g.get("eval_seed") if sampling else None,  # another seed samples other tokens
    )
    return repr(parts)
