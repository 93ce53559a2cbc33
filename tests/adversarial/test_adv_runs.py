"""Issue 16, items 7 (runs), 10, 12 and 13: a run fails with a message, before its directory exists
when it can, falls back past a checkpoint that will not restore, and survives a full disk.

Runs of the tiny model in this process (a few seconds each); ``main`` is the CLI, in this process.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from adv_support import fill_leaving
from safetensors.torch import load_file, save_file

from reprotune._cli import main
from reprotune._config.loading import load_config
from reprotune._errors import InputError
from reprotune._jsonio import canonical_dumps, sha256_bytes, sha256_file
from reprotune._run.checkpoint import STATE_FILE, list_checkpoints
from reprotune._run.claim import claim_run_dir
from reprotune._run.layout import RunLayout
from reprotune._run.record import load_record, start_record, write_record
from reprotune._train.run import RunOptions, resume_run, run_experiment
from reprotune.testing import build_tiny_model
from tinyrun import TinyProject

QUIET = ("--no-progress", "--no-tracking")
ADAPTER = Path("adapter") / "adapter_model.safetensors"


def _run(project: TinyProject, run_dir: Path, *overrides: str, **options: Any) -> Any:
    cfg = load_config(project.config(), list(overrides))
    options = {"progress": False, "tracking": False, "code_dir": project.root, **options}
    with torch.random.fork_rng():
        return run_experiment(cfg, RunOptions(run_dir=run_dir, **options))


def _resume(run_dir: Path) -> Any:
    with torch.random.fork_rng():
        options = RunOptions(run_dir=run_dir, progress=False, tracking=False, code_dir=run_dir.parent)
        return resume_run(run_dir, options)


def _clean_exit_2(capsys: pytest.CaptureFixture[str], *expected: str) -> str:
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err and "internal error" not in err, err
    for text in expected:
        assert text in err, err
    return err


@pytest.fixture(scope="module")
def reference(project: TinyProject, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run of the base config with a checkpoint every 2 steps (8 steps)."""
    run_dir = tmp_path_factory.mktemp("adv-runs") / "reference"
    _run(project, run_dir, "train.save_every=2")
    return run_dir


