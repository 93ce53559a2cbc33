"""The run directory's layout: every file name a run directory holds, spelled once.

``runs/<run-id>/`` (docs/run-directory.md)::

    record.json     the record: config, seeds, code, data, model, environment, status, outputs
    config.yaml     the resolved config, every default written out
    split.json      the split manifest the run trained on (and its row-hash sidecar, if large)
    ledger.jsonl    one line per optimizer step, exact bits
    code.patch      the uncommitted diff, when the tree was dirty
    adapter/        the LoRA adapter alone (adapter_model.safetensors, adapter_config.json)
    checkpoints/    step-NNNNNNNN/ directories for an exact resume
    .writer.lock    the one-writer lock, while a process writes the run (_run.lock)

A verification directory (``reprotune verify --out``) holds ``verification.json``, ``verify.log``,
its own ``config.yaml`` and one run directory per leg.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

RECORD: Final = "record.json"
CONFIG: Final = "config.yaml"
MANIFEST: Final = "split.json"
LEDGER: Final = "ledger.jsonl"
PATCH: Final = "code.patch"
ADAPTER_DIR: Final = "adapter"
ADAPTER_WEIGHTS: Final = "adapter_model.safetensors"
CHECKPOINTS: Final = "checkpoints"
LOCK: Final = ".writer.lock"

VERIFICATION: Final = "verification.json"
VERIFY_LOG: Final = "verify.log"
#: ``verify --spot``: the intervals and controls the replay process runs (``_proof.replay``).
SPOT_PLAN: Final = "plan.json"
#: A seed study's file, which marks its directory (``_studies.layout``): outputs stay out of it.
STUDY: Final = "study.json"
#: Where a study's runs go in its directory (``runs/<name>``): the one place runs may be made in it.
STUDY_RUNS: Final = "runs"


@dataclass(frozen=True)
class RunLayout:
    """The paths of one run directory.

    Example:
        >>> RunLayout(Path("runs/A")).ledger
        PosixPath('runs/A/ledger.jsonl')
    """

    root: Path

    @property
    def record(self) -> Path:
        return self.root / RECORD

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def ledger(self) -> Path:
        return self.root / LEDGER

    @property
    def patch(self) -> Path:
        return self.root / PATCH

    @property
    def adapter_dir(self) -> Path:
        return self.root / ADAPTER_DIR

    @property
    def adapter_weights(self) -> Path:
        return self.root / ADAPTER_DIR / ADAPTER_WEIGHTS

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def lock(self) -> Path:
        """The one-writer lock file (``_run.lock``), present while a process writes the run."""
        return self.root / LOCK

    def is_run_dir(self) -> bool:
        """Whether the directory holds a record (a run started here, whatever became of it)."""
        return self.record.is_file()


@dataclass(frozen=True)
class VerifyLayout:
    """The paths of one verification directory."""

    root: Path

    @property
    def verification(self) -> Path:
        return self.root / VERIFICATION

    @property
    def log(self) -> Path:
        return self.root / VERIFY_LOG

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    def leg(self, name: str) -> Path:
        """The run directory of leg ``name`` (``reference``, ``rerun``, ``control-seed``, ...)."""
        return self.root / name
