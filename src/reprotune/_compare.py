"""Compare two runs step by step: a verdict, where they part, what differs and why.

Verdicts (docs/compare.md):

- IDENTICAL: every ledger line equal and the adapter files bit for bit equal.
- WITHIN_TOLERANCE: only with a tolerance; data order identical (every batch hash and count
  equal) and every number (loss, lr, grad norm, validation loss, adapter elements) within it.
- DIVERGED: the same experiment gave different results; ``causes`` says why.
- INCOMPARABLE: the runs are not of the same experiment (``incomparable`` says what makes them so):
  a different base model or tokenizer, adapters of a different shape, a different number of
  training steps, a missing adapter.

Never imports torch.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from reprotune._errors import InputError
from reprotune._rundir import (
    LedgerEntry,
    RunDir,
    SplitManifest,
    adapter_sha256,
    load_adapter,
    open_run_dir,
)

COMPARISON_SCHEMA = "reprotune/comparison"
COMPARISON_SCHEMA_VERSION = 1


class Verdict(str, enum.Enum):
    """The answer to "are these two runs the same?"."""

    IDENTICAL = "IDENTICAL"
    WITHIN_TOLERANCE = "WITHIN_TOLERANCE"
    DIVERGED = "DIVERGED"
    INCOMPARABLE = "INCOMPARABLE"

    def __str__(self) -> str:
        # f"{verdict}" gives the value on every Python (3.11 changed the mixin default).
        return self.value

    @property
    def exit_code(self) -> int:
        """0 when the runs agree (identical or within tolerance), 1 otherwise."""
        return 0 if self in (Verdict.IDENTICAL, Verdict.WITHIN_TOLERANCE) else 1

    @property
    def label(self) -> str:
        """The verdict as people read it (``WITHIN TOLERANCE``)."""
        return self.value.replace("_", " ")


Category = Literal["config", "seeds", "code", "data", "model", "lora", "environment"]
# Record section -> the category its differences are listed under. Sections left out (run_id,
# status, timings, outputs, config_sha256) are results or identities, not possible causes.
_SECTIONS: dict[str, Category] = {
    "config": "config",
    "seeds": "seeds",
    "code": "code",
    "reprotune_version": "code",
    "data": "data",
    "model": "model",
    "lora": "lora",
    "environment": "environment",
}
# Numeric ledger fields a tolerance applies to; every other field must match exactly.
_TOLERANT_FIELDS = ("loss", "lr", "grad_norm")
# Keys that identify the base model: if any differs, the runs are of different experiments.
_MODEL_IDENTITY = ("weights_sha256", "tokenizer_sha256")


@dataclass(frozen=True)
class RunSummary:
    """Which run, as the comparison names it."""

    path: str
    run_id: str
    status: str
    train_steps: int
    val_lines: int


@dataclass(frozen=True)
class NumberDiff:
    """The largest difference of one number between the runs, and where."""

    step: int
    a: float
    b: float
    abs_diff: float


@dataclass(frozen=True)
class Where:
    """Where the ledgers part. Every step is an optimizer step; ``None`` means never (over the
    common steps).

    Attributes:
        steps_compared: train steps present in both ledgers.
        first_batch_step: first step whose batch (row ids) hash differs.
        first_loss_step: first step whose loss bits differ.
        first_weights_step: first step whose weights hash differs (0: the LoRA init).
        first_val_step: first step whose validation loss bits differ.
        first_other_step: first step where another field (lr, grad_norm, epoch, counts) differs.
        other_fields: which fields those were at that step.
        first_divergence_step: the earliest of the above, the step the runs part.
        lines_differing: how many common ledger lines differ at all.
        largest_loss_diff: the largest |train loss difference| over the common steps.
        largest_val_loss_diff: the same for validation losses.
    """

    steps_compared: int
    first_batch_step: int | None
    first_loss_step: int | None
    first_weights_step: int | None
    first_val_step: int | None
    first_other_step: int | None
    other_fields: tuple[str, ...]
    first_divergence_step: int | None
    lines_differing: int
    largest_loss_diff: NumberDiff | None
    largest_val_loss_diff: NumberDiff | None


@dataclass(frozen=True)
class TensorDiff:
    """One adapter tensor in both runs."""

    name: str
    shape_a: tuple[int, ...] | None
    shape_b: tuple[int, ...] | None
    max_abs_diff: float | None  # None when the tensor is missing from one run or shapes differ


@dataclass(frozen=True)
class AdapterDiff:
    """The two adapter files: hashes, and element-wise differences per tensor."""

    sha256_a: str | None
    sha256_b: str | None
    identical: bool
    same_structure: bool
    tensors: tuple[TensorDiff, ...]


@dataclass(frozen=True)
class Difference:
    """One recorded value that differs between the runs, by key path (``train.lr``)."""

    category: Category
    key: str
    a: Any
    b: Any
    change: Literal["changed", "added", "removed"]


@dataclass(frozen=True)
class RowMove:
    """A dataset row that is in one split in run A and another in run B."""

    row: int
    split_a: str | None
    split_b: str | None


@dataclass(frozen=True)
class SplitDiff:
    """How the two split manifests differ (empty lists when they agree)."""

    sha256_a: str
    sha256_b: str
    content_changed: tuple[int, ...]  # rows whose content hash differs
    moved: tuple[RowMove, ...]  # rows in different splits (or in a split in one run only)
    reordered: tuple[str, ...]  # splits with the same rows in a different order

    @property
    def rows_differing(self) -> int:
        """How many distinct rows differ in content or split."""
        return len(set(self.content_changed) | {m.row for m in self.moved})


@dataclass(frozen=True)
class Comparison:
    """The result of ``compare_runs``: verdict, where, what differs and why."""

    verdict: Verdict
    run_a: RunSummary
    run_b: RunSummary
    tolerance: float | None
    incomparable: tuple[str, ...]
    where: Where
    adapter: AdapterDiff | None
    differences: tuple[Difference, ...]
    split: SplitDiff | None
    causes: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def exit_code(self) -> int:
        """The CLI's exit code for this verdict: 0 IDENTICAL/WITHIN_TOLERANCE, 1 otherwise."""
        return self.verdict.exit_code

    def to_json(self) -> dict[str, Any]:
        """The comparison as a JSON object (schema ``reprotune/comparison`` version 1)."""
        body = asdict(self)
        body["verdict"] = self.verdict.value
        if self.split is not None:
            body["split"]["rows_differing"] = self.split.rows_differing
        return {"schema": COMPARISON_SCHEMA, "schema_version": COMPARISON_SCHEMA_VERSION, **body}

    def format(self) -> str:
        """The comparison for people: verdict, where, why, then what differs."""
        return "\n".join(_format_lines(self)) + "\n"


