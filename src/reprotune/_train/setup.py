"""Everything a run needs before its first step, built in one place: :func:`build_setup`.

In order: seeds, device and determinism flags, data and split (the manifest is written into the
run directory), base model, LoRA (its init drawn from the ``lora_init`` seed at the moment of
creation), the data order, optimizer, scheduler and grad scaler. The benchmarks build their runs
with the same function, so a benchmark measures the run that ``reprotune run`` makes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from reprotune._config.schema import ExperimentConfig
from reprotune._data.order import ORDER_VERSION, DataOrder
from reprotune._determinism.device import resolve_device
from reprotune._determinism.flags import apply_determinism
from reprotune._determinism.seeds import derive_seeds
from reprotune._model.loading import load_base_model
from reprotune._model.lora import apply_lora, lora_config_dict, lora_defaults
from reprotune._model.positions import refuse_past_the_model
from reprotune._run.live_record import Section
from reprotune._train.batches import Examples
from reprotune._train.data import RunData, check_rows_per_step, prepare_data, save_manifest
from reprotune._train.loss import supports_logits_to_keep
from reprotune._train.optim import optimizer_and_scheduler
from reprotune._train.strategy import LOCAL, Distribution

if TYPE_CHECKING:
    from peft import PeftModel

    from reprotune._train.distributed import DistContext


@dataclass(frozen=True)
class Setup:
    """A run ready to train: the model with its LoRA, the data, the order, the optimizer.

    Attributes:
        cfg: the experiment.
        seeds: every derived seed.
        device: where it trains.
        determinism: the flags in force, read back (the record's ``determinism`` section).
        data: the table and its split.
        model: the base model with LoRA, on ``device``.
        model_info: what the record keeps about the base model (``LoadedModel.info``).
        examples: the rows, tokenised on first use.
        pad_token_id: the pad token's id.
        keep_logits: whether the loss may ask the model for the scored positions' logits only.
        order: the data order (rows of every optimizer step).
        total_steps: optimizer steps of the whole run.
        val_rows: the validation rows the loss is measured on.
        trainable: the trainable parameters (the LoRA weights).
        optimizer: over ``trainable``.
        scheduler: the learning-rate schedule.
        scaler: the fp16 grad scaler, or None.
        dist: this rank's place in a distributed run (``torchrun``); None in a plain run.
        train_module: what the training forward goes through in a distributed run (DDP over
            ``model``, or ``model`` sharded by FSDP); None in a plain run.
        rank_init_sha256: this rank's LoRA init hash, taken before sharding (distributed runs).
        distribution: how the loop computes and records a step across processes
            (``_train.strategy``): :data:`LOCAL` in a plain run.
    """

    cfg: ExperimentConfig
    seeds: Mapping[str, int]
    device: torch.device
    determinism: Mapping[str, Any]
    data: RunData
    model: PeftModel
    model_info: Mapping[str, Any]
    examples: Examples
    pad_token_id: int
    keep_logits: bool
    order: DataOrder
    total_steps: int
    val_rows: list[int]
    trainable: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler | None
    dist: DistContext | None = None
    train_module: torch.nn.Module | None = None
    rank_init_sha256: str | None = None
    distribution: Distribution = LOCAL

    def __post_init__(self) -> None:
        # One answer to "is this run distributed": a rank's context and the seam go together
        # (``distribute_setup`` sets both), so no code path can ask one and get the other's answer.
        if (self.dist is None) != (self.distribution is LOCAL):
            raise ValueError("a Setup's dist and distribution disagree: use distribute_setup for a rank")

    def validates_at(self, step: int) -> bool:
        """Whether the validation loss is measured after optimizer step ``step``."""
        every = self.cfg.train.eval_every
        return bool(self.val_rows) and (
            (every is not None and every > 0 and step % every == 0) or step == self.total_steps
        )

    def record_sections(self) -> dict[Section, Any]:
        """The record sections the setup fills in: determinism, data (with its order), model, lora and
        its class's defaults."""
        data = self.data.describe()
        data["order"] = {
            "version": ORDER_VERSION,
            "rows_per_step": self.order.rows_per_step,
            "total_steps": self.total_steps,
        }
        return {
            "determinism": dict(self.determinism),
            "data": data,
            "model": {
                **self.model_info,
                "max_length": self.cfg.model.max_length,
                "padding_side": self.cfg.model.padding_side,
            },
            "lora": lora_config_dict(self.model),
            "lora_defaults": lora_defaults(self.model),
        }


def build_setup(
    cfg: ExperimentConfig,
    *,
    manifest_out: Path | None = None,
    manifest: Path | None = None,
    resumed: bool = False,
    observe_lora: AbstractContextManager[Any] | None = None,
) -> Setup:
    """Build everything the run of ``cfg`` needs before its first step.

    Args:
        cfg: the experiment.
        manifest_out: where the split manifest is written; None: later (:func:`with_saved_manifest`).
        manifest: train on this manifest instead of the config's split (``rerun``).
        resumed: a resumed run: keep the manifest already at ``manifest_out``.
        observe_lora: entered around the LoRA init alone (``_model.lora.apply_lora``'s ``observe``).

    Returns:
        The setup. Nothing has drawn from torch's global generator for dropout yet: the caller
        seeds it (``seeds["dropout"]``) when the run starts from step 0.

    Raises:
        InputError: bad data, model or config found while building.
    """
    base_model = cfg.model.name  # as the config writes it: what the adapter names as its base
    cfg = cfg.resolve_paths()  # relative paths open against config_dir; the identity keeps them
    seeds = derive_seeds(cfg.seed.root, dict(cfg.seed.overrides))
    device = resolve_device(cfg.determinism.device)
    flags = apply_determinism(
        cfg.determinism.mode, cfg.determinism.threads, device.type, cpu_isa=cfg.determinism.cpu_isa
    )
    data = prepare_data(cfg, seeds, manifest_out, reuse_manifest=resumed, manifest=manifest)
    check_rows_per_step(cfg, data)

    loaded = load_base_model(
        cfg.model.name,
        revision=cfg.model.revision,
        dtype=cfg.model.dtype,
        pad_token_id=cfg.model.pad_token_id,
        padding_side=cfg.model.padding_side,
        device=str(device),
    )
    if cfg.eval.generate_at_end:  # the eval at the end refuses this: now, not after the training
        refuse_past_the_model(loaded.model.config, cfg.model.max_length, cfg.eval.max_new_tokens)
    model = _with_lora(loaded.model, cfg, seeds["lora_init"], base_model, observe_lora)
    model.to(device)

    rows_per_step = cfg.train.batch_size * cfg.train.grad_accum_steps
    order = DataOrder(seeds["data_order"], data.split_rows("train"), rows_per_step)
    total_steps = _total_steps(cfg, order)

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler = optimizer_and_scheduler(
        trainable, cfg.train, total_steps, cpu_isa=cfg.determinism.cpu_isa
    )
    return Setup(
        cfg=cfg,
        seeds=seeds,
        device=device,
        determinism=flags,
        data=data,
        model=model,
        model_info=loaded.info,
        examples=Examples(data, loaded.tokenizer, cfg),
        pad_token_id=int(loaded.info["pad_token_id"]),
        # Logits only where the loss reads them (the same losses, less work), if the model can.
        keep_logits=supports_logits_to_keep(model),
        order=order,
        total_steps=total_steps,
        val_rows=data.eval_rows(seeds["eval"]),
        trainable=trainable,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=torch.amp.GradScaler(device.type) if cfg.train.precision == "fp16" else None,
    )


def with_saved_manifest(setup: Setup, path: Path) -> Setup:
    """``setup`` after its split manifest was put at ``path`` (the run directory's ``split.json``)."""
    return dataclasses.replace(setup, data=save_manifest(setup.data, path))


def _with_lora(
    model: torch.nn.Module,
    cfg: ExperimentConfig,
    seed: int,
    base_model: str,
    observe: AbstractContextManager[Any] | None,
) -> PeftModel:
    peft_model = apply_lora(
        model,
        seed=seed,
        observe=observe,
        r=cfg.lora.r,
        alpha=cfg.lora.alpha,
        dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.target_modules),
        bias=cfg.lora.bias,
    )
    # The base model as the config names it, not the absolute path it was loaded from:
    # adapter_config.json stays the same wherever the project lives (PEFT writes this name there).
    peft_model.peft_config["default"].base_model_name_or_path = base_model
    return peft_model


def _total_steps(cfg: ExperimentConfig, order: DataOrder) -> int:
    if cfg.train.max_steps is not None:
        return cfg.train.max_steps
    assert cfg.train.epochs is not None  # the config guarantees exactly one of the two
    return order.steps_for_epochs(cfg.train.epochs)
