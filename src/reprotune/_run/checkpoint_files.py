"""A checkpoint's files checked without torch: its ``state.json`` format, the directory names, and
:func:`verify_checkpoint` (every file against its recorded sha256). ``_run.checkpoint`` writes and
restores checkpoints; ``pack --checkpoints`` and ``verify --spot`` only need to check them.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from reprotune._documents import validation_problems
from reprotune._formats import CHECKPOINT
from reprotune._jsonio import canonical_sha256, sha256_file

STATE_FILE = "state.json"
WEIGHTS_FILE = "trainable.safetensors"
OPTIMIZER_FILE = "optimizer.pt"  # the optimizer's, the schedule's and the scaler's states
RNG_META = "rng.json"
RNG_TENSORS = "rng.safetensors"
_PREFIX = "step-"
#: The files a checkpoint holds besides state.json; state.json must list exactly these.
DATA_FILES = (OPTIMIZER_FILE, RNG_META, RNG_TENSORS, WEIGHTS_FILE)

#: The file the Trainer callback writes into each Trainer checkpoint it sees saved: the run
#: directory it belongs to, so that a resume from that checkpoint continues the same run, and every
#: rank's facts (``integrations._writer.mark_checkpoint``).
TRAINER_CHECKPOINT_MARKER = "reprotune-run.json"

#: A Hugging Face Trainer checkpoint's state files: what a resume without each loses (the
#: callback's warning and compare's cause say the same). The Trainer restores the optimizer and
#: the schedule only when both files are there, and logs a missing one at INFO level at most.
#: (Their names are the Trainer's: its optimizer.pt is not a reprotune checkpoint's OPTIMIZER_FILE.)
TRAINER_DATA_POSITION = "the data position"
TRAINER_PIECES = {
    "rng": "its dropout and sampling draws differ from the uninterrupted run's",
    "optimizer.pt": "the optimizer's moments and step count start again from zero, and the "
    "learning-rate schedule with them (the Trainer restores the two only together)",
    "scheduler.pt": "the learning-rate schedule starts again, and the optimizer's state with it",
    "scaler.pt": "the fp16 loss scale starts again from its initial value",
    TRAINER_DATA_POSITION: "ignore_data_skip=True: the resumed epoch starts again from its first batch",
}


class StateFile(BaseModel):
    """A checkpoint's ``state.json``: where the run stood (``step``, ``epoch``, ``position`` in the
    data order), the sha256 of every other file, a distributed run's world (absent for one
    process), and its own sha256 over the rest (docs/checkpoints.md)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    schema_: Literal["reprotune/checkpoint"] = Field(alias="schema")
    schema_version: Literal[2]
    step: StrictInt
    epoch: StrictInt
    position: tuple[StrictInt, StrictInt]
    files: dict[str, str]
    distributed: dict[str, Any] | None = None
    state_sha256: str


def read_state_file(path: Path) -> StateFile:
    """The ``state.json`` of the checkpoint at ``path``, which :func:`verify_checkpoint` passed."""
    return StateFile.model_validate_json((path / STATE_FILE).read_bytes())


def _state_sha256(state: dict[str, Any]) -> str:
    """sha256 of state.json's content without its own ``state_sha256`` key, as canonical JSON."""
    body = {k: v for k, v in state.items() if k != "state_sha256"}
    return canonical_sha256(body, indent=1)


def checkpoint_dir(directory: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` is (or goes) in ``directory``: ``step-00000010``."""
    return directory / f"{_PREFIX}{step:08d}"


def list_checkpoints(directory: Path) -> list[Path]:
    """Completed checkpoint directories, oldest first (temporary ones are ignored)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_dir() and p.name.startswith(_PREFIX))


def step_of(path: Path) -> int | None:
    """The step a checkpoint directory's name gives (``step-00000010``: 10), or None."""
    digits = path.name[len(_PREFIX) :]
    return int(digits) if path.name.startswith(_PREFIX) and digits.isdigit() else None


def newer_checkpoints(directory: Path, step: int) -> list[Path]:
    """The checkpoints in ``directory`` of steps after ``step``: once a resume goes on from
    ``step`` (or from 0), they are of an abandoned attempt whose ledger lines are gone, and a
    later resume that took one would leave a gap in the ledger."""
    return [p for p in list_checkpoints(directory) if (step_of(p) or 0) > step]


def drop_newer_checkpoints(directory: Path, step: int, report: Callable[[str], None]) -> None:
    """Remove the :func:`newer_checkpoints` of a resume going on from ``step``, saying so."""
    for stale in newer_checkpoints(directory, step):
        shutil.rmtree(stale, ignore_errors=True)
        report(f"removed checkpoint {stale.name}: this attempt goes on from step {step}, before it")


def verify_checkpoint(path: Path) -> str | None:
    """None when the checkpoint at ``path`` is whole; otherwise what is wrong with it.

    state.json must match its own ``state_sha256``, be a :class:`StateFile` and list exactly
    ``DATA_FILES``; each of those must match its recorded sha256.
    """
    try:
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{STATE_FILE} unreadable ({exc})"
    if not isinstance(state, dict):
        return f"{STATE_FILE} is not a JSON object"
    if not CHECKPOINT.holds(state):
        return f"{STATE_FILE} is not a checkpoint state: schema {state.get('schema')!r}"
    if state.get("schema_version") != CHECKPOINT.version:
        return f"unknown checkpoint schema version {state.get('schema_version')!r}"
    if state.get("state_sha256") != _state_sha256(state):
        return f"{STATE_FILE} does not match its recorded sha256"
    try:
        files = StateFile.model_validate(state).files
    except ValidationError as exc:
        return f"{STATE_FILE} is not a checkpoint state: {'; '.join(validation_problems(exc))}"
    if sorted(files) != sorted(DATA_FILES):
        return f"{STATE_FILE} lists files {sorted(files)}, expected {sorted(DATA_FILES)}"
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if sha256_file(file) != expected:
            return f"{name} does not match its recorded sha256"
    return None