def compare_runs(a: str | Path, b: str | Path, *, tolerance: float | None = None) -> Comparison:
    """Compare run directory ``a`` (the reference) with ``b``.

    Args:
        a: the reference run directory.
        b: the run compared with it.
        tolerance: the largest absolute difference of a number (loss, lr, grad norm, validation
            loss, adapter element) for WITHIN_TOLERANCE; None allows only IDENTICAL.

    Returns:
        The comparison: verdict, where the ledgers part, what differs and the ranked causes.

    Raises:
        InputError: a path is not a run directory, a file in it is malformed, or ``tolerance``
            is negative or not finite.
        SchemaVersionError: a record is of an unknown schema.

    Example:
        >>> result = compare_runs("runs/A", "runs/B")  # doctest: +SKIP
        >>> result.verdict, result.where.first_divergence_step, result.causes[:1]  # doctest: +SKIP
    """
    if tolerance is not None and not (math.isfinite(tolerance) and tolerance >= 0):
        raise InputError(
            f"tolerance {tolerance!r} is not a finite number >= 0",
            source="--tolerance",
            fix="pass an absolute tolerance such as 1e-6",
        )
    run_a, run_b = open_run_dir(a), open_run_dir(b)
    return compare_opened(run_a, run_b, tolerance=tolerance)


