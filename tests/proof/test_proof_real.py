"""compare and report on real tiny runs: the issue's scenarios, end to end through the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reprotune._cli import main
from reprotune._data.manifest import load_manifest
from reprotune._data.order import DataOrder
from tinyrun import TinyProject


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Reference, twin, other root seed, one edited data row, other thread count: each a real run."""
    project = TinyProject.create(tmp_path_factory.mktemp("proof"))
    project.config("cfg.yaml", train={"max_steps": 6, "save_every": 0, "eval_every": 3})
    out = {}
    for name, extra in {
        "reference": [],
        "twin": [],
        "seed": ["--set", "seed.root=2"],
        "threads": ["--set", "determinism.threads=2"],
    }.items():
        project.run_cli("run", "cfg.yaml", "--run-dir", f"runs/{name}", "--no-progress", *extra)
        out[name] = project.root / "runs" / name
    # Edit the first row the reference trains on (the split is by category, so it stays the same).
    record = json.loads((out["reference"] / "record.json").read_text())
    manifest = load_manifest(out["reference"] / "split.json")
    first_row = DataOrder(record["seeds"]["data_order"], manifest.indices["train"], 4).step_rows(1)[0]
    edited = project.root / "edited.jsonl"
    lines = (project.root / "data.jsonl").read_text().splitlines()
    lines[first_row] = lines[first_row].replace('"response":"', '"response":"edited ')
    edited.write_text("\n".join(lines) + "\n")
    project.run_cli(
        "run", "cfg.yaml", "--run-dir", "runs/edited", "--no-progress", "--set", f"data.path={edited}"
    )
    out["edited"] = project.root / "runs" / "edited"
    (project.root / "edited-row").write_text(str(first_row))
    return out


def _compare(a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["compare", str(a), str(b), "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_twins_identical(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Two runs of one config: IDENTICAL, exit 0."""
    code, result = _compare(runs["reference"], runs["twin"], capsys)
    assert (code, result["verdict"]) == (0, "IDENTICAL")


def test_other_root_seed(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """A different root seed: the LoRA init differs at step 0, the data order from step 1, and the
    root seed is the first cause named."""
    code, result = _compare(runs["reference"], runs["seed"], capsys)
    assert (code, result["verdict"]) == (1, "DIVERGED")
    where = result["where"]
    firsts = (where["first_divergence_step"], where["first_weights_step"], where["first_batch_step"])
    assert firsts == (0, 0, 1)
    first = result["causes"][0]
    assert first.startswith("the LoRA initial weights differ (step 0), and the data order from step 1: ")
    assert "root seed 1 vs 2; derived seed lora_init " in first


def test_edited_row(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """One data row edited (and so a new manifest): DIVERGED, the manifest difference named."""
    code, result = _compare(runs["reference"], runs["edited"], capsys)
    assert (code, result["verdict"]) == (1, "DIVERGED")
    row = int((runs["edited"].parent.parent / "edited-row").read_text())
    where, split = result["where"], result["split"]
    firsts = (where["first_divergence_step"], where["first_loss_step"], where["first_batch_step"])
    assert firsts == (1, 1, None)
    assert (split["content_changed"], split["moved"], split["rows_differing"]) == ([row], [], 1)
    assert result["causes"][0] == (
        "numbers differ from step 1 with identical data order: "
        f"the split manifests differ in 1 row (content changed: row {row})"
    )


def test_environment_difference_listed(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Runs whose thread counts differ are reported with that difference listed."""
    main(["compare", str(runs["reference"]), str(runs["threads"])])
    text = capsys.readouterr().out
    differs = text.split("what differs\n", 1)[1].splitlines()
    assert "    config.determinism.threads: 1 -> 2" in differs


def test_hand_edited_ledger(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A loss edited by hand at step 4: DIVERGED at step 4."""
    copy = tmp_path / "edited-ledger"
    shutil.copytree(runs["twin"], copy)
    ledger = copy / "ledger.jsonl"
    lines = ledger.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if json.loads(line).get("step") == 4 and '"train"' in line)
    entry = json.loads(lines[index])
    entry["loss"] = (float.fromhex(entry["loss"]) + 2.0**-20).hex()
    lines[index] = json.dumps(entry, sort_keys=True, separators=(",", ":"))
    ledger.write_text("\n".join(lines) + "\n")
    code, result = _compare(runs["reference"], copy, capsys)
    assert (code, result["verdict"]) == (1, "DIVERGED")
    assert result["where"]["first_loss_step"] == 4


def test_report_on_real_runs(runs: dict[str, Path], tmp_path: Path) -> None:
    """The HTML report draws its charts and marks the divergence of the other-seed run."""
    out = tmp_path / "report.html"
    assert main(["report", str(runs["reference"]), str(runs["twin"]), str(runs["seed"]), "-o", str(out)]) == 0
    html = out.read_text()
    assert html.count("<figure><svg ") == 2  # training and validation curves
    assert "http://" not in html and "https://" not in html
    assert "DIVERGED" in html and "IDENTICAL" in html
