"""``eval.generate_at_end``: after a completed ``reprotune run`` (or ``resume``), evaluate the run on
its test split, and log the metrics to the run's MLflow run as ``test/<metric>``.

The eval is an ordinary eval directory in ``RUN_DIR/evals/``; the run's record is not touched
(a completed record is final). MLflow is an observer: the run's MLflow run is finished by then,
and the metrics and the eval's two files are added to it with ``MlflowClient`` and the run id the
record names. A failure there is reported and the eval stands.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from reprotune._errors import InputError, ReprotuneError
from reprotune._eval.evaluate import EvalResult, run_eval
from reprotune._eval.layout import EvalLayout, run_evals
from reprotune._eval.settings import wants_eval_at_end
from reprotune._run.layout import RunLayout
from reprotune._run.record import RunRecord, read_record


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
        make = f"make the eval with `reprotune resume {run_dir}`"
        raise InputError(
            f"the run in {run_dir} completed, but eval.generate_at_end failed: {exc.message}",
            source=exc.source,
            fix=f"{exc.fix}; then {make}" if exc.fix else make,
        ) from exc
    mlflow = record.tracker("mlflow")
    if mlflow is not None and mlflow.ok and mlflow.mlflow_run_id and mlflow.tracking_uri:
        try:
            log_to_mlflow(mlflow.tracking_uri, mlflow.mlflow_run_id, result, step=_steps(record))
        except Exception as exc:  # an observer must not undo the eval
            report(f"warning: could not log the eval's metrics to MLflow ({type(exc).__name__}: {exc})")
    return result


def missing_eval_at_end(run_dir: Path) -> RunRecord | None:
    """The record of a completed run that asks for ``eval.generate_at_end`` and has no eval of its
    test split (stopped or failed after the run completed): what ``reprotune resume`` finishes.
    None for any other run directory, or one whose record cannot be read (resume says why)."""
    try:
        record = read_record(RunLayout(run_dir).record)
    except ReprotuneError:
        return None
    if record.status != "completed" or not wants_eval_at_end(record):
        return None
    for eval_dir in run_evals(run_dir):
        try:
            made = json.loads(EvalLayout(eval_dir).eval_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if (
            isinstance(made, dict)
            and (made.get("split") or {}).get("name") == "test"
            and not made.get("base_only")
        ):
            return None
    return record


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