# --- item 13: bad input found before the directory exists ----------------------------------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["lora.target_modules=[q_proj, nope_proj]"], "nope_proj"),
        (["data.prompt_field=question"], "question"),
        (["train.batch_size=100000000"], "one optimizer step takes 100000000 rows"),
        (["lora.r=1000000000000"], "lora.r 1000000000000 is larger than any layer it targets is wide"),
    ],
    ids=["unknown target module", "missing column", "batch larger than the training split", "huge rank"],
)
def test_bad_input_leaves_no_run_directory(
    project: TinyProject,
    tmp_path: Path,
    overrides: list[str],
    expected: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Exit 2 naming the problem, and the run directory never exists, so `--run-dir` stays free."""
    run_dir = tmp_path / "run"
    sets = [part for o in overrides for part in ("--set", o)]
    assert main(["run", str(project.config()), "--run-dir", str(run_dir), *sets, *QUIET]) == 2
    _clean_exit_2(capsys, expected)
    assert not run_dir.exists()


def test_a_manifest_of_other_data_leaves_no_run_directory(
    project: TinyProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.jsonl"
    other.write_text('{"prompt": "p", "response": "r", "category": "a"}\n' * 10)
    manifest = tmp_path / "other-split.json"
    assert main(["split", str(other), "--out", str(manifest)]) == 0
    run_dir = tmp_path / "run"
    args = ["run", str(project.config()), "--run-dir", str(run_dir), "--set", f"split.manifest={manifest}"]
    assert main([*args, *QUIET]) == 2
    _clean_exit_2(capsys, "the split manifest was made from other data")
    assert not run_dir.exists()


def test_a_resume_on_changed_data_names_the_run_directorys_manifest(tmp_path: Path) -> None:
    """A resume whose data file changed is refused naming the run's own split.json, and the
    check-split command with it (it said "split manifest None" and `check-split None DATA`)."""
    moved = TinyProject.create(tmp_path / "moved")
    run_dir = tmp_path / "run"
    _run(moved, run_dir, stop_after_step=2)
    data = moved.root / "data.jsonl"
    data.write_text(data.read_text().replace('"response":"', '"response":"edited ', 1))
    with pytest.raises(InputError, match="the split manifest was made from other data") as refused:
        _resume(run_dir)
    manifest = run_dir / "split.json"
    assert refused.value.source == f"split manifest {manifest}"
    assert f"reprotune check-split {manifest} " in str(refused.value.fix)


def test_a_reformatted_copy_of_the_manifests_data_is_trained_on(project: TinyProject, tmp_path: Path) -> None:
    """The manifest's rows in a reformatted file (keys in another order): the split holds (as
    check-split says), so the run takes it; it was refused as 'made from other data'."""
    manifest = tmp_path / "split.json"
    assert (
        main(["split", str(project.root / "data.jsonl"), "--out", str(manifest), "--stratify-by", "category"])
        == 0
    )
    rows = [json.loads(line) for line in (project.root / "data.jsonl").read_text().splitlines()]
    moved = tmp_path / "moved.jsonl"
    moved.write_text("".join(json.dumps(dict(reversed(list(r.items())))) + "\n" for r in rows))
    run_dir = tmp_path / "run"
    args = ["run", str(project.config()), "--run-dir", str(run_dir), "--set", f"split.manifest={manifest}"]
    assert main([*args, "--set", f"data.path={moved}", *QUIET]) == 0
    assert json.loads((run_dir / "record.json").read_text())["status"] == "completed"


def test_a_directory_whose_run_failed_before_its_first_step_is_reused(
    project: TinyProject, tmp_path: Path
) -> None:
    """What an older reprotune left (status failed, nothing trained) no longer blocks the directory."""
    run_dir = tmp_path / "run"
    cfg = load_config(project.config())
    run_dir.mkdir()
    record = start_record("old", cfg, {"root": 1})
    record.update(status="failed", error={"type": "InputError", "message": "unknown target module"})
    write_record(run_dir / "record.json", record)
    (run_dir / "config.yaml").write_text("# left behind\n")
    notes: list[str] = []
    claim_run_dir(run_dir, report=notes.append)
    assert notes == [f"note: reusing {run_dir}: its run failed before its first step (unknown target module)"]
    assert list(run_dir.iterdir()) == []
    result = _run(project, run_dir)
    assert result.status == "completed"


def test_a_failed_run_that_trained_is_not_reused(project: TinyProject, tmp_path: Path) -> None:
    """A failed run with steps in its ledger is evidence: `run --run-dir` still says resume it."""
    run_dir = tmp_path / "run"
    _run(project, run_dir, stop_after_step=2)
    record = load_record(run_dir / "record.json")
    record.update(status="failed")
    write_record(run_dir / "record.json", record)
    assert main(["run", str(project.config()), "--run-dir", str(run_dir), *QUIET]) == 2
    assert (run_dir / "ledger.jsonl").exists()


# --- item 7 (runs) -------------------------------------------------------------------------------


def test_run_dir_that_is_a_file_is_exit_2(
    project: TinyProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "afile"
    target.write_text("mine")
    assert main(["run", str(project.config()), "--run-dir", str(target), *QUIET]) == 2
    _clean_exit_2(capsys, "is a file, not a directory")
    assert target.read_text() == "mine"
    assert main(["run", str(project.config()), "--run-dir", str(target / "sub"), *QUIET]) == 2
    _clean_exit_2(capsys, f"is under {target}, which is a file")


def test_a_pickled_model_is_refused_with_how_to_convert(
    project: TinyProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model directory with only pytorch_model.bin: exit 2, safetensors only, and the conversion."""
    from transformers import AutoModelForCausalLM

    source = build_tiny_model(tmp_path / "tiny", seed=0)
    model_dir = _tiny_model_without(tmp_path / "pickled", source, (".safetensors",))
    # The weights as older tools saved them: a pickled state dict.
    torch.save(AutoModelForCausalLM.from_pretrained(source).state_dict(), model_dir / "pytorch_model.bin")
    assert (model_dir / "pytorch_model.bin").exists() and not list(model_dir.glob("*.safetensors"))
    _refused_as_model(project, tmp_path, capsys, model_dir)
    _clean_exit_2(
        capsys, "only as pickled pytorch_model*.bin", "safetensors weights only", "safe_serialization=True"
    )


