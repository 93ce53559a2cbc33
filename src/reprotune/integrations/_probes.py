"""Watching a Trainer's optimizer steps without changing them: exact loss, grad norm, lr and rows.

A ``TrainerCallback`` is given no per-step numbers: the Trainer keeps the step's loss, gradient
norm and learning rate in local variables and logs only averages every ``logging_steps``. So the
probe observes the places those numbers come from, on the one Trainer instance it is attached to
(verified on transformers 5.24 and TRL 1.16, docs/integrations.md):

- the loss: ``trainer.training_step`` (an instance attribute wrapping the bound method, a user's
  override included) returns exactly the tensor the Trainer adds to its running loss, already
  scaled for gradient accumulation; the step's loss is the float32 sum of those, in order;
- the gradient norm: ``trainer.accelerator.clip_grad_norm_`` returns the norm before clipping
  (called once per optimizer step, with ``max_norm=inf`` when clipping is off);
- the learning rate: the optimizer's first param group in ``on_pre_optimizer_step`` (the
  scheduler steps after the optimizer);
- the rows: the train dataloader's batch sampler gets a subclass whose ``__iter__`` records each
  index list it yields, unchanged. Batches are drawn ahead of use (prefetching), so they are
  matched to micro-batches by position, never by time; on resume the batches the Trainer skips
  are iterated (not loaded) through the same sampler and are discarded first.

Nothing the Trainer computes is changed: the wrappers return what they were given.
"""

from __future__ import annotations

import hashlib
import sys
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from reprotune._errors import InputError

# The attribute a probed Trainer carries: its current probe (the wrappers look it up each call,
# so a second train() on the same Trainer reuses them with a fresh probe).
_PROBE_ATTR = "_reprotune_probe"
_SINK_ATTR = "_reprotune_sink"
_RECORDING_CLASSES: dict[type, type] = {}


def find_trainer() -> Any | None:
    """The ``transformers.Trainer`` whose method is on the call stack (callbacks are called from
    one), or None."""
    from transformers import Trainer

    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back  # type: ignore[assignment]
    return None


def refuse_a_second(trainer: Any, kind: type) -> None:
    """Refuse a Trainer given two callbacks of ``kind``: each would claim its own run directory
    (or the same one) for one training."""
    handler = getattr(trainer, "callback_handler", None)
    given = [c for c in getattr(handler, "callbacks", []) if isinstance(c, kind)]
    if len(given) > 1:
        raise InputError(
            f"the Trainer holds {len(given)} {kind.__name__}s: one training writes one run directory",
            source=kind.__name__,
            fix=f"give the Trainer one {kind.__name__} (in callbacks=[...] or by add_callback, not both)",
        )


def trainer_or_refuse(known: Any, *, steered: bool) -> Any:
    """The Trainer a callback is in: ``known`` (found when the Trainer was made) or the one on the
    stack now; ``steered``: verify steers the run, which needs the callback from the start.

    Raises:
        InputError: no Trainer found, or a steered run that was given the callback late.
    """
    trainer = known or find_trainer()
    if trainer is None:
        raise InputError(
            "ReprotuneCallback was called outside a transformers Trainer",
            source="ReprotuneCallback",
            fix="pass it in Trainer(..., callbacks=[ReprotuneCallback()])",
        )
    if known is None and steered:
        raise InputError(
            "reprotune verify steers this run, but the callback was added after the Trainer was made",
            source="ReprotuneCallback",
            fix="pass it in Trainer(..., callbacks=[ReprotuneCallback()]) instead of add_callback",
        )
    return trainer


def trainer_made_adapter(trainer: Any) -> bool:
    """Whether the Trainer being constructed received a PEFT config to build the adapter itself
    (TRL's ``SFTTrainer(peft_config=...)``, which seeds with ``args.seed`` first).

    Called from ``on_init_end``, while the trainer's ``__init__`` frames are on the stack.
    """
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_locals.get("self") is trainer and frame.f_locals.get("peft_config") is not None:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


@dataclass(frozen=True)
class StepNumbers:
    """One optimizer step as the Trainer computed it.

    Attributes:
        loss: the step's loss (sum of what ``training_step`` returned for its micro-batches).
        grad_norm: the gradient norm before clipping (nan when the Trainer did not compute one).
        lr: the learning rate the optimizer step used.
        rows: the dataset indices of the step's rows, in order (empty when unknown).
        n_tokens: the tokens the loss scored (labels other than -100 after the causal shift).
        inputs_sha256: sha256 of the collated tensors the Trainer fed, micro-batch by micro-batch.
    """

    loss: float
    grad_norm: float
    lr: float
    rows: list[int]
    n_tokens: int
    inputs_sha256: str


