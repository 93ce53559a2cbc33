"""reprotune: reproducible LLM fine-tuning, proven.

Public names are listed once in ``__all__`` and imported lazily, so that ``import reprotune``
and the commands that need no model never import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from reprotune._errors import (
    ConfigError,
    InputError,
    ReprotuneError,
    RunFailedError,
    SchemaVersionError,
)
from reprotune._version import __version__

# public name -> module that defines it
_LAZY: dict[str, str] = {
    # splits
    "CheckReport": "reprotune._data.checksplit",
    "Manifest": "reprotune._data.manifest",
    "RareClassWarning": "reprotune._data.split",
    "Table": "reprotune._data.table",
    "check_split": "reprotune._data.checksplit",
    "copy_manifest": "reprotune._data.manifest",
    "load_manifest": "reprotune._data.manifest",
    "load_table": "reprotune._data.loaders",
    "materialize": "reprotune._data.split",
    "split_table": "reprotune._data.split",
    "table_from_columns": "reprotune._data.loaders",
    "table_from_dataset": "reprotune._data.loaders",
    "write_manifest": "reprotune._data.manifest",
    # config, seeds, determinism, records, doctor
    "ExperimentConfig": "reprotune._config.schema",
    "load_config": "reprotune._config.loading",
    "config_from_dict": "reprotune._config.loading",
    "derive_seed": "reprotune._determinism.seeds",
    "derive_seeds": "reprotune._determinism.seeds",
    "seed_everything": "reprotune._determinism.seeds",
    "seed_worker": "reprotune._determinism.seeds",
    "torch_generator": "reprotune._determinism.seeds",
    "capture_rng_state": "reprotune._determinism.rng",
    "restore_rng_state": "reprotune._determinism.rng",
    "apply_determinism": "reprotune._determinism.flags",
    "environment_fingerprint": "reprotune._run.fingerprint",
    "code_fingerprint": "reprotune._run.fingerprint",
    "load_record": "reprotune._run.record",
    "run_doctor": "reprotune._doctor.doctor",
    # training
    "RunOptions": "reprotune._train.run",
    "RunResult": "reprotune._train.run",
    "run_experiment": "reprotune._train.run",
    "resume_run": "reprotune._train.run",
    "load_base_model": "reprotune._model.loading",
    "apply_lora": "reprotune._model.lora",
    # proof
    "Comparison": "reprotune._proof.differences",
    "Verdict": "reprotune._proof.differences",
    "compare_runs": "reprotune._proof.compare",
    "write_report": "reprotune._proof.report",
    "verify_config": "reprotune._proof.verify",
    "rerun": "reprotune._proof.rerun",
    # seed studies
    "StudyOptions": "reprotune._studies.study",
    "StudyResult": "reprotune._studies.study",
    "run_study": "reprotune._studies.study",
    "load_study": "reprotune._studies.studyfile",
    "significance": "reprotune._studies.significance",
}

__all__ = [
    "ConfigError",
    "InputError",
    "ReprotuneError",
    "RunFailedError",
    "SchemaVersionError",
    "__version__",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'reprotune' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
