"""What in a Trainer's settings can break reproducibility: findings, as ``reprotune doctor`` gives them.

``ReprotuneCallback`` checks these at train begin, warns once (a :class:`ReproducibilityWarning`
per finding) and records them in the record's ``findings`` (the objects ``doctor --json`` lists:
``code``, ``severity``, ``title``, ``why``, ``fix``). Every code is in docs/integrations.md.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reprotune._compat import sampling_strategy
from reprotune._run.findings import Finding, Severity

#: Every finding code the callback can record (docs/integrations.md explains each).
FINDING_CODES: tuple[str, ...] = (
    "deterministic-algorithms-off",
    "dataloader-workers-unseeded",
    "fp16",
    "tf32-matmul-on",
    "peft-before-seed",
    "sampling-strategy",
    "sampler-unseeded",
    "ignore-data-skip",
    "torch-compile",
    "model-unhashed",
    "data-unhashed",
    "rows-unrecorded",
    "distributed-rank0-only",
    "output-dir-shared",
    "portable-mode-optimizer",
    "config-read-otherwise",
)


class ReproducibilityWarning(UserWarning):
    """A Trainer setting that can make two runs of the same script differ."""


@dataclass(frozen=True)
class SeedProbe:
    """torch's global RNG when the callback was made (before the Trainer re-seeds it).

    Attributes:
        initial_seed: ``torch.initial_seed()``, the seed it was last seeded with (a random
            64-bit number in a process that never seeded it).
        fresh: nothing has drawn from it since that seed was set.
    """

    initial_seed: int
    fresh: bool


def probe_seed() -> SeedProbe:
    """Look at torch's CPU RNG now, without drawing from it."""
    import torch

    seeded = torch.Generator().manual_seed(torch.initial_seed()).get_state()
    return SeedProbe(int(torch.initial_seed()), bool(torch.equal(seeded, torch.get_rng_state())))


@dataclass(frozen=True)
class TrainerFacts:
    """What the checks look at, gathered at train begin (plain data, so the checks are pure).

    Attributes:
        args: the TrainingArguments (any object with their attributes).
        deterministic_algorithms: ``torch.are_deterministic_algorithms_enabled()``.
        tf32_matmul: whether TF32 matmuls are on for CUDA (False without CUDA).
        workers_seeded: the train dataloader has a ``worker_init_fn``.
        seedable_sampler: the train rows are ordered by a sampler with its own seed.
        is_peft: the model is a PEFT model.
        adapter_made_by_trainer: the trainer built the adapter itself from a ``peft_config``.
        trainer_seeds_first: its ``__init__`` seeds before it builds the adapter
            (:func:`seeds_before_adapter`: TRL 1.x's ``SFTTrainer`` does, 0.x's did not).
        seed_probe: the RNG when the callback was made, or None when it was made after the
            Trainer (then the check cannot be done).
        world_size: processes training together.
        rows_recorded: the dataset indices of each batch are recorded (a map-style dataset).
        model_hashed: the base model's weight files were found and hashed.
        data_hashed: the train rows' content was hashed.
        foreign_checkpoints: checkpoints in ``args.output_dir`` that another run saved
            (:func:`~reprotune.integrations._ranks.foreign_checkpoints`).
        cpu_isa: the ``determinism.cpu_isa`` mode in force (``_determinism.isa.isa_in_force``).
        unfused_optimizer: the optimizer's class when, training on a CPU, its step may take a
            float32 square root through MKL's vector math (``_portable.sqrt_taking_optimizer``).
        config_misread: what the installed transformers computes otherwise than the base model's
            ``config.json`` gives, and the fix (``_model.rope_keys.rope_misread``), or None.
    """

    args: Any
    deterministic_algorithms: bool
    tf32_matmul: bool
    workers_seeded: bool
    seedable_sampler: bool
    is_peft: bool
    adapter_made_by_trainer: bool
    seed_probe: SeedProbe | None
    trainer_seeds_first: bool = True
    world_size: int = 1
    rows_recorded: bool = True
    model_hashed: bool = True
    data_hashed: bool = True
    foreign_checkpoints: tuple[str, ...] = ()
    cpu_isa: str = "native"
    unfused_optimizer: str | None = None
    config_misread: tuple[str, str] | None = None


