"""Real runs on the tiny model, for tests: a model, a dataset and a config, made in about a second.

``TinyProject`` writes a tiny Llama with a byte-level tokenizer, a small prompt/response/category
JSONL and a config into one directory; ``run_cli`` runs ``python -m reprotune`` there in a fresh
process (the claim under test is usually "in another process").
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mlflowstore import seed_mlflow_store
from reprotune.testing import build_tiny_model, write_tiny_dataset
from warm import WarmProcess, run_reprotune, start_reprotune

BASE_CONFIG: dict[str, Any] = {
    "seed": {"root": 1},
    "data": {"path": "data.jsonl"},
    "split": {"stratify_by": "category"},
    "model": {"name": "tiny-model", "max_length": 64},
    "lora": {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]},
    "train": {"batch_size": 4, "max_steps": 8, "eval_every": 4, "save_every": 4, "learning_rate": 1.0e-2},
    "eval": {"batch_size": 8},
    "determinism": {"mode": "strict", "threads": 1, "device": "cpu"},
    "tracking": {"mlflow": False, "uri": "sqlite:///mlflow.db", "artifact_location": "mlartifacts"},
}


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``extra``, section by section."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class TinyProject:
    """A directory with ``tiny-model/``, ``data.jsonl`` and configs written on request."""

    root: Path

    @classmethod
    def create(cls, root: Path, *, n_rows: int = 80) -> TinyProject:
        root.mkdir(parents=True, exist_ok=True)
        build_tiny_model(root / "tiny-model", seed=0)
        write_tiny_dataset(root / "data.jsonl", n_rows, seed=0, n_categories=3)
        return cls(root)

    def config(self, name: str = "cfg.yaml", **sections: dict[str, Any]) -> Path:
        """Write ``BASE_CONFIG`` updated by ``sections`` to ``name``; return its path. A config
        that mirrors to the project's ``mlflow.db`` finds the session's empty store there
        (tests/mlflowstore.py)."""
        path = self.root / name
        config = merge(BASE_CONFIG, sections)
        path.write_text(yaml.safe_dump(config, sort_keys=True), encoding="utf-8")
        if config["tracking"].get("mlflow") and config["tracking"].get("uri") == "sqlite:///mlflow.db":
            seed_mlflow_store(self.root / "mlflow.db")  # tests/mlflowstore.py: migrated once a session
        return path

    def run_cli(
        self, *args: str, env: dict[str, str] | None = None, check: bool = True, cold: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """``python -m reprotune ARGS`` in a fresh process, in the project directory: forked from
        the session's warm zygote (tests/warm.py), or a new interpreter where the call needs one
        (``cold``, or variables read at start)."""
        full_env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", **(env or {})}
        done = run_reprotune(list(args), cwd=self.root, env=full_env, timeout=600, cold=cold)
        if check and done.returncode != 0:
            raise AssertionError(
                f"reprotune {' '.join(args)} exited {done.returncode}\n"
                f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
            )
        return done

    def start_cli(self, *args: str, env: dict[str, str] | None = None) -> WarmProcess:
        """``python -m reprotune ARGS`` in the project directory, started as :meth:`run_cli` starts
        it and not waited for: its pid, ``poll``, ``wait``, signals, and ``result()`` once ended."""
        full_env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", **(env or {})}
        return start_reprotune(list(args), cwd=self.root, env=full_env)
