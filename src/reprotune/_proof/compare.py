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

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from reprotune._errors import InputError
from reprotune._proof.adapter_diff import compare_adapters
from reprotune._proof.cause_texts import seed_finding_causes
from reprotune._proof.causes import explain, is_unexplained
from reprotune._proof.differences import (
    AdapterDiff,
    Comparison,
    Difference,
    NumberDiff,
    RunSummary,
    Verdict,
    Where,
    short_value,
)
from reprotune._proof.inert import TOLERATED_CONFIG
from reprotune._proof.microscope import (
    compared_kernels,
    kernels_of,
    made_by_trainer,
    trace_commands,
    trace_refusals,
)
from reprotune._proof.record_diff import record_differences
from reprotune._proof.resumed_attempts import as_computed, compared_drifts, resumes_of
from reprotune._proof.split_diff import compare_manifests
from reprotune._proof.world import same_world_throughout, without_rank_batches
from reprotune._run.ledger import differing_fields, val_by_place
from reprotune._run.rundir import RunDir, open_run_dir

# Numeric ledger fields a tolerance applies to; every other field must match exactly.
_TOLERANT_FIELDS = ("loss", "lr", "grad_norm")
# Keys that identify the base model: if any differs, the runs are of different experiments.
_MODEL_IDENTITY = ("weights_sha256", "tokenizer_sha256")


