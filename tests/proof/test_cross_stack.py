"""One experiment run on two real library stacks, the lock's and the floors' (scripts/install.sh dev
and floor: transformers, PEFT and accelerate at their newest and oldest allowed versions), then
compared and traced, each side in its own environment.

The tiny model's ``config.json`` is written as transformers 5 writes it (the rotary base inside
``rope_parameters``; SmolLM2's 100000). transformers 4.x does not know that key: it reads the
same file as its default base, 10000, so the two stacks train another model from equal files.
That is what the quickstart did on the two stacks, until the builtin model's config got the keys
both read (``_model.rope_keys.portable_rope_config``; docs/microscope.md).

scripts/test.sh runs this file in the floors' part, once both environments are installed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from reprotune._model.rope_keys import portable_rope_config
from reprotune._proof.trace_compare import compare_traces
from reprotune._run.stack import pinned
from reprotune._run.tracefile import read_trace
from tinyrun import TinyProject

ROOT = Path(__file__).resolve().parents[2]
STACKS = {"lock": ROOT / ".venv" / "bin" / "python", "floor": ROOT / ".venv-floor" / "bin" / "python"}


def _reprotune(stack: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [str(STACKS[stack]), "-m", "reprotune", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _rope_as_transformers_5_writes_it(model_dir: Path) -> None:
    path = model_dir / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    for legacy in ("rope_theta", "rope_scaling"):
        config.pop(legacy, None)
    config["rope_parameters"] = {"rope_theta": 100000.0, "rope_type": "default"}
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")


def test_two_library_stacks_are_compared_and_traced_to_the_module_that_changes_the_numbers(
    tmp_path: Path,
) -> None:
    """The runs part at step 1; compare names the rotary frequencies the two transformers versions
    computed from one config.json; each stack traces its own run's step 1 and reproduces it; the
    traces part where the code paths do (the model's mask and rotary code) and name the first op
    whose numbers differ, an input made in model.rotary_emb."""
    missing = [str(python) for python in STACKS.values() if not python.exists()]
    assert not missing, (
        f"this test needs both environments ({', '.join(missing)} is missing): run "
        "scripts/install.sh dev and scripts/install.sh floor"
    )
    project = TinyProject.create(tmp_path / "p")
    _rope_as_transformers_5_writes_it(project.root / "tiny-model")
    config = project.config()
    for stack in STACKS:
        done = _reprotune(stack, project.root, "run", str(config), "--run-dir", stack, "--no-progress")
        assert done.returncode == 0, done.stderr[-3000:]
        # transformers 4 is told, at load, that it reads another rotary base than the file gives
        assert ("this transformers does not read" in done.stderr) == (stack == "floor"), done.stderr[-3000:]

    compared = _reprotune("lock", project.root, "compare", "lock", "floor", "--json")
    assert compared.returncode == 1, compared.stderr[-3000:]
    result = json.loads(compared.stdout)
    assert result["where"]["first_divergence_step"] == 1
    lock, floor = pinned("lock")["transformers"], pinned("floor")["transformers"]
    assert result["causes"][0].startswith(
        "numbers differ from step 1 with identical data order: a buffer the base model computed from "
        f"its config at load differs (with equal config files: transformers {lock} vs {floor} read "
        "them otherwise): model.rotary_emb.inv_freq "
    ), result["causes"]
    assert "the libraries that compute the step differ: transformers" in result["causes"][1]

    for stack in STACKS:
        out = str(tmp_path / f"{stack}.trace.jsonl")
        done = _reprotune(stack, project.root, "trace", stack, "--step", "1", "--out", out)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "reproduced        yes" in done.stdout, done.stdout
    found = compare_traces(
        read_trace(tmp_path / "lock.trace.jsonl"), read_trace(tmp_path / "floor.trace.jsonl")
    )
    assert found.finding == "sequence"
    text = "\n".join(found.explanation)
    assert f"recorded: the libraries that compute the step differ: transformers {lock} vs {floor}" in text
    assert "where the numbers part: step 1, forward.0, model.layers.0.self_attn: " in text, text
    assert "was made in model.rotary_emb (forward.0), where the code paths differ: A runs " in text, text
    assert any("model.rotary_emb.inv_freq" in note for note in found.notes), found.notes


def test_with_the_rotary_keys_both_versions_read_the_two_stacks_train_identically(tmp_path: Path) -> None:
    """The same config.json given ``rope_theta`` beside ``rope_parameters``, as the builtin model's
    conversion now writes it: the two stacks compute the same rotary frequencies, and the runs
    are IDENTICAL, every step's loss bits and weights hash and the adapter, across transformers,
    PEFT and accelerate versions."""
    project = TinyProject.create(tmp_path / "p")
    _rope_as_transformers_5_writes_it(project.root / "tiny-model")
    assert portable_rope_config(project.root / "tiny-model" / "config.json")
    config = project.config()
    for stack in STACKS:
        done = _reprotune(stack, project.root, "run", str(config), "--run-dir", stack, "--no-progress")
        assert done.returncode == 0, done.stderr[-3000:]
        assert "this transformers does not read" not in done.stderr
    compared = _reprotune("lock", project.root, "compare", "lock", "floor", "--json")
    result = json.loads(compared.stdout)
    assert compared.returncode == 0 and result["verdict"] == "IDENTICAL", result["causes"]
    assert not any(
        d["key"].startswith("model.buffers.model.rotary_emb.inv_freq") for d in result["differences"]
    )
