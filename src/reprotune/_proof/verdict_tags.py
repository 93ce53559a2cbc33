"""A verification's verdict where the user looks: the reference run's MLflow and W&B runs.

After ``reprotune verify``, when the reference run was mirrored to MLflow (its record's
``trackers.mlflow`` names the tracking URI and the MLflow run id), that run gets tags
(``reprotune.verify.verdict``, ``.mode``, ``.steps_covered``, ``.cost``, ``.machine``, ``.sha256``
of ``verification.json``, ``.directory``) and ``verification.json`` as an artifact under
``reprotune/``. When it was mirrored to W&B (``trackers.wandb``), that W&B run is resumed by its
id (offline: a new offline run directory beside the first, merged by ``wandb sync``) and gets the
same keys in its summary, a ``reprotune-verify-<VERDICT>`` tag and a ``reprotune-verification``
artifact. Trackers stay observers: a failure here is one warning line and never changes the
verdict or the exit code.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reprotune._jsonio import sha256_file
from reprotune._proof.verification import Verification
from reprotune._run.layout import VERIFICATION, RunLayout
from reprotune._run.record import read_record
from reprotune._run.record_sections import TrackerSummary
from reprotune._trackers.mlflow_worker import sqlite_file
from reprotune._trackers.wandb import import_wandb, init_run

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
    """Put the verdict on the reference run's MLflow and W&B runs; True when one was tagged.

    Nothing to do (False, silently) when the reference was mirrored to neither; a failure is
    reported as a warning.
    """
    if not result.reference or (result.spot or {}).get("bundle"):
        return False  # a bundle's run was mirrored on the machine that made it, not here
    try:
        record = read_record(RunLayout(Path(result.reference)).record)
    except Exception:
        return False
    mlflow, wandb = record.tracker("mlflow"), record.tracker("wandb")
    tagged = mlflow is not None and _tag_mlflow(mlflow, result, verification, report)
    return (wandb is not None and _tag_wandb(wandb, result, verification, report)) or tagged


def _tag_wandb(
    mirrored: TrackerSummary, result: Verification, verification: Path, report: Callable[[str], None]
) -> bool:
    run_id, run_dir = mirrored.wandb_run_id, mirrored.run_dir
    if not mirrored.ok or run_id is None or run_dir is None:
        return False
    directory = Path(run_dir).parent.parent  # <dir>/wandb/<offline-run-...>: wandb.init's dir
    if not directory.is_dir():
        report(f"warning: the verdict was not put on W&B run {run_id}: its directory {directory} is not here")
        return False
    try:
        _resume_wandb(mirrored, run_id, directory, verdict_tags(result, verification), verification)
    except Exception as exc:  # an observer: never the verdict's business
        report(f"warning: could not put the verdict on W&B run {run_id}: {exc}")
        return False
    report(f"verdict put on W&B run {run_id} ({mirrored.mode}), verification.json attached")
    return True


def _resume_wandb(
    mirrored: TrackerSummary, run_id: str, directory: Path, tags: dict[str, str], verification: Path
) -> None:
    wandb = import_wandb("the verdict's W&B tags")
    mode = mirrored.mode or "offline"
    run = init_run(wandb, mode=mode, directory=directory, project=mirrored.project, id=run_id, resume="allow")
    try:
        run.tags = (*(run.tags or ()), f"reprotune-verify-{tags[PREFIX + 'verdict']}")
        run.summary.update(tags)
        artifact = wandb.Artifact(f"reprotune-verification-{run_id}", type="reprotune-verification")
        artifact.add_file(str(verification), name=VERIFICATION)
        run.log_artifact(artifact)
    finally:
        run.finish()


def _tag_mlflow(
    mirrored: TrackerSummary, result: Verification, verification: Path, report: Callable[[str], None]
) -> bool:
    uri, run_id = mirrored.tracking_uri, mirrored.mlflow_run_id
    if not mirrored.ok or uri is None or run_id is None:
        return False
    store = sqlite_file(uri)
    if store is not None and not store.is_file():
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