def warn_findings(findings: list[dict[str, str]], *, stacklevel: int) -> None:
    """One :class:`ReproducibilityWarning` per finding above ``info``, naming its fix."""
    for finding in findings:
        if finding["severity"] != "info":
            message = f"reprotune: {finding['title']} ({finding['fix']})"
            warnings.warn(message, ReproducibilityWarning, stacklevel=stacklevel + 1)


def _finding(code: str, severity: Severity, title: str, why: str, fix: str) -> dict[str, str]:
    return Finding(code, severity, title, why, fix).to_dict()  # the record's form, as doctor's


@dataclass(frozen=True)
class _Rule:
    """One finding and when it applies: ``title`` (and ``fix``) may name values of the facts."""

    applies: Callable[[TrainerFacts], bool]
    code: str
    severity: Severity
    title: Callable[[TrainerFacts], str]
    why: str
    fix: str | Callable[[TrainerFacts], str]


def _strategy(facts: TrainerFacts) -> str:
    return sampling_strategy(facts.args)


def _strategy_setting(facts: TrainerFacts) -> str:
    """The setting as the user wrote it (transformers 4.x has only ``group_by_length``)."""
    if hasattr(facts.args, "train_sampling_strategy"):
        return f"train_sampling_strategy={_strategy(facts)!r} (the successor of group_by_length)"
    return "group_by_length=True"


#: Every finding about a Trainer's settings but the seed's, most important first (one table: a new
#: check is a row here, its code in FINDING_CODES and docs/integrations.md).
_RULES: tuple[_Rule, ...] = (
    _Rule(
        lambda f: not f.args.full_determinism and not f.deterministic_algorithms,
        "deterministic-algorithms-off",
        "warning",
        lambda f: "TrainingArguments.full_determinism is False: torch's deterministic algorithms are off",
        "on a GPU, cuBLAS and cuDNN may pick nondeterministic kernels; twin runs then differ in "
        "the last bits and drift apart",
        "pass full_determinism=True to TrainingArguments (it seeds with args.seed too)",
    ),
    _Rule(
        lambda f: f.args.dataloader_num_workers > 0 and not f.workers_seeded,
        "dataloader-workers-unseeded",
        "warning",
        lambda f: (
            f"dataloader_num_workers={f.args.dataloader_num_workers} and the train dataloader has "
            "no worker_init_fn"
        ),
        "random draws in the workers (augmentation, sampling) differ from run to run",
        "keep the Trainer's own get_train_dataloader, or pass worker_init_fn=reprotune.seed_worker",
    ),
    _Rule(
        lambda f: bool(f.args.fp16 or f.args.fp16_full_eval),
        "fp16",
        "warning",
        lambda f: "fp16 mixed precision is on",
        "the loss scaler skips steps on overflow and fp16 kernels differ across GPUs",
        "use bf16 or float32 where the hardware allows",
    ),
    _Rule(
        lambda f: bool(f.args.tf32 or f.tf32_matmul),
        "tf32-matmul-on",
        "warning",
        lambda f: "TF32 matmuls are on",
        "TF32 rounds matmul inputs to 10 mantissa bits; results depend on the GPU model",
        "pass tf32=False to TrainingArguments",
    ),
    _Rule(
        lambda f: f.config_misread is not None,
        "config-read-otherwise",
        "warning",
        lambda f: f.config_misread[0] if f.config_misread else "",
        "the base model's buffers (its rotary frequencies) and so every step differ from a run of the "
        "same files on transformers 5; the record's model.buffers show it to compare",
        lambda f: f.config_misread[1] if f.config_misread else "",
    ),
)