def compare_opened(run_a: RunDir, run_b: RunDir, *, tolerance: float | None = None) -> Comparison:
    """``compare_runs`` on run directories already opened (the report opens each run once)."""
    where = _compare_ledgers(run_a, run_b)
    adapter = _compare_adapters(run_a, run_b)
    differences = tuple(_record_differences(run_a, run_b))
    split = _compare_manifests(run_a.manifest, run_b.manifest)
    incomparable = tuple(_incomparable_reasons(run_a, run_b, differences, adapter))
    ledgers_equal = _ledgers_equal(run_a, run_b, where)
    if incomparable:
        verdict = Verdict.INCOMPARABLE
    elif ledgers_equal and adapter is not None and adapter.identical:
        verdict = Verdict.IDENTICAL
    elif tolerance is not None and _within_tolerance(run_a, run_b, where, adapter, tolerance):
        verdict = Verdict.WITHIN_TOLERANCE
    else:
        verdict = Verdict.DIVERGED
    from reprotune._causes import explain

    causes = explain(where, adapter, differences, split, ledgers_equal=ledgers_equal)
    return Comparison(
        verdict=verdict,
        run_a=_summary(run_a),
        run_b=_summary(run_b),
        tolerance=tolerance,
        incomparable=incomparable,
        where=where,
        adapter=adapter,
        differences=differences,
        split=split,
        causes=tuple(causes),
        notes=tuple(_notes(run_a, run_b, verdict, differences, adapter)),
    )


def _summary(run: RunDir) -> RunSummary:
    return RunSummary(
        path=str(run.path),
        run_id=run.run_id,
        status=run.status,
        train_steps=len(run.ledger.train),
        val_lines=len(run.ledger.val),
    )


def _ledgers_equal(run_a: RunDir, run_b: RunDir, where: Where) -> bool:
    """Every ledger line equal: same lengths and no common line differs."""
    la, lb = run_a.ledger, run_b.ledger
    same_length = len(la.train) == len(lb.train) and len(la.val) == len(lb.val)
    same_init = (la.init is None) == (lb.init is None)
    return same_length and same_init and where.lines_differing == 0


def _compare_ledgers(run_a: RunDir, run_b: RunDir) -> Where:
    """Walk the common steps of both ledgers once, noting the first difference of each kind."""
    la, lb = run_a.ledger, run_b.ledger
    first: dict[str, int | None] = {"batch": None, "loss": None, "weights": None, "val": None, "other": None}
    other_fields: tuple[str, ...] = ()
    lines_differing = 0

    def note(kind: str, step: int) -> None:
        if first[kind] is None:
            first[kind] = step

    if la.init is not None and lb.init is not None and la.init.fields != lb.init.fields:
        lines_differing += 1
        if la.init.fields.get("weights_sha256") != lb.init.fields.get("weights_sha256"):
            note("weights", 0)
        else:
            note("other", 0)
            other_fields = _differing_keys(la.init, lb.init)

    largest: NumberDiff | None = None
    for ea, eb in zip(la.train, lb.train, strict=False):
        fa, fb = ea.fields, eb.fields
        if fa == fb:  # the common case: one dict comparison per step
            continue
        lines_differing += 1
        step = ea.step
        if fa["batch_sha256"] != fb["batch_sha256"]:
            note("batch", step)
        if fa["loss"] != fb["loss"]:
            note("loss", step)
            diff = _abs_diff(ea.number("loss"), eb.number("loss"))
            if largest is None or diff > largest.abs_diff or math.isnan(diff):
                largest = NumberDiff(step, ea.number("loss"), eb.number("loss"), diff)
        if fa["weights_sha256"] != fb["weights_sha256"]:
            note("weights", step)
        others = tuple(
            k for k in _differing_keys(ea, eb) if k not in {"batch_sha256", "loss", "weights_sha256"}
        )
        if others and first["other"] is None:
            first["other"], other_fields = step, others

    largest_val: NumberDiff | None = None
    for ea, eb in zip(la.val, lb.val, strict=False):
        if ea.fields == eb.fields:
            continue
        lines_differing += 1
        if ea.fields["loss"] != eb.fields["loss"] or ea.step != eb.step:
            note("val", min(ea.step, eb.step))
        if ea.fields["loss"] != eb.fields["loss"]:
            diff = _abs_diff(ea.number("loss"), eb.number("loss"))
            if largest_val is None or diff > largest_val.abs_diff:
                largest_val = NumberDiff(ea.step, ea.number("loss"), eb.number("loss"), diff)
        others = tuple(k for k in _differing_keys(ea, eb) if k not in {"loss", "step"})
        if others and (first["other"] is None or ea.step < first["other"]):
            first["other"], other_fields = ea.step, others

    found = [s for s in first.values() if s is not None]
    return Where(
        steps_compared=min(len(la.train), len(lb.train)),
        first_batch_step=first["batch"],
        first_loss_step=first["loss"],
        first_weights_step=first["weights"],
        first_val_step=first["val"],
        first_other_step=first["other"],
        other_fields=other_fields,
        first_divergence_step=min(found) if found else None,
        lines_differing=lines_differing,
        largest_loss_diff=largest,
        largest_val_loss_diff=largest_val,
    )


