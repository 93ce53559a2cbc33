"""The seam between the training loop and the number of processes that train:
:class:`Distribution`, which the loop, the step hooks and the run's end call for everything that
differs when a run is spread over ranks (its share of a step and of validation, each rank's rows,
agreeing to stop, a lost rank, the weights hash, checkpoints, the adapter's weights), and that the
run's writer calls for the record's ``distributed`` section and a resume's restore. The step and
validation themselves are written once (``_train.step``) and ask it for their share.

A plain run's setup holds :data:`LOCAL`, whose methods are this process's own work and never enter
the distributed modules; ``_train.dist_strategy.distribute_setup`` gives a torchrun rank's setup a
``Distributed`` one.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
import torch.distributed

from reprotune._model.lora import WeightsHasher, tensors_sha256, trainable_tensors
from reprotune._run.checkpoint import CheckpointState, restore_latest_checkpoint, save_checkpoint
from reprotune._run.layout import RunLayout
from reprotune._run.ledger_resume import ledger_misfit, truncate_ledger
from reprotune._run.live_record import LiveRecord
from reprotune._train.step import StepShare, StepTally, max_grad_norm, ordered_sum

if TYPE_CHECKING:
    from reprotune._train.setup import Setup


@dataclass(frozen=True)
class Resume:
    """What a resume's restore needs: the run's record and directory, whether to restore the RNG
    state, an allowed change of world size (under torchrun only), where its notes go."""

    record: LiveRecord
    paths: RunLayout
    restore_rng: bool
    change: Mapping[str, int] | None
    report: Callable[[str], None]


class Distribution(Protocol):
    """How a setup's steps are computed and recorded across processes."""

    def step_share(self, setup: Setup, module: torch.nn.Module, step: int) -> StepShare:
        """This process's share of optimizer step ``step``, trained through ``module``."""
        ...

    def validation_batches(self, n_batches: int) -> Iterable[tuple[int, bool]]:
        """The validation batches this process runs, in order, each with whether it is scored."""
        ...

    def gather_validation(self, sums: list[float], counts: list[int]) -> tuple[list[float], list[int]]:
        """Every validation batch's loss sum and token count, in batch order, from this process's
        (its own scored, zeros elsewhere)."""
        ...

    def rank_rows(self, setup: Setup, rows: list[int]) -> list[list[int]] | None:
        """Each rank's rows of a step (for the ledger), or None for one process."""
        ...

    def agree_to_stop(self, stop: bool) -> bool:
        """Rank 0's decision to stop after this step, on every rank."""
        ...

    def lost_rank(self, exc: RuntimeError) -> BaseException | None:
        """The error to raise when ``exc`` says another rank left, else None."""
        ...

    def weights_hasher(self, setup: Setup) -> Callable[[], str]:
        """What the ledger hashes after each step (the whole trainable weights)."""
        ...

    def save_checkpoint(self, setup: Setup, directory: Path | None, state: CheckpointState) -> None:
        """Save a checkpoint of the setup at ``state`` into ``directory`` (None on ranks that
        write nothing)."""
        ...

    def adapter_state(self, setup: Setup) -> Mapping[str, torch.Tensor] | None:
        """The adapter's weights when the model cannot give them whole itself, else None."""
        ...

    def generator_seed(self, setup: Setup) -> int:
        """The seed of torch's global generator when a run starts from step 0."""
        ...

    def record_ranks(
        self,
        setup: Setup,
        record: LiveRecord,
        environment: Mapping[str, Any],
        *,
        resume: bool,
        report: Callable[[str], None],
    ) -> None:
        """The record's ``distributed`` section (every rank's identity, checked to agree); nothing
        for one process."""
        ...

    def restore(self, setup: Setup, resume: Resume) -> int:
        """A resume's restore from the latest valid checkpoint (noted on the record's attempt, the
        ledger cut to it); the step to go on from, 0 when there is none."""
        ...


