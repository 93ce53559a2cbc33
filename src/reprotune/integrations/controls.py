"""What ``reprotune verify --command`` tells the callback inside the user's script, and how.

The command is the user's own script; ``ReprotuneCallback`` is the only part of reprotune inside
it. So ``verify`` steers each leg through environment variables, which the callback reads when it
is created; this module is their one owner (names, meanings, parsing), used on both sides.

======================================  =========================================================
``REPROTUNE_RUN_DIR``                   the run directory to write (wins over ``run_dir=``)
``REPROTUNE_OUTPUT_DIR``                replaces ``TrainingArguments.output_dir`` (the Trainer's
                                        own checkpoints), so the legs do not share one
``REPROTUNE_STOP_AFTER``                stop after this optimizer step, saving a Trainer checkpoint
``REPROTUNE_RESUME_FROM``               resume from this Trainer checkpoint: passed to the
                                        Trainer's own ``train(resume_from_checkpoint=...)``
``REPROTUNE_BRANCH_FROM``               a resume into a new run directory branches from this run
                                        directory, not the one the checkpoint's marker names
                                        (``reprotune trace --command``: the run where it lies
                                        now, moved since or not)
``REPROTUNE_PERTURB_DATA_SEED``         add this to the data-order seed (the negative control)
``REPROTUNE_TRACE_STEP``                trace this optimizer step's ops (``reprotune trace
                                        --command``: ``integrations._tracing``)
``REPROTUNE_TRACE_OUT``                 the file the trace of that step is written to
======================================  =========================================================

Importing this module imports nothing heavy: ``verify`` uses it without torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from reprotune._errors import InputError

RUN_DIR: Final = "REPROTUNE_RUN_DIR"
OUTPUT_DIR: Final = "REPROTUNE_OUTPUT_DIR"
STOP_AFTER: Final = "REPROTUNE_STOP_AFTER"
RESUME_FROM: Final = "REPROTUNE_RESUME_FROM"
BRANCH_FROM: Final = "REPROTUNE_BRANCH_FROM"
PERTURB_DATA_SEED: Final = "REPROTUNE_PERTURB_DATA_SEED"
TRACE_STEP: Final = "REPROTUNE_TRACE_STEP"
TRACE_OUT: Final = "REPROTUNE_TRACE_OUT"

#: Variables that only say where to write and when to stop or resume: left out of the recorded
#: environment (the record's ``trainer`` section and ``attempts`` say what they did), so that two
#: legs of one verification, which differ in them by design, do not differ in their environment.
#: The data-seed perturbation changes the numbers: it stays in the environment too.
UNRECORDED_VARIABLES: Final = (
    RUN_DIR,
    OUTPUT_DIR,
    STOP_AFTER,
    RESUME_FROM,
    BRANCH_FROM,
    TRACE_STEP,
    TRACE_OUT,
)


@dataclass(frozen=True)
class Controls:
    """What one run of the user's script is asked to do differently (nothing, by default).

    Attributes:
        run_dir: the run directory to write, or None for the callback's own choice.
        output_dir: the Trainer's output directory to use instead of the script's, or None.
        stop_after: stop after this optimizer step (>= 1), saving a Trainer checkpoint, or None.
        resume_from: a Trainer checkpoint directory to resume from, or None.
        branch_from: the run directory a resume into a new run directory branches from, instead
            of the one the checkpoint's marker names, or None.
        perturb_data_seed: added to the data-order seed (0: no change).
        trace_step: trace this optimizer step (>= 1) into ``trace_out``, or None.
        trace_out: where the trace of ``trace_step`` is written.
    """

    run_dir: Path | None = None
    output_dir: Path | None = None
    stop_after: int | None = None
    resume_from: Path | None = None
    branch_from: Path | None = None
    perturb_data_seed: int = 0
    trace_step: int | None = None
    trace_out: Path | None = None

    def to_env(self) -> dict[str, str]:
        """The variables that carry these controls (only those that are set)."""
        env: dict[str, str] = {}
        if self.run_dir is not None:
            env[RUN_DIR] = str(self.run_dir)
        if self.output_dir is not None:
            env[OUTPUT_DIR] = str(self.output_dir)
        if self.stop_after is not None:
            env[STOP_AFTER] = str(self.stop_after)
        if self.resume_from is not None:
            env[RESUME_FROM] = str(self.resume_from)
        if self.branch_from is not None:
            env[BRANCH_FROM] = str(self.branch_from)
        if self.perturb_data_seed:
            env[PERTURB_DATA_SEED] = str(self.perturb_data_seed)
        if self.trace_step is not None and self.trace_out is not None:
            env[TRACE_STEP] = str(self.trace_step)
            env[TRACE_OUT] = str(self.trace_out)
        return env

    def stop_here(self, state: Any, control: Any) -> bool:
        """The stop after step K on the Trainer's ``control`` (a checkpoint saved there, even with
        ``save_strategy="no"``, and training ended) when ``state`` is at K; whether it stopped.
        The callback calls it on every rank."""
        step = int(state.global_step)
        if self.stop_after is None or step != self.stop_after or step >= state.max_steps:
            return False
        control.should_save = True
        control.should_training_stop = True
        return True

    def no_evaluation_inside_the_epoch(self, stopped: bool, state: Any, control: Any) -> None:
        """At an epoch's end after the stop: where the stop fell inside the epoch, the loop ended
        as an epoch's end would, and the evaluation the Trainer then asks for (``eval_strategy``
        ``"epoch"``) is not the run's, so it is dropped. The callback calls it on every rank (an
        evaluation is collective); ``state.epoch`` is a whole number at an epoch's end."""
        if stopped and state.epoch is not None and float(state.epoch) != int(state.epoch):
            control.should_evaluate = False

    def perturb(self, sampler: Any, report: Callable[[str], None]) -> int | None:
        """Apply the data-seed perturbation to the train sampler (on every rank: each orders its
        rows with its own); return the sampler's seed, or None without one."""
        delta = self.perturb_data_seed
        seed = getattr(sampler, "initial_seed", None)
        if delta and seed is not None:
            sampler.initial_seed = seed + delta
        elif delta:
            report("warning: REPROTUNE_PERTURB_DATA_SEED is set but the sampler has no seed to perturb")
        value = getattr(sampler, "initial_seed", None)
        return int(value) if isinstance(value, int) else None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Controls:
        """Read the controls from ``env`` (default ``os.environ``).

        Raises:
            InputError: a variable holds a value it cannot (its name and value are given).
        """
        environ = os.environ if env is None else env

        def path(name: str) -> Path | None:
            value = environ.get(name, "")
            return Path(value) if value.strip() else None

        stop_after = _integer(environ, STOP_AFTER, minimum=1)
        trace_step, trace_out = _integer(environ, TRACE_STEP, minimum=1), path(TRACE_OUT)
        if (trace_step is None) != (trace_out is None):
            raise InputError(
                f"{TRACE_STEP} and {TRACE_OUT} go together; only one of them is set",
                source=f"environment variable {TRACE_STEP if trace_step is not None else TRACE_OUT}",
                fix="let `reprotune trace --command` set them, or unset both",
            )
        return cls(
            run_dir=path(RUN_DIR),
            output_dir=path(OUTPUT_DIR),
            stop_after=stop_after,
            resume_from=path(RESUME_FROM),
            branch_from=path(BRANCH_FROM),
            perturb_data_seed=_integer(environ, PERTURB_DATA_SEED, minimum=None) or 0,
            trace_step=trace_step,
            trace_out=trace_out,
        )


def _integer(env: Mapping[str, str], name: str, *, minimum: int | None) -> int | None:
    text = env.get(name, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or (minimum is not None and value < minimum):
        floor = f" >= {minimum}" if minimum is not None else ""
        raise InputError(
            f"environment variable {name}={text!r} is not a whole number{floor}",
            source=f"environment variable {name}",
            fix=f"unset {name}, or set it to a whole number{floor}",
        )
    return value
