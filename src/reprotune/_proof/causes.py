"""Why two runs part: ranked, plain-words causes tying the first divergence to what differs.

The first divergence has a stage: the LoRA init (weights differ at step 0), the data order (the
batch rows differ first) or the numbers (loss or weights differ while the batches agree). Each
stage ranks the kinds of difference by how directly they can cause it: a different split moves
the data order; a different torch changes numbers, not batches. Each kind that differs gives one
cause line, most likely first. Two kinds come first at every stage: a file of the base model that
defines its computation (``config.json``, custom code), and a resume that skipped the RNG restore
before the divergence. What a resume before it noted as different from its run's start (another
environment, code or kernels) is a difference of that kind, said with the resume. Recorded
values that cannot change the numbers (``inert.INERT_KEYS``: where a manifest came from, a
warning's text, a path) are never causes, and one fact is one cause (``restatements``).

Kernel facts (``environment.kernels``: CPU capability, MKL's code path, GPU and CUDA libraries,
attention) are a numbers cause of their own, in words a user can act on; a record made before
they were recorded makes them unknown, and the causes say so. When the runs part at a kernel, an
unknown kernel or nothing recorded at all (nondeterminism), ``compare`` adds the ``reprotune
trace`` commands that find the first op that differs (``compare.trace_commands``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from reprotune._proof.cause_texts import (
    MAX_SHOWN,
    ResumeDrift,
    Stage,
    distributed_text,
    drift_text,
    fields_at,
    fields_text,
    headline,
    resume_text,
    split_text,
    stage_of,
    value_text,
)
from reprotune._proof.differences import AdapterDiff, Difference, Resume, SplitDiff, Where
from reprotune._proof.kernel_cause import KERNEL_CAUSE, KernelAdvice, kernel_text
from reprotune._proof.rank_diff import rank_environment_key, rank_environment_text
from reprotune._proof.restatements import drop_restatements
from reprotune._proof.stack_causes import (
    BUFFER_CAUSE,
    LIBRARIES_CAUSE,
    TRANSFORMERS_KEY,
    env_rank,
    is_computing_library,
    key_label,
    libraries_text,
    model_files_text,
)

# Seeds that act at each stage; the root seed acts on all of them.
_STAGE_SEEDS: dict[Stage, frozenset[str]] = {
    "init": frozenset({"root", "lora_init"}),
    "order": frozenset({"root", "data_order", "split"}),
    "numbers": frozenset({"root", "dropout", "eval"}),
}
# Evidence kinds, most direct first, for each stage. "model_files" (config.json, custom code)
# and "resume_rng" (a resume that skipped the RNG restore) lead every stage they can occur in.
# "distributed" is the world size (a Trainer's deals other rows, so it moves the order too) and
# the strategy; "rank_environment" what one torchrun rank ran with besides rank 0's environment.
_RANKING: dict[Stage, tuple[str, ...]] = {
    "init": (
        "model_files",
        "seeds",
        "lora",
        "model",
        "config",
        "kernels",
        "rank_environment",
        "code",
        "environment",
        "split",
        "data",
        "other_seeds",
    ),
    "order": (
        "model_files",
        "resume_rng",
        "split",
        "seeds",
        "data",
        "config",
        "distributed",
        "resume",
        "code",
        "environment",
        "rank_environment",
        "other_seeds",
        "lora",
        "model",
    ),
    "numbers": (
        "model_files",
        "resume_rng",
        "distributed",
        "split_content",
        "seeds",
        "config",
        "kernels",
        "rank_environment",
        "data",
        "resume",
        "code",
        "environment",
        "lora",
        "model",
        "split",
        "other_seeds",
    ),
}
# Record keys of the model that define its computation besides weights and tokenizer: its
# config files, and the buffers the library computed from them at load.
_MODEL_FILE_KEYS = ("model.config_sha256", "model.config_files", "model.buffers")
#: Ledger fields a torchrun run reduces across its ranks, and the config keys besides the
#: ``distributed`` section's that choose how (a Trainer's DDP and FSDP arguments): ``_isolated``.
_REDUCED_FIELDS = frozenset({"loss", "grad_norm"})
_REDUCTION_CONFIG = ("config.distributed.", "config.trainer.args.ddp_", "config.trainer.args.fsdp")
#: How each kernel cause, unknown kernel facts and nondeterminism begin: ``is_traceable_cause``.
_UNKNOWN = "kernel facts are unknown"
_NONDETERMINISM = "yet nothing recorded differs"
#: Config keys that only choose which kernels run: told as the kernel facts they change.
_KERNEL_CONFIG_KEYS = frozenset({"config.determinism.cpu_isa"})
Kernels = tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]


def is_unexplained(cause: str) -> bool:
    """Whether a cause says that nothing recorded explains the divergence."""
    return _NONDETERMINISM in cause


def is_traceable_cause(cause: str) -> bool:
    """Whether a cause says the runs part at a kernel, at kernels nobody recorded, at nothing
    recorded, at the versions of the libraries that compute the step or at a buffer they computed
    from the model's config: the causes an op-level trace takes apart."""
    return any(
        word in cause for word in (*KERNEL_CAUSE, _UNKNOWN, _NONDETERMINISM, LIBRARIES_CAUSE, BUFFER_CAUSE)
    )


