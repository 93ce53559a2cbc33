"""One fact, one cause: the recorded differences that restate another one that differs beside them
(a config key and the record's value taken from it, a steering variable and the kernel facts it
steers), left out of ``compare``'s causes so that each fact is said once. No torch."""

from __future__ import annotations

from collections.abc import Callable

from reprotune._proof.cause_texts import split_text
from reprotune._proof.differences import Difference, SplitDiff
from reprotune._run.kernels import STEERING_ENV

#: Keys of the record's model, data and LoRA sections that a run takes from config values: where
#: one of those differs too, the record's key restates it and is no cause of its own.
_RESTATED_CONFIG: dict[str, tuple[str, ...]] = {
    "model.max_length": ("config.model.max_length",),
    "model.dtype": ("config.model.dtype",),
    "model.padding_side": ("config.model.padding_side",),
    "model.pad_token_id": ("config.model.pad_token_id",),
    "data.prompt_field": ("config.data.prompt_field",),
    "data.response_field": ("config.data.response_field",),
    "data.order.total_steps": (
        "config.train.max_steps",
        "config.train.epochs",
        "config.train.batch_size",
        "config.train.grad_accum_steps",
    ),
    "data.order.rows_per_step": ("config.train.batch_size", "config.train.grad_accum_steps"),
    "lora.r": ("config.lora.r",),
    "lora.lora_alpha": ("config.lora.alpha",),
    "lora.lora_dropout": ("config.lora.dropout",),
    "lora.target_modules": ("config.lora.target_modules",),
    "lora.bias": ("config.lora.bias",),
}


def drop_restatements(by_category: dict[str, list[Difference]], split: SplitDiff | None) -> None:
    """One fact, one cause: the config's seed keys restate the recorded seeds, the manifest's
    sha256 restates the split difference that names its rows, the recorded environment
    variables that steer kernels restate the kernel facts, and what the record's model, data and
    LoRA sections took from a config value that differs (``_RESTATED_CONFIG``) restates it, and so
    does the distributed strategy a torchrun run recorded (``distributed.strategy``, which the
    distributed cause tells with the reductions it chose) of ``config.distributed.strategy``."""
    if by_category.get("seeds"):
        _keep(by_category, "config", lambda d: d.key.split(".")[:2] != ["config", "seed"])
    config = {d.key for d in by_category.get("config", [])}
    for kind in ("model", "data", "lora"):
        _keep(by_category, kind, lambda d: config.isdisjoint(_RESTATED_CONFIG.get(d.key, ())))
    if split is not None and split_text(split):
        _keep(by_category, "data", lambda d: d.key != "data.manifest_sha256")
    if by_category.get("kernels"):  # the kernel facts' steering_env names these variables already
        _keep(by_category, "environment", lambda d: _restated_variable(d.key) not in STEERING_ENV)
    if any(d.key == "distributed.strategy" for d in by_category.get("distributed", [])):
        _keep(by_category, "config", lambda d: d.key != "config.distributed.strategy")


def _restated_variable(key: str) -> str:
    """The variable an environment key records: ``environment.env.OMP_NUM_THREADS``, and
    ``environment.threads.omp_num_threads`` (the thread variables again, beside torch's own)."""
    if key.startswith("environment.threads."):
        return key.removeprefix("environment.threads.").upper()
    return key.removeprefix("environment.env.")


def _keep(by_category: dict[str, list[Difference]], kind: str, wanted: Callable[[Difference], bool]) -> None:
    kept = [d for d in by_category.get(kind, []) if wanted(d)]
    if kept:
        by_category[kind] = kept
    else:
        by_category.pop(kind, None)
