"""``reprotune run`` through the command line: twin runs in separate processes, the record, bad input.

Runs that must happen in a fresh process go through ``TinyProject.run_cli``; bad-input cases call
``main(argv)`` in this process (they fail before training, and the claim is the exit code, the
message and the record the CLI leaves behind).
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

import peft
import pytest
import torch
import yaml

from reprotune._cli import main
from reprotune._data.manifest import load_manifest
from reprotune._jsonio import sha256_file
from reprotune._model.lora import lora_defaults

SEED_CONSUMERS = ("split", "data_order", "lora_init", "dropout", "eval")


def _ledger(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text(encoding="utf-8").splitlines()]


def _record(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "record.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def twin_runs(tiny_project: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two runs of one config, each in its own fresh process."""
    config = tiny_project.config("cli-twin.yaml")
    out = tmp_path_factory.mktemp("cli-twins")
    dirs = (out / "a", out / "b")
    # Hash seeds under which a set of {"q_proj", "v_proj"} iterates in opposite orders.
    for run_dir, hash_seed in zip(dirs, ("1", "3"), strict=True):
        done = tiny_project.run_cli(
            "run", str(config), "--run-dir", str(run_dir), "--no-progress", env={"PYTHONHASHSEED": hash_seed}
        )
        (run_dir.parent / f"{run_dir.name}.stdout").write_text(done.stdout, encoding="utf-8")
    return dirs


def test_summary_names_run_dir_adapter_and_recording_cost(twin_runs: tuple[Path, Path]) -> None:
    """The closing summary: run directory, adapter hash, step time and what recording cost."""
    run_dir = twin_runs[0]
    summary = (run_dir.parent / f"{run_dir.name}.stdout").read_text(encoding="utf-8")
    timings = _record(run_dir)["timings"]
    assert f"run directory   {run_dir}" in summary
    assert f"adapter sha256  {_record(run_dir)['outputs']['adapter_sha256']}" in summary
    assert f"{timings['step_time_s_median'] * 1e3:.1f} ms median" in summary
    assert f"recording (ledger, weights hash, trackers) {timings['recording_share']:.2%}" in summary


def test_twin_runs_write_identical_ledgers(twin_runs: tuple[Path, Path]) -> None:
    """Two processes running one config write byte-identical ledgers, line by line."""
    a, b = twin_runs
    assert (a / "ledger.jsonl").read_bytes() == (b / "ledger.jsonl").read_bytes()
    lines_a, lines_b = _ledger(a), _ledger(b)
    assert [e["kind"] for e in lines_a].count("train") == 8
    for line_a, line_b in zip(lines_a, lines_b, strict=True):
        assert line_a.get("loss") == line_b.get("loss")
        assert line_a.get("weights_sha256") == line_b.get("weights_sha256")
        assert line_a.get("batch_sha256") == line_b.get("batch_sha256")
    # The weights really move: every train step has a new weights hash.
    hashes = [e["weights_sha256"] for e in lines_a if "weights_sha256" in e]
    assert len(set(hashes)) == len(hashes) == 9


def test_twin_runs_write_identical_adapters(twin_runs: tuple[Path, Path]) -> None:
    """Every file of both adapter directories is byte-identical (weights and adapter_config.json,
    whose unordered lists PEFT writes in hash order), and the records hash them alike."""
    a, b = twin_runs
    files_a = sorted(p.name for p in (a / "adapter").iterdir())
    assert (
        files_a
        == sorted(p.name for p in (b / "adapter").iterdir())
        == [
            "adapter_config.json",
            "adapter_model.safetensors",
        ]
    )
    for name in files_a:
        assert (a / "adapter" / name).read_bytes() == (b / "adapter" / name).read_bytes(), name
    outputs_a, outputs_b = _record(a)["outputs"], _record(b)["outputs"]
    assert outputs_a["adapter_files"] == outputs_b["adapter_files"]
    assert outputs_a["adapter_files"] == {name: sha256_file(a / "adapter" / name) for name in files_a}
    config = json.loads((a / "adapter" / "adapter_config.json").read_text(encoding="utf-8"))
    assert config["target_modules"] == ["q_proj", "v_proj"]