def compare_runs(
    a: str | Path, b: str | Path, *, tolerance: float | None = None, prefix: bool = False
) -> Comparison:
    """Compare run directory ``a`` (the reference) with ``b``.

    Args:
        a: the reference run directory.
        b: the run compared with it.
        tolerance: the largest absolute difference of a number (loss, lr, grad norm, validation
            loss, adapter element) for WITHIN_TOLERANCE; None allows only IDENTICAL.
        prefix: compare only the steps both ledgers hold, ignoring their lengths and adapters
            (verify's negative controls stop once they part: IDENTICAL means "no difference in
            the common steps", DIVERGED says where they part).

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
    check_tolerance(tolerance)
    run_a, run_b = open_run_dir(a), open_run_dir(b)
    return compare_opened(run_a, run_b, tolerance=tolerance, prefix=prefix)


def check_tolerance(tolerance: float | None) -> None:
    """Refuse a tolerance that is negative or not finite (before any work that ends in a compare)."""
    if tolerance is not None and not (math.isfinite(tolerance) and tolerance >= 0):
        raise InputError(
            f"tolerance {tolerance!r} is not a finite number >= 0",
            source="--tolerance",
            fix="pass an absolute tolerance such as 1e-6",
        )


def compare_opened(
    run_a: RunDir, run_b: RunDir, *, tolerance: float | None = None, prefix: bool = False
) -> Comparison:
    """``compare_runs`` on run directories already opened (the report opens each run once)."""
    if not same_world_throughout(run_a, run_b):
        # Each rank's share of a step differs by construction; the global batch is compared.
        run_a, run_b = without_rank_batches(run_a), without_rank_batches(run_b)
    where = _compare_ledgers(run_a, run_b, prefix=prefix)
    adapter = None if prefix else compare_adapters(run_a, run_b)
    differences = tuple(record_differences(run_a, run_b))
    split = compare_manifests(run_a, run_b)
    incomparable = tuple(_incomparable_reasons(run_a, run_b, adapter, prefix=prefix))
    ledgers_equal = where.lines_differing == 0 if prefix else _ledgers_equal(run_a, run_b, where)
    if prefix and not incomparable:
        verdict = Verdict.IDENTICAL if ledgers_equal else Verdict.DIVERGED
    elif incomparable:
        verdict = Verdict.INCOMPARABLE
    elif ledgers_equal and adapter is not None and adapter.identical:
        verdict = Verdict.IDENTICAL
    elif (
        tolerance is not None
        and not _experiment_differences(differences)
        and _within_tolerance(run_a, run_b, where, adapter, tolerance)
    ):
        verdict = Verdict.WITHIN_TOLERANCE
    else:
        verdict = Verdict.DIVERGED
    resumes = tuple(resumes_of(run_a, "A")) + tuple(resumes_of(run_b, "B"))
    # Each run as it computed the first divergent step: a resume from before it may have run in
    # another environment (or code, or kernels) than the record's start, and noted so.
    at = where.first_divergence_step
    (run_a_at, drift_a), (run_b_at, drift_b) = as_computed(run_a, "A", at), as_computed(run_b, "B", at)
    kernels = compared_kernels(run_a_at, run_b_at)
    # the causes: the runs as they computed that step (the listing: as they started)
    computed, drifts = (
        compared_drifts((drift_a, drift_b), run_a_at, run_b_at) if drift_a or drift_b else (differences, [])
    )
    edited = [label for label, run in (("A", run_a), ("B", run_b)) if _ledger_edited(run)]
    causes = explain(
        where,
        adapter,
        computed,
        split,
        resumes,
        ledgers_equal=ledgers_equal,
        kernels=kernels,
        edited=edited,
        trainer=any(made_by_trainer(run) for run in (run_a, run_b)),
        traceable=not trace_refusals(run_a, run_b, where.first_divergence_step or 0),
        drifts=drifts,
    )
    seed_findings = (
        seed_finding_causes({"A": run_a.record, "B": run_b.record})
        if not ledgers_equal and where.first_weights_step == 0
        else []
    )
    if seed_findings:  # a recorded reason: "nothing recorded differs" is no longer true
        causes = [*seed_findings, *(c for c in causes if not is_unexplained(c))]
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
        notes=tuple(_notes(run_a, run_b, verdict, differences, adapter, tolerance)),
        resumes=resumes,
        prefix=prefix,
        next_steps=tuple(trace_commands(run_a_at, run_b_at, where, causes)),
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


def _compare_ledgers(run_a: RunDir, run_b: RunDir, *, prefix: bool = False) -> Where:
    """Walk the common steps of both ledgers once, noting the first difference of each kind.
    Validation lines pair by step; one that only one run holds within the common steps is an
    other difference ("validation schedule"), except over a prefix (a control stopped early)."""
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
            other_fields = differing_fields(la.init.fields, lb.init.fields)

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
            k for k in differing_fields(fa, fb) if k not in {"batch_sha256", "loss", "weights_sha256"}
        )
        if others and first["other"] is None:
            first["other"], other_fields = step, others

    largest_val: NumberDiff | None = None
    val_a, val_b = val_by_place(la.val), val_by_place(lb.val)
    last = min(la.train[-1].step if la.train else 0, lb.train[-1].step if lb.train else 0)
    for key in sorted(k for k in val_a.keys() | val_b.keys() if k[0] <= last):
        step = key[0]
        if key not in val_a or key not in val_b:  # validated where the other run did not
            lines_differing += 0 if prefix else 1
            if not prefix and (first["other"] is None or step < first["other"]):
                first["other"], other_fields = step, ("validation schedule",)
            continue
        ea, eb = val_a[key], val_b[key]
        if ea.fields == eb.fields:
            continue
        lines_differing += 1
        if ea.fields["loss"] != eb.fields["loss"]:
            note("val", step)
            diff = _abs_diff(ea.number("loss"), eb.number("loss"))
            if largest_val is None or diff > largest_val.abs_diff or math.isnan(diff):
                largest_val = NumberDiff(ea.step, ea.number("loss"), eb.number("loss"), diff)
        others = tuple(k for k in differing_fields(ea.fields, eb.fields) if k not in {"loss", "step"})
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


def _abs_diff(x: float, y: float) -> float:
    if x == y:  # also inf == inf, where inf - inf would be nan
        return 0.0
    return abs(x - y)


def _incomparable_reasons(
    run_a: RunDir,
    run_b: RunDir,
    adapter: AdapterDiff | None,
    *,
    prefix: bool = False,
) -> Iterable[str]:
    """What makes the two runs different experiments, in plain words (empty: comparable)."""
    model_a, model_b = run_a.section("model"), run_b.section("model")
    identity = [k for k in _MODEL_IDENTITY if k in model_a and k in model_b]
    if not identity:  # records without hashes: fall back on what names the model
        identity = ["source", "revision"]
    for key in identity:
        if model_a.get(key) != model_b.get(key):
            yield (
                f"different base model: model.{key} {short_value(model_a.get(key))} vs "
                f"{short_value(model_b.get(key))}"
                f" ({model_a.get('source', '?')} vs {model_b.get('source', '?')})"
            )
            break
    if prefix:
        return  # only the common steps are compared: lengths and adapters may differ
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
    if where.first_batch_step is not None or [e.step for e in la.val] != [e.step for e in lb.val]:
        return False
    if adapter is None or not adapter.same_structure:
        return False
    if any(t.max_abs_diff is None or not t.max_abs_diff <= tolerance for t in adapter.tensors):
        return False
    pairs = list(zip(la.train, lb.train, strict=False)) + list(zip(la.val, lb.val, strict=False))
    for ea, eb in pairs:
        if ea.fields == eb.fields:
            continue
        for key in differing_fields(ea.fields, eb.fields):
            if key == "weights_sha256":
                continue  # follows from the weights, which are checked through the adapter
            if key not in _TOLERANT_FIELDS or key not in ea.fields or key not in eb.fields:
                return False
            if not _abs_diff(ea.number(key), eb.number(key)) <= tolerance:
                return False
    return True


def _experiment_differences(differences: Sequence[Difference]) -> list[str]:
    """The keys of the config, seed and data differences that can change the numbers: another
    experiment, which no tolerance forgives (one is for the same experiment on other hardware)."""
    return [
        d.key
        for d in differences
        if not d.inert
        and d.category in ("config", "seeds", "data")
        and not d.key.startswith(TOLERATED_CONFIG)
    ]


def _notes(
    run_a: RunDir,
    run_b: RunDir,
    verdict: Verdict,
    differences: Sequence[Difference],
    adapter: AdapterDiff | None,
    tolerance: float | None = None,
) -> Iterable[str]:
    """Things a reader should know that are not differences of the runs themselves."""
    other = _experiment_differences(differences)
    if tolerance is not None and verdict is Verdict.DIVERGED and other:
        yield (
            "a tolerance forgives the numbers of one experiment on other hardware, not another "
            f"experiment: these runs differ in {', '.join(other[:3])}{' ...' if len(other) > 3 else ''}"
        )
    for label, run in (("A", run_a), ("B", run_b)):
        if run.status != "completed":
            yield f"run {label} has status {run.status!r}"
        if run.manifest is None:
            yield f"run {label} has no split.json: its rows and splits cannot be compared"
        recorded = run.section("outputs").get("adapter_sha256")
        actual = None if adapter is None else adapter.sha256_a if label == "A" else adapter.sha256_b
        if recorded and actual and recorded != actual:
            yield f"run {label}'s adapter file does not match the sha256 in its record (modified since?)"
        if _ledger_edited(run):
            yield f"run {label}'s ledger does not match the sha256 in its record (edited since?)"
    if verdict is Verdict.IDENTICAL and differences:
        yield f"{len(differences)} recorded values differ, yet no number changed"
    unknown = [label for label, run in (("A", run_a), ("B", run_b)) if kernels_of(run) is None]
    if verdict is not Verdict.IDENTICAL and unknown:
        whose = f"run {unknown[0]}'s record holds no" if len(unknown) == 1 else "neither record holds"
        yield (
            f"{whose} kernel facts (made before reprotune recorded them): whether the two machines "
            "ran other kernels is unknown"
        )


def _ledger_edited(run: RunDir) -> bool:
    """Whether the run's ledger no longer matches the sha256 its record holds."""
    recorded = run.section("outputs").get("ledger_sha256")
    return bool(recorded) and recorded != run.ledger.sha256
