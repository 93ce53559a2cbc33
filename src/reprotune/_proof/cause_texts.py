"""The sentences of the causes that take more than "X vs Y": how each begins (the stage of the
first divergence), a resume and what it ran with, the distributed setup, the split; and how a
recorded value is shown in them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from reprotune._proof.differences import Difference, Resume, SplitDiff, Where
from reprotune._proof.world import TRAINER_WORLD_SIZE
from reprotune._run.checkpoint_files import TRAINER_PIECES

MAX_SHOWN = 3
Stage = Literal["init", "order", "numbers"]


@dataclass(frozen=True)
class ResumeDrift:
    """What the resumed attempt that computed the first divergent step noted as different from its
    run's start (the record's ``attempts[].drift``, ``environment_drift``, ``code_drift``), as
    differences of run A against run B: that attempt's value on its run's side, the value the
    other run recorded on the other."""

    run: Literal["A", "B"]
    from_step: int
    differences: tuple[Difference, ...]


#: What a resume's drift of each kind of difference is called ("with other kernel facts").
_DRIFT_NOUNS = {
    "kernels": "kernel facts",
    "environment": "environment",
    "code": "code",
    "config": "config",
    "data": "data",
    "model": "base model",
    "model_files": "base model files",
    "lora": "LoRA config",
    "seeds": "seeds",
    "distributed": "distributed setup",
    "rank_environment": "rank environments",
}


def drift_text(drift: ResumeDrift, kind: str, said: str) -> str:
    """'run B was resumed from its step-4 checkpoint with other kernel facts than it started with
    (noted on that attempt): ...'."""
    noun = _DRIFT_NOUNS.get(kind, kind)
    return (
        f"run {drift.run} was resumed from its step-{drift.from_step} checkpoint with other {noun} than "
        f"it started with (noted on that attempt): {said}"
    )


def stage_of(where: Where) -> Stage:
    """The stage of the first divergence: the LoRA init, the data order or the numbers."""
    if where.first_weights_step == 0:
        return "init"
    if where.first_batch_step is not None and where.first_batch_step == where.first_divergence_step:
        return "order"
    return "numbers"


def headline(stage: Stage, where: Where) -> str:
    """How every cause of the first divergence begins ('numbers differ from step 7 with identical
    data order')."""
    order = where.first_batch_step
    if stage == "init":
        tail = f", and the data order from step {order}" if order is not None else ""
        return f"the LoRA initial weights differ (step 0){tail}"
    if stage == "order":
        return f"data order differs from step {where.first_divergence_step}"
    numbers = (where.first_loss_step, where.first_weights_step, where.first_val_step)
    if order is None and numbers == (None, None, None) and where.other_fields == ("validation schedule",):
        return (
            f"the runs validated at other steps from step {where.first_divergence_step}, and every "
            "number both recorded agrees"
        )
    if order is None:
        return f"numbers differ from step {where.first_divergence_step} with identical data order"
    return (
        f"numbers differ from step {where.first_divergence_step}, before the data order does (step {order})"
    )


def fields_text(where: Where) -> str:
    """The ledger fields that differ at the first divergent step, comma-separated."""
    return ", ".join(fields_at(where))


def fields_at(where: Where) -> list[str]:
    """The ledger fields that differ at the first divergent step (``batch_sha256``, ``loss``...)."""
    names = []
    if where.first_batch_step == where.first_divergence_step:
        names.append("batch_sha256")
    if where.first_loss_step == where.first_divergence_step:
        names.append("loss")
    if where.first_weights_step == where.first_divergence_step:
        names.append("weights_sha256")
    if where.first_val_step == where.first_divergence_step:
        names.append("validation loss")
    if where.first_other_step == where.first_divergence_step:
        names.extend(where.other_fields)
    return names


def resume_text(resume: Resume) -> str:
    where = f"run {resume.run} resumed from its step-{resume.from_step} checkpoint"
    if resume.exact:
        return (
            f"run {resume.run} was resumed from its step-{resume.from_step} checkpoint; an exact resume "
            "changes nothing, so check what it restored (docs/checkpoints.md)"
        )
    if not (resume.rng_missing or resume.rng_changed or resume.state_missing):
        return (
            f"run {resume.run} was resumed from its step-{resume.from_step} checkpoint without restoring "
            "the RNG states: every random draw after it (dropout) differs"
        )
    parts = []
    if resume.rng_missing:
        parts.append(
            f"without the RNG state of {_ranks(resume.rng_missing)}: the checkpoint has no "
            f"{', '.join(resume.rng_missing)}; {TRAINER_PIECES['rng']}"
        )
    if resume.rng_changed:
        parts.append(
            f"with another RNG state for {_ranks(resume.rng_changed)} than saved there "
            f"({', '.join(resume.rng_changed)} was replaced); {TRAINER_PIECES['rng']}"
        )
    if resume.state_missing:
        parts.extend(
            f"without {piece}: {TRAINER_PIECES.get(piece, 'it starts again')}"
            for piece in resume.state_missing
        )
    return f"{where} {'; and '.join(parts)} (docs/integrations.md)"


def _ranks(files: tuple[str, ...]) -> str:
    """'rank 1, rank 3' for ``rng_state_1.pth, rng_state_3.pth``; 'it' for ``rng_state.pth``."""
    return ", ".join(
        f"rank {name.removeprefix('rng_state_').removesuffix('.pth')}" if name != "rng_state.pth" else "it"
        for name in files
    )