def test_record_is_complete(twin_runs: tuple[Path, Path]) -> None:
    """The record of a finished run holds every section the run-directory contract lists."""
    run_dir = twin_runs[0]
    record = _record(run_dir)
    assert record["status"] == "completed"
    assert record["error"] is None
    assert record["schema"] == "reprotune/record"
    assert set(SEED_CONSUMERS) <= set(record["seeds"])
    assert record["seeds"]["root"] == 1
    assert {"in_git", "commit", "dirty", "diff_sha256"} <= set(record["code"])

    data = record["data"]
    # data.path as the config writes it, relative to the config's directory (recorded beside it)
    assert record["config"]["data"]["path"] == "data.jsonl"
    assert data["file_sha256"] == sha256_file(Path(record["config"]["config_dir"]) / "data.jsonl")
    assert data["manifest_sha256"] == sha256_file(run_dir / "split.json")
    assert data["split_sizes"] == {"train": 64, "validation": 9, "test": 7}

    model = record["model"]
    assert len(model["weights_sha256"]) == 64
    assert len(model["tokenizer_sha256"]) == 64
    assert model["max_length"] == 64
    assert model["pad_token_id"] == 258  # the tiny tokenizer's <pad>

    assert record["lora"]["r"] == 4
    assert sorted(record["lora"]["target_modules"]) == ["q_proj", "v_proj"]
    # PEFT's default of every LoRA field it wrote, from its own class (for compare across PEFTs)
    assert set(record["lora"]) <= set(record["lora_defaults"])
    assert record["lora_defaults"] == lora_defaults(peft.LoraConfig())

    env = record["environment"]
    assert env["determinism"]["deterministic_algorithms"] is True
    assert env["determinism"]["torch_num_threads"] == 1
    for package in ("torch", "transformers", "peft", "mlflow-skinny"):
        assert env["distributions"][package] == importlib.metadata.version(package)

    timings = record["timings"]
    assert timings["steps_done"] == 8
    assert timings["step_time_s_mean"] > 0
    assert {"started_at", "ended_at", "duration_s"} <= set(timings)

    outputs = record["outputs"]
    assert outputs["adapter_sha256"] == sha256_file(run_dir / "adapter" / "adapter_model.safetensors")
    assert outputs["adapter_files"]["adapter_model.safetensors"] == outputs["adapter_sha256"]
    assert outputs["ledger_sha256"] == sha256_file(run_dir / "ledger.jsonl")


def test_record_config_equals_config_yaml(twin_runs: tuple[Path, Path]) -> None:
    """The resolved config in the record is the config.yaml beside it, and split.json is there."""
    run_dir = twin_runs[0]
    on_disk = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    assert on_disk == _record(run_dir)["config"]
    record = _record(run_dir)
    manifest = load_manifest(run_dir / "split.json")
    assert manifest.dataset_sha256 == record["data"]["file_sha256"]
    sizes = {name: len(manifest.indices[name]) for name in ("train", "validation", "test")}
    assert sizes == record["data"]["split_sizes"]


def test_failing_tracker_is_reported_once_and_run_completes(tiny_project: Any, tmp_path: Path) -> None:
    """An MLflow store under a path that is a file: one warning on stderr, the run completes."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file, so nothing can be created under it\n", encoding="utf-8")
    config = tiny_project.config(
        "cli-badtracker.yaml",
        train={"max_steps": 3, "eval_every": 0, "save_every": 0},
        tracking={
            "mlflow": True,
            "uri": f"sqlite:///{blocker}/mlflow.db",
            "artifact_location": str(tmp_path / "artifacts"),
        },
    )
    run_dir = tmp_path / "run"
    done = tiny_project.run_cli("run", str(config), "--run-dir", str(run_dir), "--no-progress")
    warnings = [line for line in done.stderr.splitlines() if "tracker 'mlflow' failed" in line]
    assert len(warnings) == 1, done.stderr
    record = _record(run_dir)
    assert record["status"] == "completed"
    assert record["trackers"]["mlflow"]["ok"] is False
    assert record["trackers"]["mlflow"]["error"]
    assert "failed and was switched off" in done.stdout


def _run_main(config: Path, run_dir: Path, *overrides: str) -> int:
    args = ["run", str(config), "--run-dir", str(run_dir), "--no-progress"]
    for item in overrides:
        args += ["--set", item]
    with torch.random.fork_rng():  # the run seeds torch's global generator for dropout
        return main(args)


BAD_INPUT = [
    pytest.param(
        "model.name=no/such/dir/model", ["model path", "does not exist", "model.name"], id="missing-path"
    ),
    pytest.param(
        "model.name=nonexistent-org/no-such-model",
        ["cannot be reached offline", "local Hugging Face cache", "set model.name to DIR"],
        id="hub-id-offline",
    ),
    pytest.param(
        "lora.target_modules=[nope_proj]",
        ["nope_proj", "match no module", "q_proj", "v_proj", "o_proj"],
        id="target-modules",
    ),
    pytest.param(
        "model.pad_token_id=99999", ["pad token id 99999", "out of range", "model.pad_token_id"], id="pad"
    ),
    pytest.param(
        "data.prompt_field=nope",
        ["data.prompt_field names column 'nope'", "no such column", "--set data.prompt_field=nope"],
        id="data-field",
    ),
    pytest.param(
        "split.stratify_by=categroy",
        ["split.stratify_by names column 'categroy' (did you mean 'category'?)", "--set split.stratify_by"],
        id="stratify-column",
    ),
]


@pytest.mark.parametrize(("override", "expected"), BAD_INPUT)
def test_bad_input_exits_2_and_records_failure(
    tiny_project: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, expected: list[str]
) -> None:
    """Bad input exits 2 naming the problem and the fix, found before the run directory is made
    (issue 16), so nothing is left behind and the same --run-dir can be used again."""
    config = tiny_project.config("cli-bad.yaml")
    run_dir = tmp_path / "run"
    assert _run_main(config, run_dir, override) == 2
    err = capsys.readouterr().err
    assert err.count("reprotune run: error: ") == 1
    assert "fix: " in err
    for fragment in expected:
        assert fragment in err
    assert not run_dir.exists()


def test_run_on_unfinished_run_says_resume(
    tiny_project: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run`` into a directory holding a stopped run exits 2 and points at ``reprotune resume``."""
    config = tiny_project.config("cli-unfinished.yaml")
    run_dir = tmp_path / "run"
    args = ["run", str(config), "--run-dir", str(run_dir), "--no-progress", "--stop-after-step", "4"]
    with torch.random.fork_rng():
        assert main(args) == 0
    assert _record(run_dir)["status"] == "stopped"
    capsys.readouterr()
    assert _run_main(config, run_dir) == 2
    err = capsys.readouterr().err
    assert "holds an unfinished run (status 'stopped')" in err
    assert f"reprotune resume {run_dir}" in err
    assert _record(run_dir)["status"] == "stopped"  # the refused run left it as it was


