"""``eval.generate_at_end``: after a completed ``reprotune run`` (or ``resume``), evaluate the run on
its test split, and log the metrics to the run's MLflow run as ``test/<metric>``.

The eval is an ordinary eval directory in ``RUN_DIR/evals/``; the run's record is not touched
(a completed record is final). MLflow is an observer: the run's MLflow run is finished by then,
and the metrics and the eval's two files are added to it with ``MlflowClient`` and the run id the
record names. A failure there is reported and the eval stands.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from reprotune._errors import InputError, ReprotuneError
from reprotune._eval.evaluate import EvalResult, run_eval
from reprotune._run.record import RunRecord


def evaluate_at_end(
    run_dir: Path,
    record: RunRecord,
    *,
    report: Callable[[str], None],
    progress: Callable[[str], None] | None = None,
) -> EvalResult:
    """Evaluate the completed run in ``run_dir`` on its test split and mirror the metrics to MLflow.

    Args:
        run_dir: the run directory.
        record: its final record (``trackers.mlflow`` names the MLflow run).
        report: called with warnings (an MLflow failure).
        progress: called with progress lines; None is silent.

    Raises:
        InputError: the eval's bad input (e.g. an empty test split), saying the run itself completed.
    """
    try:
        result = run_eval(run_dir, split="test", report=progress)
    except ReprotuneError as exc:
        raise InputError(
            f"the run in {run_dir} completed, but eval.generate_at_end failed: {exc.message}",
            source=exc.source,
            fix=exc.fix,
        ) from exc
    mlflow = record.tracker("mlflow")
    if mlflow is not None and mlflow.ok and mlflow.mlflow_run_id and mlflow.tracking_uri:
        try:
            log_to_mlflow(mlflow.tracking_uri, mlflow.mlflow_run_id, result, step=_steps(record))
        except Exception as exc:  # an observer must not undo the eval
            report(f"warning: could not log the eval's metrics to MLflow ({type(exc).__name__}: {exc})")
    return result


def log_to_mlflow(tracking_uri: str, run_id: str, result: EvalResult, *, step: int) -> None:
    """Add ``<split>/<metric>`` metrics and the eval's files to a (finished) MLflow run."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    split = result.record["split"]["name"]
    now = int(time.time() * 1000)
    metrics = [
        Metric(f"{split}/{name}", float(value), now, step) for name, value in sorted(result.metrics.items())
    ]
    client.log_batch(run_id, metrics=metrics, synchronous=True)
    client.log_artifacts(run_id, str(result.eval_dir), artifact_path=f"evals/{result.eval_dir.name}")


def _steps(record: RunRecord) -> int:
    """The run's last optimizer step: the metrics sit at the end of its curves."""
    total = record.total_steps
    return total if total is not None else record.timings.steps_done