#: The rules that follow the seed's findings.
_LATER_RULES: tuple[_Rule, ...] = (
    _Rule(
        lambda f: _strategy(f) in ("group_by_length", "batch_rebalance"),
        "sampling-strategy",
        "warning",
        _strategy_setting,
        "the order depends on a seeded megabatch shuffle and on the token lengths: another "
        "tokenizer or max length reorders every batch",
        "use train_sampling_strategy='random' (transformers 4: group_by_length=False) when comparing "
        "runs, or keep lengths fixed",
    ),
    _Rule(
        lambda f: not f.seedable_sampler,
        "sampler-unseeded",
        "warning",
        lambda f: "the train rows are not ordered by a seedable sampler",
        "the data order is drawn from the global RNG, so anything that draws before the first "
        "epoch moves it (and the negative control cannot perturb it)",
        "keep accelerator_config.use_seedable_sampler=True (the default)",
    ),
    _Rule(
        lambda f: bool(f.args.ignore_data_skip),
        "ignore-data-skip",
        "warning",
        lambda f: "ignore_data_skip=True",
        "a resumed run starts its epoch over instead of skipping the batches already seen",
        "leave ignore_data_skip=False",
    ),
    _Rule(
        lambda f: bool(f.args.torch_compile),
        "torch-compile",
        "info",
        lambda f: "torch_compile=True",
        "compiled kernels can differ between runs and machines",
        "compare runs without torch_compile first",
    ),
    _Rule(
        lambda f: not f.model_hashed,
        "model-unhashed",
        "warning",
        lambda f: "the base model's weight files were not found: its weights are not hashed",
        "compare cannot tell a run on other base weights from this one",
        "load the model with from_pretrained from a directory, or a hub id in the local cache",
    ),
    _Rule(
        lambda f: not f.data_hashed,
        "data-unhashed",
        "warning",
        lambda f: "the train rows hold values with no canonical form: their content is not hashed",
        "compare cannot tell other data from this data (the batch indices are still recorded)",
        "give the Trainer rows of numbers, strings, lists or tensors",
    ),
    _Rule(
        lambda f: not f.rows_recorded,
        "rows-unrecorded",
        "warning",
        lambda f: (
            "the train dataloader has no batch sampler: the dataset indices of batches are not recorded"
        ),
        "the ledger's batch_sha256 then hashes the collated inputs instead of row indices",
        "use a map-style dataset (with __len__ and __getitem__)",
    ),
    _Rule(
        lambda f: f.world_size > 1,
        "distributed-rank0-only",
        "warning",
        lambda f: f"{f.world_size} processes train together; the ledger holds rank 0's view only",
        "the ledger holds rank 0's loss and rows; other ranks' rows are not recorded (their host, "
        "device, checkpoint RNG hashes and what each restores on resume are)",
        "use `reprotune run` under torchrun for a record of every rank",
    ),
    _Rule(
        lambda f: f.cpu_isa == "avx2-compatible" and f.unfused_optimizer is not None,
        "portable-mode-optimizer",
        "warning",
        lambda f: (
            f"determinism.cpu_isa avx2-compatible is in force, but the optimizer ({f.unfused_optimizer}) "
            "is not the fused AdamW"
        ),
        "on a CPU its square root is MKL's vsSqrt, a kernel built on rsqrtps, whose bits differ between "
        "Intel and AMD CPUs whatever MKL's settings: the run does not reproduce across vendors though "
        "the mode's variables are in force (reprotune run's AdamW runs fused in this mode)",
        'pass optim="adamw_torch_fused" to TrainingArguments (or give an AdamW made with fused=True)',
    ),
    _Rule(
        lambda f: bool(f.foreign_checkpoints),
        "output-dir-shared",
        "warning",
        lambda f: (
            f"output_dir {f.args.output_dir} holds checkpoints another run saved: "
            + ", ".join(f.foreign_checkpoints[:3])
            + (f" and {len(f.foreign_checkpoints) - 3} more" if len(f.foreign_checkpoints) > 3 else "")
        ),
        "this run's saves at the same steps overwrite them, and save_total_limit may delete them: that "
        "run can then no longer resume from them",
        "give each run its own output_dir",
    ),
)