def distributed_text(diffs: list[Difference]) -> str | None:
    """'dropout is seeded another way ...' when one run was made under torchrun and the other not
    (or under another seeding scheme); 'world size 1 vs 2: gradients are summed in another order
    ...' when the world size differs (a run made outside torchrun counts as world size 1), and for
    two Trainer-made runs (``trainer.world_size``) 'world size 2 vs 1: the global batch and the
    sampler's sharding differ ...'; 'strategy ddp vs fsdp: ...' when two torchrun runs' strategies
    differ (a run made outside torchrun has none, and reduces nothing)."""
    by_key = {d.key: d for d in diffs}
    parts = []
    if (seeding := by_key.get("distributed.dropout_seeding")) is not None:
        a, b = (
            _seeding(seeding.a, seeding.change == "added"),
            _seeding(seeding.b, seeding.change == "removed"),
        )
        parts.append(
            f"dropout is seeded another way ({a} vs {b}), so every dropout mask differs; a run made "
            "under torchrun reproduces under torchrun, not outside it (docs/distributed.md)"
        )
    sizes = by_key.get("distributed.world_size")
    if sizes is not None and not {sizes.a, sizes.b} <= {None, 1}:
        a, b = value_text(sizes.a, sizes.change == "added"), value_text(sizes.b, sizes.change == "removed")
        parts.append(
            f"world size {a} vs {b}: the gradients and losses of a step are summed in another order "
            "(another reduction tree), so the last bits differ; runs at different world sizes agree "
            "within a tolerance, not bit for bit (compare with --tolerance)"
        )
    if (trainer := by_key.get(TRAINER_WORLD_SIZE)) is not None:
        parts.append(
            f"world size {trainer.a} vs {trainer.b}: the global batch and the sampler's sharding differ: "
            "each rank trains a batch of its own at every step, the sampler deals the rows among the "
            "ranks and the gradients are averaged over them, so the steps train on other rows; a "
            "Trainer script reproduces at its own world size (launch both with the same torchrun "
            "--nproc_per_node)"
        )
    strategy = by_key.get("distributed.strategy")
    if strategy is not None and strategy.change == "changed":  # a plain run reduces nothing
        parts.append(
            f"strategy {strategy.a} vs {strategy.b}: the gradients are reduced another way and the "
            "gradient norm is summed in another order (distributed.reductions), so their last bits can "
            "differ; runs of two "
            "strategies agree within a tolerance, not bit for bit (compare with --tolerance)"
        )
    return "; and ".join(parts) or None


def _seeding(value: Any, absent: bool) -> str:
    """How a run seeded dropout: its record's scheme up to the colon, or one stream outside torchrun."""
    return "one generator stream, outside torchrun" if absent else str(value).split(":")[0]


def split_text(split: SplitDiff) -> str:
    """'the split manifests differ in 3 rows (content changed: rows 4, 17; ...)'."""
    if split.sha256_a == split.sha256_b:
        return ""
    n = split.rows_differing
    parts = []
    if split.content_changed:
        parts.append(f"content changed: {_rows(split.content_changed)}")
    if split.moved:
        shown = split.moved[:MAX_SHOWN]
        moves = ", ".join(f"row {m.row} {m.split_a or '-'}->{m.split_b or '-'}" for m in shown)
        more = f" and {len(split.moved) - MAX_SHOWN} more" if len(split.moved) > MAX_SHOWN else ""
        parts.append(f"in another split: {moves}{more}")
    if split.reordered:
        parts.append(f"same rows in another order: {', '.join(split.reordered)}")
    if not parts:
        return "the split manifests differ, though every row, hash and split agrees"
    if n == 0:
        return f"the split manifests list the same rows in another order ({', '.join(split.reordered)})"
    noun = "row" if n == 1 else "rows"
    return f"the split manifests differ in {n} {noun} ({'; '.join(parts)})"


def _rows(rows: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in rows[:MAX_SHOWN])
    more = f" and {len(rows) - MAX_SHOWN} more" if len(rows) > MAX_SHOWN else ""
    return f"row{'s' if len(rows) > 1 else ''} {shown}{more}"


def hash_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """``name 0e05ff5d02e2 vs 557938a13816`` for each name whose hash differs in two mappings of
    name -> sha256 (``(absent)`` on the side that lacks it), in name order."""
    return [
        f"{name} {str(a.get(name, '(absent)'))[:12]} vs {str(b.get(name, '(absent)'))[:12]}"
        for name in sorted(set(a) | set(b))
        if a.get(name) != b.get(name)
    ]


def value_text(value: Any, absent: bool) -> str:
    if absent:
        return "(absent)"
    if isinstance(value, str):
        return value[:12] if len(value) == 64 else value
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 40 else text[:37] + "..."


def seed_finding_causes(records: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The initial weights differ: a Trainer-made run whose record (``records``: by run label)
    warns that its LoRA init was not covered by its seed (``peft-before-seed``) is the likeliest
    cause, whatever else agrees; one sentence when both records warn it."""
    warned = []
    for label, record in records.items():
        findings = record.get("findings")
        for finding in findings if isinstance(findings, list) else []:
            if isinstance(finding, dict) and finding.get("code") == "peft-before-seed":
                warned.append((label, finding))
                break
    if not warned:
        return []
    label, finding = warned[0]
    whose = "both runs' records warn" if len(warned) == 2 else f"run {label}'s record warns"
    return [
        f"the LoRA initial weights differ (step 0): {whose} peft-before-seed: "
        f"{finding.get('title')} (fix: {finding.get('fix')})"
    ]