def test_a_model_without_tokenizer_files_is_refused_naming_them(
    project: TinyProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model directory whose tokenizer files are missing: exit 2 naming the files (transformers
    said to install sentencepiece or tiktoken), no run directory."""
    source = build_tiny_model(tmp_path / "tiny", seed=0)
    model_dir = _tiny_model_without(
        tmp_path / "no-tokenizer", source, ("tokenizer", "special_tokens", "vocab")
    )
    _refused_as_model(project, tmp_path, capsys, model_dir)
    _clean_exit_2(capsys, "holds no tokenizer: none of tokenizer.json, tokenizer.model", "save_pretrained")


def _tiny_model_without(model_dir: Path, source: Path, parts: tuple[str, ...]) -> Path:
    """A copy of the model folder ``source`` without the files whose names start or end with one of
    ``parts``."""
    model_dir.mkdir()
    for name in os.listdir(source):
        if not (name.startswith(parts) or name.endswith(parts)):
            (model_dir / name).write_bytes((source / name).read_bytes())
    return model_dir


def _refused_as_model(
    project: TinyProject, tmp_path: Path, capsys: pytest.CaptureFixture[str], model_dir: Path
) -> None:
    """A run of ``model_dir`` exits 2 and leaves no run directory (the message is the caller's)."""
    args = [
        "run",
        str(project.config()),
        "--run-dir",
        str(tmp_path / "run"),
        "--set",
        f"model.name={model_dir}",
    ]
    assert main([*args, *QUIET]) == 2
    assert not (tmp_path / "run").exists()


def test_a_full_disk_during_a_run_is_exit_2_and_resume_finishes_it(
    project: TinyProject,
    reference: Path,
    small_disk: Callable[[int], Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ENOSPC at the first checkpoint: exit 2 naming the path and the space needed, status failed with
    the error, no temporary files; a resume with no space at all is exit 2 naming the run, its
    record untouched; with space again, `resume` finishes it IDENTICAL."""
    monkeypatch.chdir(project.root)  # not a git tree: no code.patch to write
    disk = small_disk(1 << 20)
    run_dir = disk / "run"
    args = ["run", str(project.config()), "--run-dir", str(run_dir), "--set", "train.save_every=2", *QUIET]
    # Room for what a run writes before its first checkpoint (the record twice: it is replaced
    # atomically), and half a checkpoint: sizes in pages, as tmpfs counts them.
    pages = lambda path: math.ceil(path.stat().st_size / 4096) * 4096  # noqa: E731
    files = ("record.json", "record.json", "config.yaml", "split.json", "ledger.jsonl")
    before_checkpoint = sum(pages(reference / name) for name in files)
    checkpoint = sum(pages(p) for p in list_checkpoints(reference / "checkpoints")[-1].iterdir())
    fill_leaving(disk, before_checkpoint + checkpoint // 2)
    assert main(args) == 2
    err = _clean_exit_2(
        capsys,
        "no space left on the device of",
        "free now; a checkpoint takes about",
        f"reprotune resume {run_dir}",
    )
    assert "checkpoints" in err
    record = load_record(run_dir / "record.json")
    assert record["status"] == "failed" and "no space left" in record["error"]["message"]
    leftovers = [p for p in run_dir.rglob("*") if p.name.startswith(".") and p.name != ".writer.lock"]
    assert leftovers == []
    # A resume on a disk without room for its record, or with nothing free (its lock's write
    # fails), names the run (it said "No space left on device" alone) and leaves the record be.
    before = (run_dir / "record.json").read_bytes()
    (disk / "filler").rename(disk / "filler-1")
    fill_leaving(disk, 4096)  # a page: the lock's, not the record's
    assert main(["resume", str(run_dir), *QUIET]) == 2
    _clean_exit_2(capsys, f"no space left on the device of {run_dir}", "the run's record is as it was")
    assert (run_dir / "record.json").read_bytes() == before
    (disk / "filler").rename(disk / "filler-2")
    fill_leaving(disk, 0)
    assert main(["resume", str(run_dir), *QUIET]) == 2
    _clean_exit_2(capsys, f"no space left on the device of {run_dir} (", "the run's files are as they were")
    assert (run_dir / "record.json").read_bytes() == before and not (run_dir / ".writer.lock").exists()
    fresh = disk / "fresh" / "run"  # a new run there: the directories it made are gone again
    assert main(["run", str(project.config()), "--run-dir", str(fresh), *QUIET]) == 2
    _clean_exit_2(capsys, "no space left on the device of", "the run's files are as they were")
    assert not (disk / "fresh").exists()
    for filler in ("filler", "filler-1", "filler-2"):
        (disk / filler).unlink()
    assert main(["resume", str(run_dir), *QUIET]) == 0
    assert (run_dir / "ledger.jsonl").read_bytes() == (reference / "ledger.jsonl").read_bytes()
    assert sha256_file(run_dir / ADAPTER) == sha256_file(reference / ADAPTER)


# --- item 12: a checkpoint that verifies but will not restore ------------------------------------


class _Payload:
    """Unpickling it would run ``os.mkdir(marker)``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.mkdir, (str(self.marker),)


def _resign(checkpoint: Path) -> None:
    """Make state.json's hashes match the files as they are now (what a forger does)."""
    state = json.loads((checkpoint / STATE_FILE).read_text())
    state["files"] = {name: sha256_file(checkpoint / name) for name in state["files"]}
    state.pop("state_sha256")
    state["state_sha256"] = sha256_bytes(canonical_dumps(state).encode())
    (checkpoint / STATE_FILE).write_text(canonical_dumps(state))


@pytest.mark.parametrize(
    "damage", ["forged pickle", "wrong shapes", "a row of each weight", "optimizer moment"]
)
def test_a_newest_checkpoint_that_will_not_restore_falls_back(
    project: TinyProject, reference: Path, tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The newest checkpoint passes its hash check but cannot be restored: resume warns, uses the
    previous one (as docs/checkpoints.md says), runs no code, and ends IDENTICAL to the reference."""
    run_dir = tmp_path / "run"
    _run(project, run_dir, "train.save_every=2", stop_after_step=6)
    newest = list_checkpoints(run_dir / "checkpoints")[-1]
    assert newest.name == "step-00000006"
    marker = tmp_path / "code-ran"
    if damage == "forged pickle":
        torch.save({"optimizer": _Payload(marker), "scheduler": {}, "scaler": None}, newest / "optimizer.pt")
        reason = "optimizer.pt holds objects other than tensors and plain data"
    elif damage == "optimizer moment":  # an optimizer takes moments of any shape until it steps
        states = torch.load(newest / "optimizer.pt", weights_only=True)
        states["optimizer"]["state"][0]["exp_avg"] = states["optimizer"]["state"][0]["exp_avg"][:1].clone()
        torch.save(states, newest / "optimizer.pt")
        reason = "the optimizer's exp_avg of base_model.model."
    else:  # "a row of each weight": copy_ would broadcast it into the whole weight, without a word
        weights = load_file(str(newest / "trainable.safetensors"))
        row = damage == "a row of each weight"
        save_file(
            {k: v[:1].clone() if row else torch.zeros(3, 3) for k, v in weights.items()},
            str(newest / "trainable.safetensors"),
        )
        reason = "has shape [1, " if row else "has shape [3, 3], the model's is ["
    _resign(newest)
    _resume(run_dir)
    err = capsys.readouterr().err
    assert f"warning: checkpoint {newest} is refused: it verifies but cannot be restored (" in err
    assert reason in err and "falling back to the previous one" in err
    assert "from step 4 (step-00000004)" in err
    assert not marker.exists()
    assert (run_dir / "ledger.jsonl").read_bytes() == (reference / "ledger.jsonl").read_bytes()
    assert sha256_file(run_dir / ADAPTER) == sha256_file(reference / ADAPTER)


# --- item 10: rerun checks what the comparison needs before training -----------------------------


@pytest.mark.parametrize("damage", ["missing ledger", "garbled ledger"])
def test_rerun_of_a_run_with_a_bad_ledger_trains_nothing(
    project: TinyProject,
    tmp_path: Path,
    damage: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Exit 2 before any training, naming the ledger; no rerun directory is made."""
    run_dir = tmp_path / "run"
    _run(project, run_dir)
    ledger = RunLayout(run_dir).ledger
    if damage == "missing ledger":
        ledger.unlink()
    else:
        ledger.write_bytes(ledger.read_bytes()[:-40] + b"garbage\n")
    monkeypatch.chdir(project.root)
    assert main(["rerun", str(run_dir), "--no-progress"]) == 2
    _clean_exit_2(capsys, "ledger")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_model_s_own_python_code_is_never_run(tmp_path: Path) -> None:
    """A model directory whose config.json maps to its own modeling code (auto_map) loads with the
    library's class for its model_type: the directory's Python file is never imported."""
    from reprotune._model.loading import load_base_model

    model_dir = build_tiny_model(tmp_path / "model", seed=0)
    marker = tmp_path / "code-ran"
    (model_dir / "modeling_evil.py").write_text(f"import os\nos.mkdir({str(marker)!r})\n")
    config = json.loads((model_dir / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (model_dir / "config.json").write_text(json.dumps(config))
    loaded = load_base_model(
        str(model_dir), revision=None, dtype="float32", pad_token_id=None, padding_side="right", device="cpu"
    )
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    assert not marker.exists()


def test_a_model_that_needs_its_own_code_is_refused_even_when_asked_yes(
    project: TinyProject, tmp_path: Path
) -> None:
    """A model_type transformers does not ship, with auto_map naming the directory's own code:
    transformers would ask on stdin whether to run it, and a piped "y" ran it. reprotune never lets
    it ask: exit 2 naming why, the code not run, no run directory left."""
    import shutil
    import subprocess
    import sys

    model_dir = tmp_path / "evil"
    shutil.copytree(project.root / "tiny-model", model_dir)
    marker = tmp_path / "code-ran"
    for name in ("configuration_evil", "modeling_evil", "tokenization_evil"):
        (model_dir / f"{name}.py").write_text(f"import os\nos.makedirs({str(marker)!r}, exist_ok=True)\n")
    config = json.loads((model_dir / "config.json").read_text())
    config.update(model_type="evil", architectures=["EvilForCausalLM"])
    config["auto_map"] = {
        "AutoConfig": "configuration_evil.EvilConfig",
        "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM",
    }
    (model_dir / "config.json").write_text(json.dumps(config))
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "reprotune", "run", str(project.config()), "--run-dir", str(run_dir)]
    done = subprocess.run(
        [*command, "--set", f"model.name={model_dir}", "--no-progress", "--no-tracking"],
        input="y\n" * 20,
        capture_output=True,
        text=True,
        cwd=project.root,
        timeout=300,
        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "needs its own Python code to load" in done.stderr and "never runs a model's code" in done.stderr
    assert not marker.exists() and not run_dir.exists()
