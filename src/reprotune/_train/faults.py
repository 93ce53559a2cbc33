"""Faults injected on purpose, for the tests that prove a check can fail (never in a real run).

``REPROTUNE_NOISE_AT_STEP=<n>`` in a run's environment adds noise drawn from ``os.urandom`` to one
trainable weight after optimizer step ``n``: a stand-in for a nondeterministic kernel, which
``verify`` must catch and blame on the rerun. ``REPROTUNE_SKIP_RNG_RESTORE=1`` makes ``reprotune
resume`` forget the RNG states (a broken resume, which ``verify`` must blame on the resume). Unset
(always, outside those tests), nothing changes. The crash tests' kill points are in
``reprotune._faults``.
"""

from __future__ import annotations

import os

import torch

from reprotune._train.loop import StepEnd, StepHook
from reprotune._train.setup import Setup

NOISE_ENV = "REPROTUNE_NOISE_AT_STEP"
SKIP_RNG_ENV = "REPROTUNE_SKIP_RNG_RESTORE"


def rng_restore_broken() -> bool:
    """Whether the environment asks ``resume`` to forget the RNG states (a test of verify)."""
    return os.environ.get(SKIP_RNG_ENV) == "1"


class NoiseHook:
    """Adds nondeterministic noise to the first trainable weight after step ``step``."""

    def __init__(self, setup: Setup, step: int) -> None:
        self._weight = setup.trainable[0]
        self._step = step

    def on_step_end(self, end: StepEnd) -> None:
        if end.step == self._step:
            seed = int.from_bytes(os.urandom(8), "little") & (2**63 - 1)
            noise = torch.randn(self._weight.shape, generator=torch.Generator().manual_seed(seed))
            with torch.no_grad():
                self._weight.add_(noise.to(self._weight.device, self._weight.dtype), alpha=1e-3)


def fault_hooks(setup: Setup) -> list[StepHook]:
    """The fault hooks the environment asks for (none, outside the tests of the checks)."""
    step = os.environ.get(NOISE_ENV)
    return [NoiseHook(setup, int(step))] if step else []
