"""bench/gpu_determinism.py, the prepared script for a lent GPU, rehearsed on the CPU
(``--device cpu``) on the tiny model: the branches it will take on a GPU run here first (twins per
mode, the strict twins' step-1 traces, and the traces of the first step where strict and off part),
so a device's few minutes are not spent on the script's own faults (this found one: a first
divergence at step 1 asked for a trace already made). On the CPU the rehearsal runs off in the
portable CPU mode, so that strict and off part where the kernels differ. The torchrun twins
(``--no-nccl`` here; gloo standing in for NCCL) cost two launches more and were rehearsed by
hand on the quickstart (docs/microscope.md).

The script runs in this process with its launcher of ``python -m reprotune`` (``_reprotune``)
wrapped: each of its calls is still a process of its own, forked from the tests' warm zygote
(tests/warm.py) where the call allows it; the calls that need a real interpreter (the
portable-mode runs, a trace of one) go through the script's own launcher. About 30 s less than
running the script as a whole in a new interpreter (70.7 s against 40.0 s, one run each, AMD EPYC)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from benchscripts import BENCH, load_bench_script
from tinyrun import TinyProject
from warm import needs_cold_start, run_reprotune

pytestmark = pytest.mark.slow

SCRIPT = BENCH / "gpu_determinism.py"


def _script() -> ModuleType:
    return load_bench_script("gpu_determinism")


def test_the_gpu_script_rehearsed_on_the_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = TinyProject.create(tmp_path / "project")
    config = tiny.config(determinism={"mode": "strict", "threads": 1, "device": "cpu"})
    out = tmp_path / "rehearsal"
    script = _script()
    launched = script._reprotune

    cold: list[list[str]] = []

    def warm_launch(*args: str, cwd: Path) -> object:
        env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
        if needs_cold_start(list(args), env, cwd=cwd):
            cold.append(list(args))
            return launched(*args, cwd=cwd)
        return run_reprotune(list(args), cwd=cwd, env=env, timeout=600)

    monkeypatch.setattr(script, "_reprotune", warm_launch)
    argv = ["--device", "cpu", "--steps", "2", "--no-nccl", "--config", str(config), "--out", str(out)]
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *argv])
    assert script.main() == 0, sorted(p.name for p in out.iterdir())
    results = json.loads((out / "gpu_determinism.json").read_text(encoding="utf-8"))
    assert results["strict"]["verdict"] == results["off"]["verdict"] == "IDENTICAL"
    twins = results["microscope"]["strict_twins_step_1"]
    assert twins["verdict"] == "IDENTICAL" and all(t["reproduced"] for t in twins["traces"])
    assert results["off"]["cpu_isa"] == "avx2-compatible"
    # the script's own launcher ran the portable-mode runs (and a trace of one, where they part)
    portable_runs = [["run", str(config), "--run-dir", str(out / f"off-{t}")] for t in "ab"]
    assert [args[:4] for args in cold[:2]] == portable_runs
    assert all(args[0] == "trace" and args[1] == str(out / "off-a") for args in cold[2:]), cold
    parted = results["microscope"]["strict_vs_off"]
    kernels = json.loads((out / "strict-a" / "record.json").read_text())["environment"]["kernels"]
    if kernels["cpu"]["aten_capability"] == "AVX2" and kernels["blas"]["blas"] != "mkl":
        # native is the portable mode's kernels on such a CPU (tests/determinism/test_isa.py)
        assert parted == {"step": None, "note": "strict and off runs did not part"}
        return
    assert parted["verdict"] == "DIVERGED" and parted["finding"] == "kernel", parted
    assert "same inputs, different outputs" in parted["explanation"][0]
    assert "determinism.cpu_isa native vs avx2-compatible" in parted["explanation"][0]


def test_random_weights_keep_the_architecture_and_the_tokenizer(tmp_path: Path) -> None:
    """``--random-weights-from`` (a device call cannot carry the SmolLM2 GGUF): the model folder made
    has the source's config and tokenizer files, seeded weights (the same bytes when made twice)
    of the source's shapes, and reprotune trains it."""
    import hashlib

    from safetensors import safe_open

    tiny = TinyProject.create(tmp_path / "project")
    source = tiny.root / "tiny-model"
    script = _script()
    made = [script.random_weights_model(source, tmp_path / name) for name in ("a", "b")]
    weights = [next(m.glob("*.safetensors")) for m in made]
    digests = {hashlib.sha256(w.read_bytes()).hexdigest() for w in weights}
    assert len(digests) == 1
    with (
        safe_open(str(next(source.glob("*.safetensors"))), "pt") as real,
        safe_open(str(weights[0]), "pt") as new,
    ):
        names, new_names = real.keys(), new.keys()  # safetensors' handles are not iterable
        assert {k: real.get_slice(k).get_shape() for k in names} == {
            k: new.get_slice(k).get_shape() for k in new_names
        }
        assert any(not (real.get_tensor(k) == new.get_tensor(k)).all() for k in names)
    for name in script.TOKENIZER_FILES:
        assert (made[0] / name).is_file() == (source / name).is_file()
    assert (
        json.loads((made[0] / "config.json").read_text())["model_type"]
        == json.loads((source / "config.json").read_text())["model_type"]
    )
    config = tiny.config(model={"name": str(made[0]), "max_length": 64}, train={"max_steps": 2})
    tiny.run_cli("run", str(config), "--run-dir", str(tmp_path / "run"), "--no-progress", "--no-tracking")
    record = json.loads((tmp_path / "run" / "record.json").read_text(encoding="utf-8"))
    assert record["status"] == "completed"
