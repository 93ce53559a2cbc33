"""Which recorded values cannot change a run's numbers: where an input came from and how it was
described, tracker and logging variables, untracked logs. ``compare`` lists a difference in them
and never gives it as a cause (docs/compare.md lists them). No torch."""

from __future__ import annotations

from typing import Any

from reprotune._proof.rank_diff import RANKS, rank_environment_key
from reprotune._run.drift import MODEL_PLACE_KEYS, TRAINER_ARGS, inert_trainer_arg

#: Recorded values that cannot change the numbers: where an input came from and how it was
#: described, never what it is (its content is covered by a hash that is compared in its own key).
#: A key is inert when it equals one of these or lies under one of them. docs/compare.md lists them.
INERT_KEYS: tuple[str, ...] = (
    "code.branch",
    "code.patch_file",
    "config.config_dir",
    "config.data.path",
    *MODEL_PLACE_KEYS,
    "config.split.manifest",
    "config.tracking",
    "data.manifest_file",
    "data.manifest_source",
    "data.source",
    "data.split_warnings",
    "distributed.timeout_s",
    "environment.cpu.logical_cores",
    "environment.kernels.version",
    "environment.python.executable",
    "environment.stack",
    "lora.base_model_name_or_path",
    "lora.peft_version",
    "model.kind",
    "model.requested_revision",
    "model.resolved_path",
    "model.revision",
    "model.source",
)


#: Environment variables of trackers and loggers (a Trainer's MLflow reporting sets
#: ``MLFLOW_EXPERIMENT_ID`` and ``MLFLOW_TRACKING_URI`` itself): where a run is mirrored, never
#: what it computes; and torchrun's own ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` (what a failed
#: collective does). ``environment.env.<NAME>`` is inert when NAME starts with one of these.
INERT_VARIABLE_PREFIXES: tuple[str, ...] = (
    "MLFLOW_", "WANDB_", "TENSORBOARD_", "COMET_", "NEPTUNE_", "CLEARML_", "AIM_", "DVCLIVE_",
    "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY",
    "DISABLE_MLFLOW_INTEGRATION", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)  # fmt: skip

#: Config keys a ``--tolerance`` forgives, where any other config, seed or data difference makes
#: the runs another experiment: how a run computes on its machine rather than what, and its books
#: (its checkpoints, what it generates once trained, a Trainer's loader workers and launch rank).
TOLERATED_CONFIG: tuple[str, ...] = (
    "config.determinism.", "config.distributed.", "config.train.save_every",
    "config.train.keep_checkpoints", "config.eval.", "config.trainer.args.dataloader_",
    "config.trainer.args.local_rank", "config.trainer.args.ddp_",
)  # fmt: skip

#: Untracked files that are neither code that runs nor an input: logs and tracker output. A
#: difference in ``code.untracked`` is inert when every file it adds or removes is one of these.
INERT_UNTRACKED_SUFFIXES: tuple[str, ...] = (".log", ".out", ".err", ".wandb", ".lock", ".pyc")
INERT_UNTRACKED_DIRS: tuple[str, ...] = (
    "runs/", "wandb/", "mlruns/", "mlartifacts/", "lightning_logs/", "logs/", "__pycache__/",
    ".ipynb_checkpoints/",
)  # fmt: skip


def is_inert(key: str, a: Any = None, b: Any = None) -> bool:
    """Whether the recorded value at ``key`` cannot change the numbers: one of
    :data:`INERT_KEYS`, a tracker or logging variable (:data:`INERT_VARIABLE_PREFIXES`), a Trainer's
    logging, saving or hub argument (``_run.drift.INERT_TRAINER_ARG_PREFIXES``),
    untracked files of runs ``a`` and ``b`` that differ only in logs and tracker output, or a torchrun
    rank's fact other than the environment it ran with (its host, device, the environment's
    sha256: ``_proof.rank_diff``), or an environment value of a rank that is inert as such."""
    if any(key == inert or key.startswith(inert + ".") for inert in INERT_KEYS):
        return True
    if key.startswith(RANKS):
        environment = rank_environment_key(key)
        return environment is None or is_inert(environment, a, b)
    if key.startswith("environment.env."):
        return key[len("environment.env.") :].startswith(INERT_VARIABLE_PREFIXES)
    if key.startswith(TRAINER_ARGS):
        return inert_trainer_arg(key, load_best=False)
    if key == "code.untracked" and isinstance(a, list) and isinstance(b, list):
        changed = set(map(str, a)) ^ set(map(str, b))
        return all(_log_file(name) for name in changed)
    return False


def _log_file(name: str) -> bool:
    path = name.replace("\\", "/")
    tensorboard = ".tfevents." in path.rsplit("/", 1)[-1]  # events.out.tfevents.<time>.<host>
    return (
        tensorboard
        or path.endswith(INERT_UNTRACKED_SUFFIXES)
        or any(path.startswith(d) or f"/{d}" in path for d in INERT_UNTRACKED_DIRS)
    )