def _apply(rules: tuple[_Rule, ...], facts: TrainerFacts) -> list[dict[str, str]]:
    return [
        _finding(r.code, r.severity, r.title(facts), r.why, r.fix(facts) if callable(r.fix) else r.fix)
        for r in rules
        if r.applies(facts)
    ]


def trainer_findings(facts: TrainerFacts) -> list[dict[str, str]]:
    """The reproducibility findings about a Trainer's settings, most important first."""
    return [*_apply(_RULES, facts), *_seed_findings(facts), *_apply(_LATER_RULES, facts)]


def _seed_findings(facts: TrainerFacts) -> list[dict[str, str]]:
    """Was the PEFT adapter built after ``args.seed`` was set (so its init is covered by it)?"""
    probe, seed = facts.seed_probe, facts.args.seed
    if probe is None or not facts.is_peft:
        return []
    why = (
        "get_peft_model draws the LoRA init from torch's global RNG; the Trainer seeds only later, so "
        "the adapter's initial weights are not determined by seed"
    )
    fix = "call reprotune.seed_everything(args.seed) (or set_seed) before building the PEFT model"
    if facts.adapter_made_by_trainer:
        if facts.trainer_seeds_first or probe.initial_seed == seed:
            return []
        title = (
            f"the trainer built the LoRA adapter from peft_config before it seeded (torch's RNG seed was "
            f"{probe.initial_seed}, not TrainingArguments.seed={seed}, when it was made; {_UNSEEDED})"
        )
        fix = "call reprotune.seed_everything(args.seed) before making the trainer (SFTTrainer(...))"
        return [_finding("peft-before-seed", "warning", title, why, fix)]
    if probe.initial_seed != seed:
        # The probe is taken when the callback is made: in the Trainer(...) call, right before the
        # Trainer re-seeds. A callback made earlier, before the script seeds, sees an unseeded RNG.
        title = (
            f"torch's RNG seed was {probe.initial_seed}, not TrainingArguments.seed={seed}, when the "
            f"callback was made ({_UNSEEDED}): the PEFT model was built before the seed was set, or "
            "the callback was made before the script seeded"
        )
        fix = (
            "call reprotune.seed_everything(args.seed) (or set_seed) before building the PEFT model, and "
            "make the callback in the Trainer(...) call, after both"
        )
        return [_finding("peft-before-seed", "warning", title, why, fix)]
    if probe.fresh:
        title = (
            f"torch's RNG was seeded with {seed} and not drawn from since, yet the model is a PEFT "
            "model: it was built before the seed was set"
        )
        return [_finding("peft-before-seed", "warning", title, why, fix)]
    return []


#: What an unexpected ``torch.initial_seed()`` may be: a process that never seeded has a random one.
_UNSEEDED = "a random one of torch's own when nothing seeded it"


#: Calls that build a PEFT adapter, and that seed, in a trainer's ``__init__`` source.
_BUILDS_ADAPTER = ("get_peft_model(", "prepare_peft_model(")
_SEEDS = ("set_seed(", "enable_full_determinism(")


def seeds_before_adapter(trainer_class: type) -> bool:
    """Whether the ``__init__`` that builds the adapter from ``peft_config`` (the nearest in the
    class's MRO that calls one of ``_BUILDS_ADAPTER``) seeds before it, read from its source.
    False when no source can be read: then the check assumes the adapter was built unseeded."""
    for cls in trainer_class.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        try:
            source = inspect.getsource(init)
        except (OSError, TypeError):
            return False
        builds = [source.find(call) for call in _BUILDS_ADAPTER if call in source]
        if builds:
            seeds = [source.find(call) for call in _SEEDS if call in source]
            return bool(seeds) and min(seeds) < min(builds)
    return False
