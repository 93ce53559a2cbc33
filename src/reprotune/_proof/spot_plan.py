"""A spot check's plan (``plan.json`` in its directory): what ``verify --spot`` (``_proof.spot``)
asks its one replay process (``_proof.replay``) to run, typed and validated where it is read.

It carries no ``schema``/``schema_version``: it passes from one process to the child it starts,
written and read by the same reprotune, and is not a file a user keeps or another version reads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from reprotune._documents import read_json_file, validated
from reprotune._jsonio import write_json_atomic
from reprotune._run.layout import SPOT_PLAN

_FROZEN = ConfigDict(frozen=True, extra="forbid", strict=True)


class PlannedInterval(BaseModel):
    """Steps ``start + 1`` ... ``end`` of the reference, replayed into ``run_dir``."""

    model_config = _FROZEN
    start: int
    end: int
    why: str
    run_dir: str


class SeedControl(BaseModel):
    """The negative control that perturbs a seed: the first interval with the seed ``overrides``,
    stopped once it parts from the reference (at step ``bound`` at the latest)."""

    model_config = _FROZEN
    name: Literal["control-seed"] = "control-seed"
    run_dir: str
    bound: int
    overrides: dict[str, int]


class ResumeControl(BaseModel):
    """The negative control that skips the RNG restore: a resume from checkpoint ``start`` without
    its RNG states, stopped once it parts from the reference (at step ``bound`` at the latest)."""

    model_config = _FROZEN
    name: Literal["control-resume"] = "control-resume"
    run_dir: str
    bound: int
    start: int


PlannedControl = Annotated[SeedControl | ResumeControl, Field(discriminator="name")]


class SpotPlan(BaseModel):
    """The intervals and controls to replay, and how (``data``: a bundle's data or a builtin name
    in place of the recorded path; ``code_dir``: where the run's code is checked)."""

    model_config = _FROZEN
    reference: str
    total_steps: int
    intervals: list[PlannedInterval]
    controls: list[PlannedControl]
    code_dir: str
    allow_code_drift: bool
    data: str | None = None

    def write(self, spot_dir: Path) -> None:
        write_json_atomic(spot_dir / SPOT_PLAN, self.model_dump(exclude_none=True))

    @classmethod
    def read(cls, spot_dir: Path) -> SpotPlan:
        path = spot_dir / SPOT_PLAN
        fix = "run `reprotune verify RUN_DIR --spot` again into a new directory"
        data = read_json_file(path, what="spot-check plan", fix=fix)
        return validated(cls, data, what="spot-check plan", source=str(path), fix=fix)