@dataclass
class StepProbe:
    """What the wrappers observed since the current optimizer step began."""

    losses: list[torch.Tensor] = field(default_factory=list)
    n_tokens: int = 0
    inputs: Any = field(default_factory=hashlib.sha256)
    grad_norm: float | None = None
    lr: float | None = None
    batches: deque[list[int]] = field(default_factory=deque)
    discard: int = 0
    records_rows: bool = False

    def begin_step(self) -> None:
        self.losses, self.n_tokens, self.inputs = [], 0, hashlib.sha256()
        self.grad_norm = None

    def end_step(self) -> StepNumbers:
        """The step's numbers; the batches of its micro-batches leave the queue."""
        if not self.losses:
            raise RuntimeError("no training_step was observed in this optimizer step")
        total = self.losses[0]
        for loss in self.losses[1:]:
            total = total + loss
        while self.discard and self.batches:
            self.batches.popleft()
            self.discard -= 1
        rows: list[int] = []
        for _ in self.losses:
            if self.batches:
                rows.extend(self.batches.popleft())
        return StepNumbers(
            loss=float(total.item()),
            grad_norm=float("nan") if self.grad_norm is None else self.grad_norm,
            lr=float("nan") if self.lr is None else self.lr,
            rows=rows,
            n_tokens=self.n_tokens,
            inputs_sha256=self.inputs.hexdigest(),
        )

    def observe_inputs(self, inputs: Mapping[str, Any]) -> None:
        self.n_tokens += _scored_tokens(inputs)
        for key in sorted(inputs):
            value = inputs[key]
            if isinstance(value, torch.Tensor):
                flat = value.detach().reshape(-1).contiguous()
                self.inputs.update(f"{key}\0{value.dtype}\0{tuple(value.shape)}\0".encode())
                self.inputs.update(flat.view(torch.uint8).cpu().numpy().tobytes())
            else:
                self.inputs.update(f"{key}\0{value!r}\0".encode())


def _scored_tokens(inputs: Mapping[str, Any]) -> int:
    """Tokens a causal-LM loss scores: ``shift_labels``, else ``labels[..., 1:]``, not -100;
    labels of another shape than the input ids (a class per sequence) count whole; without
    labels, the attention mask's ones (else every input id)."""
    labels, ids = inputs.get("shift_labels"), inputs.get("input_ids")
    if labels is None and isinstance(given := inputs.get("labels"), torch.Tensor):
        shifted = given.shape == ids.shape if isinstance(ids, torch.Tensor) else given.dim() > 1
        labels = given[..., 1:] if shifted else given
    if isinstance(labels, torch.Tensor):
        return int(labels.ne(-100).sum().item())
    mask = inputs.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        return int(mask.sum().item())
    return int(ids.numel()) if isinstance(ids, torch.Tensor) else 0


def install_probe(trainer: Any, train_dataloader: Any, probe: StepProbe) -> None:
    """Attach ``probe`` to ``trainer``: wrap ``training_step`` and the accelerator's
    ``clip_grad_norm_`` (once per Trainer), and record the train dataloader's batches."""
    setattr(trainer, _PROBE_ATTR, probe)
    if "training_step" not in vars(trainer):
        original_step = trainer.training_step

        def training_step(model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            current: StepProbe = getattr(trainer, _PROBE_ATTR)
            current.observe_inputs(inputs)  # before the Trainer moves them to the device
            loss = original_step(model, inputs, num_items_in_batch)
            current.losses.append(loss.detach().clone())
            return loss

        trainer.training_step = training_step
    accelerator = trainer.accelerator
    if "clip_grad_norm_" not in vars(accelerator):
        original_clip = accelerator.clip_grad_norm_

        def clip_grad_norm_(parameters: Any, max_norm: Any, norm_type: Any = 2) -> Any:
            norm = original_clip(parameters, max_norm, norm_type)
            current: StepProbe = getattr(trainer, _PROBE_ATTR)
            # None where the engine keeps the norm to itself (DeepSpeed before its first step)
            current.grad_norm = (
                float("nan")
                if norm is None
                else float(norm.item() if isinstance(norm, torch.Tensor) else norm)
            )
            return norm

        accelerator.clip_grad_norm_ = clip_grad_norm_
    batch_sampler = getattr(train_dataloader, "batch_sampler", None)
    iterable = isinstance(getattr(train_dataloader, "dataset", None), torch.utils.data.IterableDataset)
    if batch_sampler is not None and hasattr(batch_sampler, "__iter__") and not iterable:
        # (an iterable dataset's batch sampler yields no indices, only None per row)
        cls = type(batch_sampler)
        if cls not in _RECORDING_CLASSES.values():
            batch_sampler.__class__ = _recording_class(cls)
        setattr(batch_sampler, _SINK_ATTR, probe.batches.append)
        probe.records_rows = True


def _recording_class(cls: type) -> type:
    """A subclass of the batch sampler class ``cls`` that hands each batch it yields to a sink."""
    if cls not in _RECORDING_CLASSES:

        def __iter__(self: Any) -> Iterator[Any]:
            for batch in cls.__iter__(self):  # type: ignore[attr-defined]
                sink = getattr(self, _SINK_ATTR, None)
                if sink is not None:
                    sink([int(i) for i in batch])
                yield batch

        _RECORDING_CLASSES[cls] = type(f"Recording{cls.__name__}", (cls,), {"__iter__": __iter__})
    return _RECORDING_CLASSES[cls]


def data_sampler(train_dataloader: Any) -> Any | None:
    """The sampler that orders the train rows (accelerate's ``SeedableRandomSampler`` by
    default), or None."""
    batch_sampler = getattr(train_dataloader, "batch_sampler", None)
    sampler = getattr(batch_sampler, "sampler", None)
    inner = getattr(batch_sampler, "batch_sampler", None)  # accelerate's BatchSamplerShard
    if sampler is None and inner is not None:
        sampler = getattr(inner, "sampler", None)
    return sampler


def steps_per_epoch(train_dataloader: Any, grad_accum: int) -> int | None:
    """Optimizer steps in one epoch, as the Trainer counts them (None for an iterable dataset)."""
    try:
        batches = len(train_dataloader)
    except TypeError:
        return None
    return max(batches // grad_accum + int(batches % grad_accum > 0), 1)
