"""Shared test fixtures: every test leaves global state (env vars, torch flags) as it found it."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from precision import put_fresh_precision

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

#: reprotune's cache (the converted SmolLM2, the eval's invariance probes) belongs to the session:
#: the suite neither reads nor leaves anything in ~/.cache/reprotune, and converts SmolLM2 once, in
#: the first test that loads it (tests/model/test_loading.py checks that conversion).
CACHE = Path(tempfile.mkdtemp(prefix="reprotune-tests-cache-"))
os.environ["REPROTUNE_CACHE_DIR"] = str(CACHE)
atexit.register(shutil.rmtree, CACHE, ignore_errors=True)

#: Faults injected from outside reprotune (tests/inject/injected_faults.py): on PYTHONPATH for this
#: process and every interpreter started from it, reprotune's own (verify's legs, torchrun's ranks).
INJECT = Path(__file__).resolve().parent / "inject"
if str(INJECT) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(INJECT), os.environ.get("PYTHONPATH")) if p)
sys.path.insert(0, str(INJECT))


# Pinned: timings and some reductions vary with the thread count. Tests that check that a
# command does not import torch do so in a subprocess.
torch.set_num_threads(2)


def _torch_flags() -> dict[str, Any]:
    return {
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "threads": torch.get_num_threads(),
    }


def _restore_torch_flags(flags: dict[str, Any]) -> None:
    torch.use_deterministic_algorithms(flags["deterministic"], warn_only=flags["deterministic_warn_only"])
    torch.backends.cudnn.deterministic = flags["cudnn_deterministic"]
    torch.backends.cudnn.benchmark = flags["cudnn_benchmark"]
    torch.backends.cudnn.allow_tf32 = flags["cudnn_allow_tf32"]
    torch.backends.cuda.matmul.allow_tf32 = flags["matmul_allow_tf32"]
    torch.set_num_threads(flags["threads"])


@pytest.fixture(autouse=True)
def _restore_global_state() -> Iterator[None]:
    """Restore environment variables and torch's global flags after each test."""
    env = dict(os.environ)
    flags = _torch_flags()
    yield
    _restore_torch_flags(flags)
    os.environ.clear()
    os.environ.update(env)


@pytest.fixture
def fresh_precision() -> Iterator[None]:
    """torch's float32 precision as a fresh process has it, before the test and after (a run in an
    earlier test leaves other fp32_precision settings, from which the doctor's restore is not
    exact: docs/doctor.md)."""
    put_fresh_precision()
    yield
    put_fresh_precision()


@pytest.fixture(scope="session")
def tiny_project(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny model, dataset and config directory shared by the tests that train (read-only use)."""
    from tinyrun import TinyProject

    return TinyProject.create(tmp_path_factory.mktemp("tiny-project"))


#: The quickstart cut to three steps: the one SmolLM2 run the suite trains (tests/train and
#: tests/eval read it). One thread, as an eval of it runs with the run's thread count.
SMOLLM2_OVERRIDES = (
    "train.max_steps=3",
    "train.eval_every=3",
    "train.save_every=0",
    "eval.max_rows=8",
    "eval.max_new_tokens=8",
    "determinism.threads=1",
)


@pytest.fixture(scope="session")
def smollm2_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The quickstart on the embedded SmolLM2-135M-Instruct, three steps, run by the CLI in its own
    process (MLflow store in a tmp dir). The session's first load of SmolLM2 converts the GGUF
    model into the session's cache (:data:`CACHE`, about 10 s); later loads reuse it."""
    from mlflowstore import seed_mlflow_store
    from warm import run_reprotune

    work = tmp_path_factory.mktemp("smollm2")
    seed_mlflow_store(work / "mlflow.db")  # the quickstart's store (tests/mlflowstore.py)
    quickstart = Path(__file__).resolve().parents[1] / "examples" / "quickstart.yaml"
    args = ["run", str(quickstart), "--run-dir", str(work / "run"), "--no-progress"]
    for item in SMOLLM2_OVERRIDES:
        args += ["--set", item]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
    done = run_reprotune(args, cwd=work, env=env, timeout=900)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return work / "run"