def explain(
    where: Where,
    adapter: AdapterDiff | None,
    differences: Sequence[Difference],
    split: SplitDiff | None,
    resumes: Sequence[Resume] = (),
    *,
    ledgers_equal: bool,
    kernels: Kernels = (None, None),
    edited: Sequence[str] = (),
    trainer: bool = False,
    traceable: bool = True,
    drifts: Sequence[ResumeDrift] = (),
) -> list[str]:
    """The ranked causes of the runs' divergence, in plain words (most likely first).

    Args:
        where: where the ledgers part.
        adapter: the adapter comparison, if either run has one.
        differences: every recorded value that differs.
        split: how the split manifests differ, if both runs have one.
        resumes: the resumed attempts of either run.
        ledgers_equal: whether every ledger line is equal.
        kernels: each record's kernel facts (``environment.kernels``), None where it has none.
        edited: the runs ("A", "B") whose ledger no longer matches the sha256 in their record:
            the first cause, and never nondeterminism then.
        trainer: a run was made by a Trainer script (a portable mode is its environment's, not a
            config key).
        traceable: ``reprotune trace`` can replay both runs (its commands follow a kernel cause).
        drifts: what the resumed attempt that computed the first divergent step noted as different
            from its run's start; told as the kind of difference it is (``kernels``: each run's
            kernel facts as that attempt computed).

    Returns:
        Sentences such as "data order differs from step 1: the split manifests differ in 3 rows";
        empty when the runs agree.
    """
    if ledgers_equal:
        if adapter is not None and not adapter.identical and adapter.sha256_a and adapter.sha256_b:
            return [
                "the ledgers agree line for line but the adapter files differ: an adapter was "
                "modified or saved differently after training"
            ]
        return []
    at = where.first_divergence_step
    if at is None:
        return [f"the runs agree over their {where.steps_compared} common steps but differ in length"]
    stage = stage_of(where)
    head = headline(stage, where)
    causes = [
        f"run {label}'s ledger does not match the sha256 in its record: it was edited or damaged after "
        "the run wrote it, so its lines are not the run's (restore it from a copy, or rerun the run)"
        for label in edited
    ]
    isolated = _isolated(where, adapter, differences)
    if isolated:
        causes.append(isolated)
    made = KernelAdvice(trainer, traceable)
    before, drifted = [r for r in resumes if r.from_step < at], [d for d in drifts if d.from_step < at]
    evidence = _evidence(stage, differences, split, before, kernels, made, drifted)
    causes.extend(f"{head}: {text}" for text in evidence)
    unknown = [label for label, facts in zip("AB", kernels, strict=True) if facts is None]
    if edited:
        return causes
    if unknown and not evidence and not isolated:
        whose = f"run {unknown[0]}'s" if len(unknown) == 1 else "both runs'"
        causes.append(
            f"{head}: the {_UNKNOWN} for {whose} record (made before reprotune recorded them): whether "
            "the CPU capability, BLAS code path or GPU libraries differ cannot be told from the records"
        )
    elif not evidence and not isolated:
        causes.append(
            f"{head}, {_NONDETERMINISM} (config, seeds, code, data, environment, kernel facts): the cause "
            "is nondeterminism, or a kernel choice no recorded fact shows"
        )
    return causes


