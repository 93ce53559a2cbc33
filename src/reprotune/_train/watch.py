"""A step hook that streams a run against a reference run's ledger and stops it once they part.

``reprotune verify`` runs its negative controls with it: a control only has to show that it
diverges, so it stops as soon as the divergence is seen and confirmed (the difference still there
``confirm`` steps later), or fails when nothing differs within ``bound`` steps. Each step is
compared on what the step computed (batch rows, token count, loss, learning rate, gradient norm,
validation loss), bit for bit, against the same step of the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprotune._run.ledger import batch_sha256, hexf, read_ledger
from reprotune._train.loop import StepEnd

_COMPARED = ("batch_sha256", "n_rows", "n_tokens", "loss", "lr", "grad_norm")


@dataclass
class DivergenceWatch:
    """Stop the run when it has parted from ``reference`` (or at ``bound`` when it has not).

    Args:
        reference: the reference run's ``ledger.jsonl``.
        bound: the last step to run if nothing differs by then.
        confirm: steps to go on after the first difference, which must still differ.
    """

    reference: Path
    bound: int
    confirm: int = 1
    first_divergence: int | None = None
    fields: tuple[str, ...] = ()
    _train: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False)
    _val: dict[int, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        ledger = read_ledger(self.reference)
        self._train = {e.step: dict(e.fields) for e in ledger.train}
        self._val = {e.step: e.fields["loss"] for e in ledger.val}

    def on_step_end(self, end: StepEnd) -> bool:
        differing = self._differing(end)
        if differing and self.first_divergence is None:
            self.first_divergence, self.fields = end.step, differing
        if self.first_divergence is not None and end.step >= self.first_divergence + self.confirm:
            return True  # seen and confirmed: this control has shown what it had to
        return end.step >= self.bound

    def _differing(self, end: StepEnd) -> tuple[str, ...]:
        ref = self._train.get(end.step)
        if ref is None:
            return ("step",)  # the reference has no such step: the runs have another length
        mine = {
            "batch_sha256": batch_sha256(end.rows),
            "n_rows": len(end.rows),
            "n_tokens": end.n_tokens,
            "loss": hexf(end.loss),
            "lr": hexf(end.lr),
            "grad_norm": hexf(end.grad_norm),
        }
        differing = tuple(name for name in _COMPARED if mine[name] != ref.get(name))
        if end.validation is not None and self._val.get(end.step) != hexf(end.validation.loss):
            differing += ("validation loss",)
        return differing