class LocalStep:
    """A plain run's step: every micro-batch, nothing around them, torch's norm and clip."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup

    def mine(self, n_micro: int) -> Sequence[int]:
        return range(n_micro)

    def micro_batch(self, index: int, *, last: bool) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def finish(self, tally: StepTally) -> tuple[float, float]:
        setup = self.setup
        grad_norm = float(torch.nn.utils.clip_grad_norm_(setup.trainable, max_grad_norm(setup.cfg)))
        return ordered_sum(tally.losses), grad_norm


class Local:
    """A plain run: one process, no collective."""

    def step_share(self, setup: Setup, module: torch.nn.Module, step: int) -> StepShare:
        return LocalStep(setup)

    def validation_batches(self, n_batches: int) -> Iterable[tuple[int, bool]]:
        return ((b, True) for b in range(n_batches))

    def gather_validation(self, sums: list[float], counts: list[int]) -> tuple[list[float], list[int]]:
        return sums, counts

    def rank_rows(self, setup: Setup, rows: list[int]) -> list[list[int]] | None:
        return None

    def agree_to_stop(self, stop: bool) -> bool:
        return stop

    def lost_rank(self, exc: RuntimeError) -> BaseException | None:
        return None

    def weights_hasher(self, setup: Setup) -> Callable[[], str]:
        # Detached views of the trainable parameters: the optimizer updates them in place, so
        # one hasher built now hashes the current weights after every step.
        return WeightsHasher(trainable_tensors(setup.model))

    def save_checkpoint(self, setup: Setup, directory: Path | None, state: CheckpointState) -> None:
        if directory is None:
            raise ValueError("a plain run saves its checkpoints into its run directory")
        save_checkpoint(
            directory,
            state,
            model=setup.model,
            optimizer=setup.optimizer,
            scheduler=setup.scheduler,
            scaler=setup.scaler,
            keep=setup.cfg.train.keep_checkpoints,
        )

    def adapter_state(self, setup: Setup) -> Mapping[str, torch.Tensor] | None:
        return None

    def generator_seed(self, setup: Setup) -> int:
        return setup.seeds["dropout"]

    def record_ranks(
        self,
        setup: Setup,
        record: LiveRecord,
        environment: Mapping[str, Any],
        *,
        resume: bool,
        report: Callable[[str], None],
    ) -> None:
        return None

    def restore(self, setup: Setup, resume: Resume) -> int:
        if resume.change is not None:  # check_resume_world refuses a plain resume of a torchrun run
            raise ValueError("a plain run's resume cannot change its world size")
        paths = resume.paths
        restored = restore_latest_checkpoint(
            paths.checkpoints,
            model=setup.model,
            optimizer=setup.optimizer,
            scheduler=setup.scheduler,
            scaler=setup.scaler,
            restore_rng=resume.restore_rng,
            report=resume.report,
            fits=lambda state: ledger_misfit(
                paths.ledger,
                state.step,
                tensors_sha256(trainable_tensors(setup.model)),
                val_at_step=setup.validates_at(state.step),
            ),
        )
        if restored is None:  # nothing to restore: start over, from a clean ledger, and say so
            resume.record.note_attempt(started_over=True)  # no from_step: nothing was restored
            resume.report(f"no checkpoint to resume {paths.root} from: starting from step 0")
            return 0
        found, state = restored
        # What this attempt resumed from, for compare (a resume that skipped the RNG is a cause).
        resume.record.note_attempt(from_step=state.step, rng_restored=resume.restore_rng)
        truncate_ledger(
            paths.ledger,
            keep_through_step=state.step,
            val_at_step=setup.validates_at(state.step),
            report=resume.report,
        )
        resume.report(f"resuming {paths.root} from step {state.step} ({found.name})")
        return state.step


#: The distribution of every plain run.
LOCAL = Local()


def under_torchrun() -> bool:
    """Whether this process was started by ``torchrun`` (``TORCHELASTIC_RUN_ID`` is set): the one
    question a plain run asks before it goes its own way."""
    return bool(torch.distributed.is_torchelastic_launched())


def seed_generators(setup: Setup) -> None:
    """Seed the process's global generators when a run starts from step 0: torch's (dropout, and
    anything else that draws from it) and also Python's ``random`` and NumPy's legacy global RNG,
    with the distribution's generator seed (the ``dropout`` seed in a plain run, each rank's own in
    a distributed one, where dropout is then seeded per micro-batch). reprotune draws from neither
    of the others, but a checkpoint holds their states (a resume restores them for a user's hook
    or library that does): seeded, those states are the same in every rerun, so a checkpoint's RNG
    file is too (``verify --spot`` compares it)."""
    seed = setup.distribution.generator_seed(setup)
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed([seed & 0xFFFFFFFF, seed >> 32])