def _isolated(where: Where, adapter: AdapterDiff | None, differences: Sequence[Difference]) -> str | None:
    """The cause when one lone ledger line differs and nothing computed after it does: a step
    before the last with every later step equal, or the last step with its weights hash and the
    adapter equal (a loss that differs beside equal weights was written, not trained); None
    otherwise. Another validation schedule that a config difference explains
    (``train.eval_every``) is that difference, not an edit; so is a lone loss or gradient norm
    beside another way of reducing them across ranks (the strategy, the world size, a rank's
    environment): a sum in another order can differ in its last bit at one step alone."""
    at = where.first_divergence_step
    if where.lines_differing != 1 or at is None:
        return None
    schedule = where.other_fields == ("validation schedule",) and where.first_other_step == at
    if schedule and any(d.category == "config" and not d.inert for d in differences):
        return None
    fields = set(fields_at(where))
    if fields and fields <= _REDUCED_FIELDS and any(_reduces(d) for d in differences):
        return None
    if at < where.steps_compared:
        later = "every later step agrees"
    elif where.first_weights_step is None and adapter is not None and adapter.identical:
        later = "its weights and the adapter agree"
    else:
        return None
    # A real change in training carries forward through the weights: one lone line that differs
    # while they agree was written differently, not computed differently.
    return (
        f"only the ledger line of step {at} differs ({fields_text(where)}) and {later}: "
        "the ledger looks edited or corrupted, not trained differently"
    )


def _reduces(diff: Difference) -> bool:
    """Whether ``diff`` can change how a torchrun run reduces its numbers across ranks."""
    return not diff.inert and (diff.category == "distributed" or diff.key.startswith(_REDUCTION_CONFIG))


def _evidence(
    stage: Stage,
    differences: Sequence[Difference],
    split: SplitDiff | None,
    resumes: Sequence[Resume],
    kernels: Kernels = (None, None),
    made: KernelAdvice | None = None,
    drifts: Sequence[ResumeDrift] = (),
) -> list[str]:
    """One sentence per kind of difference found, in the stage's ranking.

    ``resumes`` are the resumed attempts that restarted before the first divergence, ``drifts``
    what those that computed it noted as different from their run's start."""
    by_category = _grouped(differences, split)
    config = by_category.get("config", [])
    if "kernels" in by_category and config and all(d.key in _KERNEL_CONFIG_KEYS for d in config):
        del by_category["config"]  # one cause: the kernels (naming the mode); trace commands follow
    # The root seed first: when it differs, every derived seed differs because of it.
    seeds = sorted(by_category.pop("seeds", []), key=lambda d: (not d.key.endswith(".root"), d.key))
    relevant = _STAGE_SEEDS[stage]
    by_category["seeds"] = [d for d in seeds if d.key.split(".")[-1] in relevant]
    by_category["other_seeds"] = [d for d in seeds if d.key.split(".")[-1] not in relevant]
    texts: dict[str, str] = {}
    for kind, diffs in by_category.items():
        if diffs:
            texts[kind] = _summarize(kind, diffs)
    if by_category.get("model_files"):
        readers = [d for d in by_category.get("environment", []) if d.key == TRANSFORMERS_KEY]
        texts["model_files"] = model_files_text(by_category["model_files"], readers[0] if readers else None)
    if "kernels" in texts and kernels[0] is not None and kernels[1] is not None:
        texts["kernels"] = kernel_text(kernels[0], kernels[1], made or KernelAdvice()) or texts["kernels"]
    if split is not None:
        said = split_text(split)
        if said:
            # Changed row content changes numbers directly; moved rows change the order.
            texts["split_content" if split.content_changed else "split"] = said
    drifted = _drift_texts(drifts, texts, kernels, made or KernelAdvice())
    for resume in resumes:
        if resume.exact and (resume.run, resume.from_step) in drifted:
            continue  # it restored everything; what it ran with is the cause, told above
        if resume.reseeds_dropout and not (resume.rng_missing or resume.rng_changed or resume.state_missing):
            continue  # its dropout is seeded per micro-batch: no RNG state carries over a resume
        texts.setdefault("resume" if resume.exact else "resume_rng", resume_text(resume))
    ranking = _RANKING[stage]
    ordered = [texts[k] for k in ranking if k in texts]
    ordered.extend(text for kind, text in texts.items() if kind not in ranking)
    return ordered


