"""ReprotuneCallback in TRL's SFTTrainer (examples/trl_sft.py on the tiny model), in fresh
processes: the same script twice is IDENTICAL, another seed DIVERGED and the cause names it."""

from __future__ import annotations

import peft
import pytest
from trainer_scripts import ScriptProject

from reprotune._cli import main
from reprotune._model.lora import lora_defaults
from reprotune._proof.compare import compare_runs
from reprotune._run.ledger import read_ledger
from reprotune._run.record import load_record

pytestmark = pytest.mark.slow  # three trainings in fresh processes


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> ScriptProject:
    project = ScriptProject.create(tmp_path_factory.mktemp("sft"))
    project.run("trl_sft.py", "a")
    project.run("trl_sft.py", "b")
    project.run("trl_sft.py", "c", "--seed", "43")
    return project


def test_sft_twice_is_identical(project: ScriptProject) -> None:
    """Byte-identical ledgers (every step's loss, grad norm, lr, rows, weights) and adapters."""
    a, b = project.root / "a", project.root / "b"
    assert compare_runs(a, b).verdict.value == "IDENTICAL"
    assert (a / "ledger.jsonl").read_bytes() == (b / "ledger.jsonl").read_bytes()
    assert len(read_ledger(a / "ledger.jsonl").train) == 6


def test_sft_other_seed_diverges_and_the_cause_names_it(project: ScriptProject) -> None:
    """--seed 43: DIVERGED, first cause the root seed (TRL seeds before it builds the adapter)."""
    comparison = compare_runs(project.root / "a", project.root / "c")
    assert comparison.verdict.value == "DIVERGED"
    assert comparison.where.first_divergence_step == 0
    assert "root seed 42 vs 43" in comparison.causes[0]


def test_sft_record(project: ScriptProject) -> None:
    """The record names TRL's trainer and its full SFTConfig, the adapter TRL built from
    peft_config (no seed finding: TRL seeds first), the split manifest and the model's hashes."""
    record = load_record(project.root / "a")
    assert record["trainer"]["class"] == "trl.trainer.sft_trainer.SFTTrainer"
    assert record["trainer"]["args"]["max_length"] == 128
    assert "output_dir" in record["trainer"]["args"]  # every field in the record ...
    assert "output_dir" not in record["config"]["trainer"]["args"]  # ... places not in the config
    assert record["lora"]["r"] == 8 == record["config"]["lora"]["r"]
    assert record["lora_defaults"] == lora_defaults(peft.LoraConfig())  # PEFT's own, not the config's
    assert "peft-before-seed" not in [f["code"] for f in record["findings"]]
    assert record["data"]["manifest_sha256"] is not None
    assert (project.root / "a" / "split.json").is_file()
    assert record["model"]["weights_sha256"] and record["model"]["tokenizer_sha256"]
    assert record["seeds"] == {"root": 42, "data_order": 42}
    # What the script's reprotune.seed_everything(args.seed) seeded (TensorFlow too where installed).
    assert record["trainer"]["seed_everything"]["seed"] == 42
    assert record["trainer"]["seed_everything"]["seeded"][:3] == ["python", "numpy", "torch"]


def test_report_reads_trainer_made_runs(project: ScriptProject) -> None:
    """`reprotune report` reads Trainer-made runs unchanged: one HTML file with both runs."""
    out = project.root / "report.html"
    assert main(["report", str(project.root / "a"), str(project.root / "c"), "-o", str(out)]) == 0
    html = out.read_text(encoding="utf-8")
    assert "DIVERGED" in html and load_record(project.root / "c")["run_id"] in html
