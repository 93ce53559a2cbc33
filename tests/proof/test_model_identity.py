"""Every input that changes the math is recorded, on models reprotune was not built around: a tiny
GPT-2 (fused ``c_attn``, LayerNorm, ``gelu_new``) and a tiny Qwen2, from local directories."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reprotune._proof.compare import compare_runs
from reprotune.testing import build_tiny_model, write_tiny_dataset
from tinyrun import TinyProject

SHORT = {"max_steps": 3, "eval_every": 3, "save_every": 0}


def _project(root: Path, architecture: str) -> TinyProject:
    root.mkdir(parents=True)
    build_tiny_model(root / "tiny-model", seed=0, architecture=architecture)  # type: ignore[arg-type]
    write_tiny_dataset(root / "data.jsonl", 40, seed=0, n_categories=3)
    return TinyProject(root)


def _run(project: TinyProject, run_dir: str, config: str = "cfg.yaml") -> Path:
    project.run_cli("run", config, "--run-dir", run_dir, "--no-progress")
    return project.root / run_dir


def test_gpt2_activation_change_is_named_first(tmp_path: Path) -> None:
    """config.json's activation_function gelu_new -> relu: DIVERGED, and the first cause names
    config.json (weights and tokenizer are the same, so the runs stay comparable)."""
    project = _project(tmp_path / "gpt2", "gpt2")
    relu = project.root / "tiny-model-relu"
    shutil.copytree(project.root / "tiny-model", relu)
    config = json.loads((relu / "config.json").read_text())
    assert config["activation_function"] == "gelu_new"
    config["activation_function"] = "relu"
    (relu / "config.json").write_text(json.dumps(config, indent=2))
    lora = {"target_modules": ["c_attn"]}
    project.config("cfg.yaml", train=SHORT, lora=lora)
    project.config("relu.yaml", train=SHORT, lora=lora, model={"name": "tiny-model-relu"})
    a, b = _run(project, "runs/gelu"), _run(project, "runs/relu", "relu.yaml")

    result = compare_runs(a, b)
    assert str(result.verdict) == "DIVERGED" and not result.incomparable
    where = result.where
    assert (where.first_loss_step, where.first_weights_step, where.first_batch_step) == (1, 1, None)
    assert result.causes[0].startswith(
        "numbers differ from step 1 with identical data order: a file that defines the base model's "
        "computation differs: config.json "
    )
    keys = {d.key: d for d in result.differences}
    assert not keys["model.config_files.config.json"].inert
    assert keys["config.model.name"].inert and keys["model.source"].inert  # listed, never a cause
    assert not any("tiny-model-relu" in cause for cause in result.causes)


def test_qwen2_twins_identical_in_every_file(tmp_path: Path) -> None:
    """Two processes on a tiny Qwen2: IDENTICAL, and every file of the adapter directory equal."""
    project = _project(tmp_path / "qwen2", "qwen2")
    project.config("cfg.yaml", train=SHORT)
    a, b = _run(project, "runs/a"), _run(project, "runs/b")
    assert str(compare_runs(a, b).verdict) == "IDENTICAL"
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (a / "adapter" / name).read_bytes() == (b / "adapter" / name).read_bytes()
    record = json.loads((a / "record.json").read_text())
    assert sorted(record["model"]["config_files"]) == ["config.json", "generation_config.json"]


@pytest.mark.parametrize("file", ["generation_config.json", "modeling_extra.py"], ids=["generation", "code"])
def test_other_model_files_are_part_of_the_identity(tmp_path: Path, file: str) -> None:
    """generation_config.json and custom code are recorded; a change to one is a difference."""
    project = _project(tmp_path / "p", "llama")
    project.config("cfg.yaml", train={"max_steps": 1, "eval_every": 0, "save_every": 0})
    a = _run(project, "runs/a")
    path = project.root / "tiny-model" / file
    path.write_text((path.read_text() if path.exists() else "") + "\n")
    b = _run(project, "runs/b")
    keys = [d.key for d in compare_runs(a, b).differences]
    assert f"model.config_files.{file}" in keys and "model.config_sha256" in keys