def _grouped(differences: Sequence[Difference], split: SplitDiff | None) -> dict[str, list[Difference]]:
    """The differences that can change the numbers by kind of cause, each fact once."""
    by_category: dict[str, list[Difference]] = {}
    for diff in differences:
        if diff.inert:
            continue  # cannot change the numbers: listed under "what differs", never a cause
        group = "model_files" if diff.key.startswith(_MODEL_FILE_KEYS) else str(diff.category)
        if rank_environment_key(diff.key) is not None:
            group = "rank_environment"
        by_category.setdefault(group, []).append(diff)
    drop_restatements(by_category, split)
    return by_category


def _drift_texts(
    drifts: Sequence[ResumeDrift], texts: dict[str, str], kernels: Kernels, made: KernelAdvice
) -> set[tuple[str, int]]:
    """Add to ``texts`` each kind of difference a resume noted, beside the records' own (the kernel
    cause anew: ``kernels`` are already the facts each run computed the step with; the records'
    own sentence of a kind too where it says no more than the resume noted: one fact, one cause);
    return the resumes, by run and step, that noted one."""
    told: set[tuple[str, int]] = set()
    for drift in drifts:
        for kind, diffs in _grouped(drift.differences, None).items():
            if kind == "kernels":
                a, b = kernels
                said = kernel_text(a, b, made) if a is not None and b is not None else None
                if said is None:
                    continue  # facts of a GPU the run did not use, say
                texts[kind] = drift_text(drift, kind, said)
            else:
                summary = _summarize(kind, diffs)
                said = drift_text(drift, kind, summary)
                texts[kind] = f"{texts[kind]}; and {said}" if texts.get(kind, summary) != summary else said
            told.add((drift.run, drift.from_step))
    return told


def _summarize(kind: str, diffs: list[Difference]) -> str:
    """'torch 2.13.0 vs 2.14.1; threads 4 vs 8 (and 2 more environment differences)'."""
    label: Callable[[Difference], str] = key_label
    if kind == "distributed" and (world := distributed_text(diffs)) is not None:
        return world
    if kind == "model_files":
        return model_files_text(diffs, None)
    if kind == "rank_environment":
        return rank_environment_text(diffs)
    if kind == "environment":
        diffs = sorted(diffs, key=env_rank)
        if any(is_computing_library(d) for d in diffs):
            return libraries_text(diffs)
    elif kind in ("seeds", "other_seeds"):
        label = _seed_label
    shown = "; ".join(
        f"{label(d)} {value_text(d.a, d.change == 'added')} vs {value_text(d.b, d.change == 'removed')}"
        for d in diffs[:MAX_SHOWN]
    )
    rest = len(diffs) - MAX_SHOWN
    noun = "seed" if "seeds" in kind else kind
    return shown + (f" (and {rest} more {noun} differences)" if rest > 0 else "")


def _seed_label(diff: Difference) -> str:
    name = diff.key.split(".")[-1]
    return "root seed" if name == "root" else f"derived seed {name}"
