"""An empty MLflow SQLite store, made once per test session and copied where a test's run opens one.

MLflow's first use of a new SQLite file creates its tables and runs every schema migration: about
1.6 s on 2 cores, each time, in the run's MLflow child or the test's client. What the tests check
is what reprotune writes into a store, so the tests that are not about a new store start from a
copy of one migrated once in this session, by the MLflow under test (a real store: the same file
MLflow would have made, with its ``Default`` experiment). A store MLflow makes itself is still
tested in tests/integrations/test_verify_command.py: the Trainer's own MLflow run
(``report_to="mlflow"``) and ``ReprotuneCallback(mlflow=True)`` each write to a new file.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_template: Path | None = None


def seed_mlflow_store(path: Path) -> str:
    """Copy the session's empty store to ``path`` unless a file is there already; its SQLite URI."""
    global _template
    if _template is None:
        from mlflow.tracking import MlflowClient

        folder = Path(tempfile.mkdtemp(prefix="reprotune-tests-mlflow-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}").search_experiments()
        _template = folder / "mlflow.db"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_template, path)
    return f"sqlite:///{path}"
