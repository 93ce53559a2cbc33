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
    "CheckReport": "reprotune._checksplit",
    "Manifest": "reprotune._manifest",
    "RareClassWarning": "reprotune._split",
    "Table": "reprotune._data",
    "check_split": "reprotune._checksplit",
    "copy_manifest": "reprotune._manifest",
    "load_manifest": "reprotune._manifest",
    "load_table": "reprotune._data",
    "materialize": "reprotune._split",
    "split_table": "reprotune._split",
    "table_from_columns": "reprotune._data",
    "table_from_dataset": "reprotune._data",
    "write_manifest": "reprotune._manifest",
    # config, seeds, determinism, records, doctor
    "ExperimentConfig": "reprotune._config",
    "load_config": "reprotune._config",
    "config_from_dict": "reprotune._config",
    "derive_seed": "reprotune._seeding",
    "derive_seeds": "reprotune._seeding",
    "capture_rng_state": "reprotune._seeding",
    "restore_rng_state": "reprotune._seeding",
    "apply_determinism": "reprotune._determinism",
    "environment_fingerprint": "reprotune._fingerprint",
    "code_fingerprint": "reprotune._fingerprint",
    "load_record": "reprotune._record",
    "run_doctor": "reprotune._doctor",
    # training
    "RunOptions": "reprotune._train",
    "RunResult": "reprotune._train",
    "run_experiment": "reprotune._train",
    "resume_run": "reprotune._train",
    "load_base_model": "reprotune._model",
    "apply_lora": "reprotune._lora",
    # proof
    "Comparison": "reprotune._compare",
    "Verdict": "reprotune._compare",
    "compare_runs": "reprotune._compare",
    "write_report": "reprotune._report",
    "verify_config": "reprotune._verify",
    "rerun": "reprotune._rerun",
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