def test_rare_class_warning_is_reported_and_recorded(tiny_project: Any, tmp_path: Path) -> None:
    """A one-row class in a stratified split: one plain warning line, and the decision in the record."""
    rows = (tiny_project.root / "data.jsonl").read_text(encoding="utf-8").splitlines()
    rows.append(json.dumps({"category": "lonely", "prompt": "alone: one", "response": "one"}))
    data = tmp_path / "rare.jsonl"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    config = tiny_project.config(
        "cli-rare.yaml", data={"path": str(data)}, train={"max_steps": 2, "eval_every": 0, "save_every": 0}
    )
    done = tiny_project.run_cli("run", str(config), "--run-dir", str(tmp_path / "run"), "--no-progress")
    lines = [line for line in done.stderr.splitlines() if "lonely" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: "), done.stderr
    assert "RareClassWarning" not in done.stderr
    recorded = _record(tmp_path / "run")["data"]["split_warnings"]
    assert len(recorded) == 1 and "'lonely' (1 row)" in recorded[0]


def test_an_interrupted_run_says_how_to_resume_it_as_it_was_launched(monkeypatch: pytest.MonkeyPatch) -> None:
    """The line printed on Ctrl-C names the run directory, and torchrun when the run ran under it."""
    import argparse

    from reprotune._cli import _resume_hint

    args = argparse.Namespace(run_dir=Path("runs/k2"))
    for name in ("TORCHELASTIC_RUN_ID", "WORLD_SIZE", "GROUP_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert _resume_hint(args) == "`reprotune resume runs/k2`"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")
    assert _resume_hint(args) == "`torchrun --nproc_per_node 2 -m reprotune resume runs/k2`"
    unnamed = _resume_hint(argparse.Namespace(run_dir=None))  # runs/<id>, said when the run began
    assert unnamed == "`torchrun --nproc_per_node 2 -m reprotune resume RUN_DIR`"
    # on 2 nodes of 4 processes each (before: --nproc_per_node 4, the node's count, with no --nnodes)
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    assert _resume_hint(args) == (
        "`torchrun --nnodes 2 --nproc_per_node 4 -m reprotune resume runs/k2` on every node, "
        "with the run's rendezvous"
    )


@pytest.mark.parametrize(
    ("argv", "argument"),
    [
        (["run", ""], "config"),
        (["run", "c.yaml", "--run-dir", ""], "--run-dir"),
        (["trace", "r", "--step", "1", "--out", ""], "--out"),
        (["compare", "", "b"], "RUN_A"),
        (["pack", "r", "-o", ""], "-o/--out"),
        (["split", "", "--out", "m.json"], "DATA"),
        (["split", "d.jsonl", "--out", ""], "--out"),
        (["check-split", "", "d.jsonl"], "MANIFEST"),
        (["doctor", ""], "config"),
        (["eval", "r", "--out", ""], "--out"),
    ],
)
def test_an_empty_path_is_a_usage_error_naming_its_argument(
    argv: list[str],
    argument: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An empty path (``--out ""``, a variable that expanded to nothing) is refused by name, exit
    2, before anything runs: ``Path("")`` would otherwise be the current directory, which a
    command then reads or writes into ("--out 'm.json' is inside ., which this command reads")."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert f"argument {argument}: an empty path: give a file or directory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["run", "resume"])
def test_a_stale_torchelastic_run_id_is_bad_input(
    tiny_project: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    """TORCHELASTIC_RUN_ID left in a shell outside torchrun: run and resume exit 2 naming the
    variables the launch lacks (before: KeyError 'RANK', an internal error), nothing made."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "leftover")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    run_dir = tmp_path / "run"
    if command == "run":
        config = str(tiny_project.config("stale-id.yaml"))
        code = main(["run", config, "--run-dir", str(run_dir), "--no-progress"])
        assert not run_dir.exists()
    else:
        monkeypatch.delenv("TORCHELASTIC_RUN_ID")
        tiny_project.run_cli("run", "stale-id.yaml", "--run-dir", str(run_dir), "--stop-after-step", "2")
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "leftover")
        code = main(["resume", str(run_dir), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "TORCHELASTIC_RUN_ID is set, as under torchrun, but the launch's variables are not" in err
    assert "unset TORCHELASTIC_RUN_ID outside torchrun" in err
