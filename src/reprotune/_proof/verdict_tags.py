"""A verification's verdict where the user looks: the reference run's MLflow run.

After ``reprotune verify``, when the reference run was mirrored to MLflow (its record's
``trackers.mlflow`` names the tracking URI and the MLflow run id), that run gets tags
(``reprotune.verify.verdict``, ``.mode``, ``.steps_covered``, ``.cost``, ``.machine``, ``.sha256``
of ``verification.json``) and ``verification.json`` as an artifact under ``reprotune/``.
Trackers stay observers: a failure here is one warning line and never changes the verdict or
the exit code.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reprotune._jsonio import sha256_file
from reprotune._proof.verification import Verification
from reprotune._run.layout import RunLayout
from reprotune._run.record import load_record

PREFIX = "reprotune.verify."


def verdict_tags(result: Verification, verification: Path) -> dict[str, str]:
    """The tags a verification puts on its reference's tracker run."""
    if result.spot is not None:
        covered = f"{result.spot['steps_replayed']}/{result.spot['total_steps']}"
    else:
        steps = [leg.evidence.get("steps") for leg in result.legs if leg.expected == "IDENTICAL"]
        covered = str(max((s for s in steps if isinstance(s, int)), default=0))
    return {
        f"{PREFIX}verdict": result.verdict,
        f"{PREFIX}mode": result.mode,
        f"{PREFIX}steps_covered": covered,
        f"{PREFIX}cost": "" if result.cost is None else f"{result.cost:.3f}",
        f"{PREFIX}machine": str(result.machine.get("host") or ""),
        f"{PREFIX}sha256": sha256_file(verification),
        f"{PREFIX}directory": str(Path(result.directory).resolve()),
    }


def tag_reference(result: Verification, verification: Path, report: Callable[[str], None]) -> bool:
    """Tag the reference run's MLflow run with the verdict; True when it was done.

    Nothing to do (False, silently) when the reference was not mirrored to MLflow; a failure is
    reported as a warning (False).
    """
    if not result.reference or (result.spot or {}).get("bundle"):
        return False  # a bundle's run was mirrored on the machine that made it, not here
    try:
        record = load_record(RunLayout(Path(result.reference)).record)
    except Exception:
        return False
    mirrored: dict[str, Any] = (record.get("trackers") or {}).get("mlflow") or {}
    uri, run_id = mirrored.get("tracking_uri"), mirrored.get("mlflow_run_id")
    if not mirrored.get("ok") or not isinstance(uri, str) or not isinstance(run_id, str):
        return False
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        report(f"warning: the verdict was not put on MLflow run {run_id}: its store {uri} is not here")
        return False
    if "***" in uri:
        report(
            f"warning: the verdict was not put on MLflow run {run_id}: its tracking URI is recorded "
            "masked (it held a credential)"
        )
        return False
    try:
        _tag(uri, run_id, verdict_tags(result, verification), verification)
    except Exception as exc:  # an observer: never the verdict's business
        report(f"warning: could not put the verdict on MLflow run {run_id} ({uri}): {exc}")
        return False
    report(f"verdict tagged on MLflow run {run_id} ({uri}), verification.json attached")
    return True


def _tag(uri: str, run_id: str, tags: dict[str, str], verification: Path) -> None:
    with _quiet_logs():
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
        client.log_artifact(run_id, str(verification), artifact_path="reprotune")


@contextlib.contextmanager
def _quiet_logs() -> Any:
    """MLflow's and Alembic's INFO lines (store migrations) stay out of verify's output."""
    loggers = [logging.getLogger(name) for name in ("mlflow", "alembic")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
