"""What a comparison of two runs finds: the verdict, where the ledgers part, what differs, and
the text people read. Types only and their rendering; the algorithm is in ``_proof.compare``, the
ranked causes in ``_proof.causes``. Never imports torch.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from reprotune._formats import COMPARISON
from reprotune._run.record import Status


class Verdict(enum.StrEnum):
    """The answer to "are these two runs the same?" (``str()`` and ``f"{verdict}"``: its value)."""

    IDENTICAL = "IDENTICAL"
    WITHIN_TOLERANCE = "WITHIN_TOLERANCE"
    DIVERGED = "DIVERGED"
    INCOMPARABLE = "INCOMPARABLE"

    @property
    def exit_code(self) -> int:
        """0 when the runs agree (identical or within tolerance), 1 otherwise."""
        return 0 if self in (Verdict.IDENTICAL, Verdict.WITHIN_TOLERANCE) else 1

    @property
    def label(self) -> str:
        """The verdict as people read it (``WITHIN TOLERANCE``)."""
        return self.value.replace("_", " ")


Category = Literal[
    "config", "seeds", "code", "data", "model", "lora", "environment", "kernels", "distributed"
]


@dataclass(frozen=True)
class RunSummary:
    """Which run, as the comparison names it."""

    path: str
    run_id: str
    status: Status | Literal["unknown"]
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
    """One recorded value that differs between the runs, by key path (``train.lr``).

    ``inert``: the value cannot change the numbers (``_proof.inert``); it is listed, never
    given as a cause.
    """

    category: Category
    key: str
    a: Any
    b: Any
    change: Literal["changed", "added", "removed"]
    inert: bool = False


@dataclass(frozen=True)
class Resume:
    """A resumed attempt of one of the runs: from which checkpoint, and whether RNG was restored."""

    run: Literal["A", "B"]
    from_step: int
    rng_restored: bool
    rng_missing: tuple[str, ...] = ()
    """The Trainer's RNG files the resume did not find (``rng_state_<rank>.pth``)."""
    rng_changed: tuple[str, ...] = ()
    """The Trainer's RNG files found, but other than the ones saved at that checkpoint."""
    state_missing: tuple[str, ...] = ()
    """Other state the Trainer's resume did not find (``optimizer.pt``, ``scheduler.pt``...)."""
    reseeds_dropout: bool = False
    """The run seeds every micro-batch's dropout anew from its dropout seed, step and micro-batch
    (a torchrun run: its record's ``distributed.dropout_seeding``), so no RNG state carries over."""

    @property
    def exact(self) -> bool:
        """Whether it restored everything the record says a resume needs."""
        return self.rng_restored and not self.state_missing


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
    resumes: tuple[Resume, ...] = field(default=())
    prefix: bool = False
    """Only the steps both ledgers hold were compared (``compare_runs(prefix=True)``)."""
    next_steps: tuple[str, ...] = field(default=())
    """Commands that find the first op that differs (``reprotune trace`` on each machine, then
    ``reprotune compare`` of the traces), when the cause is a kernel or nondeterminism."""

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
        return COMPARISON.stamp(body)

    def format(self) -> str:
        """The comparison for people: verdict, where, why, then what differs."""
        return "\n".join(_format_lines(self)) + "\n"


def short_value(value: Any) -> str:
    """A value for a one-line message: long hashes cut to 12 characters."""
    text = str(value)
    return text[:12] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text


def _format_lines(c: Comparison) -> Iterable[str]:
    """The lines of ``Comparison.format``."""
    tol = f" (tolerance {c.tolerance:g})" if c.tolerance is not None else ""
    scope = " over the steps both runs hold" if c.prefix else ""
    yield f"{c.verdict.label}{tol}{scope}"
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
    rows += largest_differences(w)
    width = max(len(name) for name, _ in rows)
    yield from (f"  {name.ljust(width)}  {value}" for name, value in rows)
    yield from _format_adapter(c.adapter)
    if c.causes:
        yield "why (most likely first)"
        yield from (f"  {i}. {cause}" for i, cause in enumerate(c.causes, start=1))
    if c.next_steps:
        yield "find the first op that differs (docs/microscope.md)"
        yield from (f"  {line}" for line in c.next_steps)
    if c.differences:
        yield "what differs"
        for category in dict.fromkeys(d.category for d in c.differences):
            yield f"  {category}:"
            for d in c.differences:
                if d.category == category:
                    old, new = show_value(d.a, d.change == "added"), show_value(d.b, d.change == "removed")
                    inert = "  (cannot change the numbers)" if d.inert else ""
                    yield f"    {d.key}: {old} -> {new}{inert}"
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


MAX_TENSORS_SHOWN = 10
"""Adapter tensors a comparison prints (those whose shapes differ, then the largest differences)."""


def _format_adapter(adapter: AdapterDiff | None) -> Iterable[str]:
    if adapter is None:
        yield "adapter: none in either run"
        return
    if adapter.identical:
        yield f"adapter: identical (sha256 {adapter.sha256_a})"
        return
    a, b = (short_value(sha) if sha else "(absent)" for sha in (adapter.sha256_a, adapter.sha256_b))
    yield f"adapter: differs (sha256 {a} vs {b})"
    reshaped = [t for t in adapter.tensors if t.max_abs_diff is None]
    differing = reshaped + sorted((t for t in adapter.tensors if t.max_abs_diff), key=_largest_first)
    if differing:
        equal = len(adapter.tensors) - len(differing)
        yield (
            f"  {len(differing)} of {len(adapter.tensors)} tensors differ"
            f"{f', {equal} equal' if equal else ''}; largest first:"
        )
    elif adapter.tensors:
        yield (
            "  every tensor is equal in value: the files differ in their metadata or in bits a value "
            "hides (-0.0 and 0.0, NaN payloads)"
        )
    for t in differing[:MAX_TENSORS_SHOWN]:
        if t.max_abs_diff is not None:
            yield f"  {t.name}  max |diff| {t.max_abs_diff:.6g}"
        else:
            yield f"  {t.name}  shape {t.shape_a} vs {t.shape_b}"
    if len(differing) > MAX_TENSORS_SHOWN:
        yield f"  ... and {len(differing) - MAX_TENSORS_SHOWN} more (compare --json lists every tensor)"


def _largest_first(t: TensorDiff) -> tuple[bool, float, str]:
    """Sort key: NaN differences first, then by size, then by name."""
    diff = t.max_abs_diff or 0.0
    return (not math.isnan(diff), -diff if not math.isnan(diff) else 0.0, t.name)


def _step(step: int | None) -> str:
    return "none" if step is None else str(step)


def show_value(value: Any, absent: bool) -> str:
    """A recorded value as a difference shows it: JSON, or ``(absent)``."""
    return "(absent)" if absent else json.dumps(value, sort_keys=True, ensure_ascii=False)


def largest_differences(w: Where) -> list[tuple[str, str]]:
    """The largest loss and validation-loss differences of a comparison's ``where``, as table rows."""
    rows = []
    for name, diff in (
        ("largest |loss difference|", w.largest_loss_diff),
        ("largest |validation loss difference|", w.largest_val_loss_diff),
    ):
        if diff is not None:
            rows.append((name, f"{diff.abs_diff:.6g} at step {diff.step} ({diff.a!r} vs {diff.b!r})"))
    return rows


def _list(rows: Sequence[int], limit: int = 20) -> str:
    shown = ", ".join(str(r) for r in rows[:limit])
    return shown + (f" ... ({len(rows)} in all)" if len(rows) > limit else "")
