"""The Weights & Biases tracker: offline by default, the same params, tags, metrics and artifacts
as the MLflow tracker.

W&B is an optional extra (``pip install 'reprotune[wandb]'``). Nothing leaves the machine unless
the user chooses a mode: the run is written with ``mode="offline"`` unless ``WANDB_MODE`` says
otherwise, into ``<run dir>/wandb/`` unless ``WANDB_DIR`` says otherwise. Read an offline run back
with wandb's own reader, ``WANDB_MODE=offline python -m wandb leet inspect --summary --json DIR``
(without ``WANDB_MODE=offline`` that reader looks up W&B's servers), or upload it later with
``wandb sync``.

What it mirrors (docs/integrations.md):

- params: the run config's flattened params, as the W&B run config;
- tags: the same key/value tags as MLflow's, in the run config under ``tags.<name>`` (W&B's own
  tags are labels of at most 64 characters, too short for a sha256), and the W&B tag
  ``reprotune``;
- metrics: every step's ``train_loss``, ``lr``, ``grad_norm`` and ``val_loss`` at the optimizer
  step (W&B's summary then holds the final value of each) and ``status`` in the summary;
- artifacts: one artifact of type ``reprotune-run`` holding the record, ledger, adapter, split
  manifest and config.

The run is created with ``reinit="create_new"`` and used through its own handle only, never
through ``wandb.run``, so a W&B run the user's script opened (``report_to="wandb"``) is left alone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reprotune._errors import InputError
from reprotune._run.record import Status
from reprotune._trackers.base import RunDescription

#: The install command that provides the ``wandb`` package.
WANDB_EXTRA = "pip install 'reprotune[wandb]'"
_ARTIFACT_NAME = re.compile(r"[^A-Za-z0-9_.-]")
_PROJECT_REFUSED = re.compile(r"[/\\#?%:]+")


def import_wandb(source: str) -> Any:
    """Import ``wandb``, or raise an :class:`InputError` naming the extra that provides it.

    Args:
        source: what asked for W&B (``tracking.wandb``, ``ReprotuneCallback(wandb=True)``), named
            in the message.

    Raises:
        InputError: wandb is not installed.
    """
    try:
        import wandb
    except ImportError as exc:
        raise InputError(
            f"W&B tracking was asked for but the wandb package is not installed ({exc})",
            source=source,
            fix=f"install the extra with `{WANDB_EXTRA}`, or turn W&B tracking off",
        ) from None
    return wandb


class WandbTracker:
    """Mirrors a run to Weights & Biases, offline unless ``WANDB_MODE`` chooses otherwise.

    Args:
        project: the W&B project (the MLflow experiment name, by default ``reprotune``).
        directory: where W&B writes its run folder (``<directory>/wandb/offline-run-*``); default
            ``WANDB_DIR``, else the run directory.
        mode: ``offline``, ``online`` or ``disabled``; default ``WANDB_MODE``, else ``offline``.

    Raises:
        InputError: wandb is not installed.
    """

    name = "wandb"

    def __init__(self, project: str, *, directory: Path | None = None, mode: str | None = None) -> None:
        self._wandb = import_wandb("tracking.wandb")
        # An MLflow experiment may name a path (Databricks: /Users/me@example.com/reprotune), which
        # W&B refuses as a project (no / \\ # ? % :): those characters become dashes.
        self.project = _PROJECT_REFUSED.sub("-", project).strip("-") or "reprotune"
        self.mode = mode or os.environ.get("WANDB_MODE") or "offline"
        env_dir = os.environ.get("WANDB_DIR")
        self._directory = directory if directory is not None else (Path(env_dir) if env_dir else None)
        self._run: Any = None
        self._run_dir: str | None = None
        self._metrics_logged = 0
        self._held_through = -1  # a continued run's last step: its steps up to it are not logged again
        self._last_step = -1

    def start(self, run: RunDescription) -> None:
        directory = (self._directory if self._directory is not None else run.run_dir).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = dict(run.params)
        config.update({f"tags.{key}": value for key, value in run.tags.items()})
        before = run.continues.get("wandb") or {}
        same = (before.get("mode"), before.get("project")) == (self.mode, self.project)
        continued = (
            {"id": before["wandb_run_id"], "resume": "allow"} if same and before.get("wandb_run_id") else {}
        )
        self._run = init_run(
            self._wandb,
            mode=self.mode,
            directory=directory,
            project=self.project,
            name=run.run_id,
            config=config,
            tags=["reprotune"],
            **continued,  # a resumed run continues its W&B run
        )
        files_dir = getattr(self._run, "dir", None)
        self._run_dir = str(Path(files_dir).parent) if files_dir else None
        if continued:
            # The steps it holds: through the last step the attempt before logged (its record
            # says; offline, W&B itself cannot know, each attempt writing its own folder), and
            # online before the step W&B resumes the run at.
            starting = int(getattr(self._run, "starting_step", 0) or 0)
            held = before.get("last_step")
            self._held_through = max(int(held) if held is not None else -1, starting - 1)
        self._last_step = self._held_through

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        if self._run is None or step <= self._held_through:
            return
        self._run.log(dict(metrics), step=step)
        self._metrics_logged += len(metrics)
        self._last_step = max(self._last_step, step)

    def log_artifacts(self, paths: Mapping[str, Path]) -> None:
        """One ``reprotune-run`` artifact: each path under its key (files at the top for ``""``)."""
        if self._run is None:
            return
        name = _ARTIFACT_NAME.sub("-", f"reprotune-{self._run.name or self._run.id}")
        artifact = self._wandb.Artifact(name, type="reprotune-run")
        for key, path in paths.items():
            if path.is_dir():
                artifact.add_dir(str(path), name=key or None)
            elif path.is_file():
                artifact.add_file(str(path), name=f"{key}/{path.name}" if key else path.name)
        self._run.log_artifact(artifact)

    def finish(self, status: Status) -> dict[str, Any]:
        """Write the status into the summary and finish the run; return where it is."""
        if self._run is None:
            return {"started": False}
        run, self._run = self._run, None
        run.summary["status"] = status
        run_id = run.id
        run.finish(exit_code=0 if status == "completed" else 1)
        return {
            "mode": self.mode,
            "project": self.project,
            "wandb_run_id": run_id,
            "run_dir": self._run_dir,
            "metrics_logged": self._metrics_logged,
            "last_step": self._last_step if self._last_step >= 0 else None,
        }

    def close(self) -> None:
        """Finish a run still open (a tracker switched off, a run that failed)."""
        if self._run is not None:
            run, self._run = self._run, None
            run.finish(exit_code=1)


def init_run(wandb: Any, *, mode: str, directory: Path, **init: Any) -> Any:
    """``wandb.init`` in ``mode`` into ``directory``, quiet and without telemetry; ``init`` are its
    other arguments (project, name or id, config, resume...). The tracker and the verdict's tags
    open their runs alike."""
    if mode == "offline" and wandb.run is None:
        # wandb's process-wide telemetry follows its global settings, not a run's mode: left
        # online, it posts to W&B's servers even for an offline run (measured with strace: a
        # DNS lookup from its OpenTelemetry exporter). A W&B run the script already opened
        # keeps its own mode.
        wandb.setup(settings=wandb.Settings(mode="offline"))
    settings = wandb.Settings(
        silent=True,
        console="off",
        x_disable_stats=True,
        x_disable_meta=True,
        disable_git=True,  # the record holds the code identity, with the diff
        save_code=False,
        x_save_requirements=False,
    )
    return wandb.init(dir=str(directory), mode=mode, settings=settings, reinit="create_new", **init)