def _differing_keys(ea: LedgerEntry, eb: LedgerEntry) -> tuple[str, ...]:
    keys = set(ea.fields) | set(eb.fields)
    return tuple(sorted(k for k in keys if ea.fields.get(k) != eb.fields.get(k)))


def _abs_diff(x: float, y: float) -> float:
    if x == y:  # also inf == inf, where inf - inf would be nan
        return 0.0
    return abs(x - y)


def _compare_adapters(run_a: RunDir, run_b: RunDir) -> AdapterDiff | None:
    """Hash both adapter files; when they differ, the max |difference| per tensor."""
    if run_a.adapter_path is None and run_b.adapter_path is None:
        return None
    sha_a, sha_b = adapter_sha256(run_a), adapter_sha256(run_b)
    if sha_a is not None and sha_a == sha_b:
        return AdapterDiff(sha_a, sha_b, identical=True, same_structure=True, tensors=())
    if run_a.adapter_path is None or run_b.adapter_path is None:
        return AdapterDiff(sha_a, sha_b, identical=False, same_structure=False, tensors=())
    ta, tb = load_adapter(run_a.adapter_path), load_adapter(run_b.adapter_path)
    tensors = []
    for name in sorted(set(ta) | set(tb)):
        xa, xb = ta.get(name), tb.get(name)
        shape_a = tuple(xa.shape) if xa is not None else None
        shape_b = tuple(xb.shape) if xb is not None else None
        max_diff: float | None = None
        if xa is not None and xb is not None and shape_a == shape_b:
            # float64 holds every float32/float16/bfloat16 value and their differences exactly
            delta = np.abs(xa.astype(np.float64) - xb.astype(np.float64))
            max_diff = float(delta.max()) if delta.size else 0.0
        tensors.append(TensorDiff(name, shape_a, shape_b, max_diff))
    same_structure = all(t.shape_a is not None and t.shape_a == t.shape_b for t in tensors)
    return AdapterDiff(sha_a, sha_b, identical=False, same_structure=same_structure, tensors=tuple(tensors))


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    """Flatten nested objects into ``{"a.b.c": leaf}``; lists are leaves."""
    if isinstance(value, Mapping) and value:
        for key in value:
            _flatten(value[key], f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def _record_differences(run_a: RunDir, run_b: RunDir) -> Iterable[Difference]:
    """Every recorded value that differs, by section, in key-path order."""
    for section, category in _SECTIONS.items():
        flat_a: dict[str, Any] = {}
        flat_b: dict[str, Any] = {}
        if section in run_a.record:
            _flatten(run_a.record[section], section, flat_a)
        if section in run_b.record:
            _flatten(run_b.record[section], section, flat_b)
        for key in sorted(set(flat_a) | set(flat_b)):
            if key not in flat_b:
                yield Difference(category, key, flat_a[key], None, "removed")
            elif key not in flat_a:
                yield Difference(category, key, None, flat_b[key], "added")
            elif flat_a[key] != flat_b[key] or type(flat_a[key]) is not type(flat_b[key]):
                yield Difference(category, key, flat_a[key], flat_b[key], "changed")


def _compare_manifests(ma: SplitManifest | None, mb: SplitManifest | None) -> SplitDiff | None:
    """Which rows and splits differ between the two split manifests."""
    if ma is None or mb is None:
        return None
    if ma.sha256 == mb.sha256:
        return SplitDiff(ma.sha256, mb.sha256, (), (), ())
    ha, hb = ma.row_hashes, mb.row_hashes
    # Rows past the end of the shorter dataset count as changed: they exist in one run only.
    changed = tuple(i for i in range(max(len(ha), len(hb))) if i >= len(ha) or i >= len(hb) or ha[i] != hb[i])
    where_a = {row: name for name, rows in ma.splits.items() for row in rows}
    where_b = {row: name for name, rows in mb.splits.items() for row in rows}
    moved = tuple(
        RowMove(row, where_a.get(row), where_b.get(row))
        for row in sorted(set(where_a) | set(where_b))
        if where_a.get(row) != where_b.get(row)
    )
    reordered = tuple(
        name
        for name, rows in ma.splits.items()
        if rows != mb.splits.get(name) and sorted(rows) == sorted(mb.splits.get(name, ()))
    )
    return SplitDiff(ma.sha256, mb.sha256, changed, moved, reordered)


def _incomparable_reasons(
    run_a: RunDir, run_b: RunDir, differences: Sequence[Difference], adapter: AdapterDiff | None
) -> Iterable[str]:
    """What makes the two runs different experiments, in plain words (empty: comparable)."""
    model_a, model_b = run_a.section("model"), run_b.section("model")
    identity = [k for k in _MODEL_IDENTITY if k in model_a and k in model_b]
    if not identity:  # records without hashes: fall back on what names the model
        identity = ["source", "revision"]
    for key in identity:
        if model_a.get(key) != model_b.get(key):
            yield (
                f"different base model: model.{key} {_short(model_a.get(key))} vs {_short(model_b.get(key))}"
                f" ({model_a.get('source', '?')} vs {model_b.get('source', '?')})"
            )
            break
    na, nb = len(run_a.ledger.train), len(run_b.ledger.train)
    if na != nb:
        yield (
            f"different training length: run A has {na} steps ({run_a.status}), "
            f"run B has {nb} ({run_b.status})"
        )
    if adapter is not None and not adapter.identical:
        if adapter.sha256_a is None or adapter.sha256_b is None:
            missing = "A" if adapter.sha256_a is None else "B"
            yield f"run {missing} has no adapter (adapter/adapter_model.safetensors is missing)"
        elif not adapter.same_structure:
            odd = [t.name for t in adapter.tensors if t.shape_a is None or t.shape_a != t.shape_b]
            yield f"the adapters have different tensors or shapes ({len(odd)} differ, e.g. {odd[0]})"
    elif adapter is None:
        yield "neither run has an adapter (adapter/adapter_model.safetensors is missing)"


def _within_tolerance(
    run_a: RunDir, run_b: RunDir, where: Where, adapter: AdapterDiff | None, tolerance: float
) -> bool:
    """Data order identical and every number within ``tolerance`` (runs of equal length)."""
    la, lb = run_a.ledger, run_b.ledger
    if where.first_batch_step is not None or len(la.val) != len(lb.val):
        return False
    if adapter is None or not adapter.same_structure:
        return False
    if any(t.max_abs_diff is None or not t.max_abs_diff <= tolerance for t in adapter.tensors):
        return False
    pairs = list(zip(la.train, lb.train, strict=False)) + list(zip(la.val, lb.val, strict=False))
    for ea, eb in pairs:
        if ea.fields == eb.fields:
            continue
        for key in _differing_keys(ea, eb):
            if key == "weights_sha256":
                continue  # follows from the weights, which are checked through the adapter
            if key not in _TOLERANT_FIELDS or key not in ea.fields or key not in eb.fields:
                return False
            if not _abs_diff(ea.number(key), eb.number(key)) <= tolerance:
                return False
    return True


def _notes(
    run_a: RunDir,
    run_b: RunDir,
    verdict: Verdict,
    differences: Sequence[Difference],
    adapter: AdapterDiff | None,
) -> Iterable[str]:
    """Things a reader should know that are not differences of the runs themselves."""
    for label, run in (("A", run_a), ("B", run_b)):
        if run.status != "completed":
            yield f"run {label} has status {run.status!r}"
        if run.manifest is None:
            yield f"run {label} has no split.json: its rows and splits cannot be compared"
        recorded = run.section("outputs").get("adapter_sha256")
        actual = None if adapter is None else adapter.sha256_a if label == "A" else adapter.sha256_b
        if recorded and actual and recorded != actual:
            yield f"run {label}'s adapter file does not match the sha256 in its record (modified since?)"
        recorded_ledger = run.section("outputs").get("ledger_sha256")
        if recorded_ledger and recorded_ledger != run.ledger.sha256:
            yield f"run {label}'s ledger does not match the sha256 in its record (edited since?)"
    if verdict is Verdict.IDENTICAL and differences:
        yield f"{len(differences)} recorded values differ, yet no number changed"


def _short(value: Any) -> str:
    """A value for a one-line message: long hashes cut to 12 characters."""
    text = str(value)
    return text[:12] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text


def _format_lines(c: Comparison) -> Iterable[str]:
    """The lines of ``Comparison.format``."""
    tol = f" (tolerance {c.tolerance:g})" if c.tolerance is not None else ""
    yield f"{c.verdict.label}{tol}"
    for label, run in (("A", c.run_a), ("B", c.run_b)):
        yield f"  {label}: {run.path}  run {run.run_id}, {run.status}, {run.train_steps} steps"
    for reason in c.incomparable:
        yield f"  incomparable: {reason}"
    w = c.where
    yield f"where (over {w.steps_compared} common steps)"
    rows = [
        ("first step with different batch rows", _step(w.first_batch_step)),
        ("first step with different loss bits", _step(w.first_loss_step)),
        ("first step with different weights hash", _step(w.first_weights_step)),
        ("first step with different validation loss", _step(w.first_val_step)),
    ]
    if w.first_other_step is not None:
        rows.append(
            (f"first step with other differences ({', '.join(w.other_fields)})", str(w.first_other_step))
        )
    for name, diff in (
        ("largest |loss difference|", w.largest_loss_diff),
        ("largest |validation loss difference|", w.largest_val_loss_diff),
    ):
        if diff is not None:
            rows.append((name, f"{diff.abs_diff:.6g} at step {diff.step} ({diff.a!r} vs {diff.b!r})"))
    width = max(len(name) for name, _ in rows)
    yield from (f"  {name.ljust(width)}  {value}" for name, value in rows)
    yield from _format_adapter(c.adapter)
    if c.causes:
        yield "why (most likely first)"
        yield from (f"  {i}. {cause}" for i, cause in enumerate(c.causes, start=1))
    if c.differences:
        yield "what differs"
        for category in dict.fromkeys(d.category for d in c.differences):
            yield f"  {category}:"
            for d in c.differences:
                if d.category == category:
                    old, new = _show(d.a, d.change == "added"), _show(d.b, d.change == "removed")
                    yield f"    {d.key}: {old} -> {new}"
    if c.split is not None and c.split.sha256_a != c.split.sha256_b:
        s = c.split
        verb = "row differs" if s.rows_differing == 1 else "rows differ"
        yield f"split manifests: {s.rows_differing} {verb}"
        if s.content_changed:
            yield f"  content changed: rows {_list(s.content_changed)}"
        for move in s.moved[:20]:
            yield f"  row {move.row}: {move.split_a or '(none)'} -> {move.split_b or '(none)'}"
        if len(s.moved) > 20:
            yield f"  ... and {len(s.moved) - 20} more rows in another split"
        if s.reordered:
            yield f"  same rows, another order: {', '.join(s.reordered)}"
    for note in c.notes:
        yield f"note: {note}"


def _format_adapter(adapter: AdapterDiff | None) -> Iterable[str]:
    if adapter is None:
        yield "adapter: none in either run"
        return
    if adapter.identical:
        yield f"adapter: identical (sha256 {adapter.sha256_a})"
        return
    yield f"adapter: differs (sha256 {_short(adapter.sha256_a)} vs {_short(adapter.sha256_b)})"
    for t in adapter.tensors:
        if t.max_abs_diff is not None:
            yield f"  {t.name}  max |diff| {t.max_abs_diff:.6g}"
        else:
            yield f"  {t.name}  shape {t.shape_a} vs {t.shape_b}"


def _step(step: int | None) -> str:
    return "none" if step is None else str(step)


def _show(value: Any, absent: bool) -> str:
    return "(absent)" if absent else json.dumps(value, sort_keys=True, ensure_ascii=False)


def _list(rows: Sequence[int], limit: int = 20) -> str:
    shown = ", ".join(str(r) for r in rows[:limit])
    return shown + (f" ... ({len(rows)} in all)" if len(rows) > limit else "")
