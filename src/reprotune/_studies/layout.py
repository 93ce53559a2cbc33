"""The study directory's layout: every file name a study directory holds, spelled once.

``studies/<study-id>/`` (docs/seed-studies.md)::

    study.json      the study: plan, seeds, each run's metrics, summaries, variance shares
    config.yaml     the config every run starts from (before its seeds are varied)
    report.html     the study's HTML report
    mlflow.json     the MLflow parent run's id, when the study is tracked
    runs/<name>/    one ordinary run directory per run (``data_order-000``, ``all-003``, ...)
    logs/<name>.log each run's output, when runs go in separate processes (``--jobs``)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from reprotune._run.layout import STUDY
from reprotune._run.layout import STUDY_RUNS as RUNS

__all__ = ["CONFIG", "LOGS", "MLFLOW", "REPORT", "RUNS", "STUDY", "StudyLayout"]
CONFIG: Final = "config.yaml"
REPORT: Final = "report.html"
MLFLOW: Final = "mlflow.json"
LOGS: Final = "logs"


@dataclass(frozen=True)
class StudyLayout:
    """The paths of one study directory."""

    root: Path

    @property
    def study(self) -> Path:
        return self.root / STUDY

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def report(self) -> Path:
        return self.root / REPORT

    @property
    def mlflow(self) -> Path:
        return self.root / MLFLOW

    def run_dir(self, name: str) -> Path:
        """The run directory of run ``name``."""
        return self.root / RUNS / name

    def log(self, name: str) -> Path:
        """The output of run ``name`` when it ran in its own process."""
        return self.root / LOGS / f"{name}.log"
