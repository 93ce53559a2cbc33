"""Which rows an eval takes and what it does to them: a capped eval's rows are a seeded sample of
the split (not its first N), prompts cut to fit are counted and said, and an adapter whose other
files differ is named by compare."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from reprotune._eval.compare import compare_evals
from reprotune._eval.evalfile import open_eval_dir
from reprotune._eval.evaluate import run_eval
from reprotune._eval.inputs import sample_rows
from reprotune._jsonio import sha256_file

TINY = {"eval": {"batch_size": 8, "max_new_tokens": 4}, "split": {"ratios": [0.6, 0.1, 0.3]}}
#: Prompts of the tiny rows take about 29 to 54 tokens with the tiny chat template: at 40, some
#: are cut (to 40 less the template's 2 end-of-turn tokens, "</s>\n") and some are not.
SHORT = 40


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tinyrun import TinyProject

    return TinyProject.create(tmp_path_factory.mktemp("eval-rows"))


@pytest.fixture(scope="module")
def run_a(project: Any) -> Path:
    project.run_cli("run", str(project.config("a.yaml", **TINY)), "--run-dir", "runA", "--no-progress")
    return Path(project.root / "runA")


def _test_rows(run: Path) -> list[int]:
    return [int(i) for i in json.loads((run / "split.json").read_text(encoding="utf-8"))["test"]]


def _eval_seed(run: Path) -> int:
    return int(json.loads((run / "record.json").read_text(encoding="utf-8"))["seeds"]["eval"])


def test_sample_rows_is_the_draw_eval_max_rows_makes_of_the_validation_rows() -> None:
    """The generation cap draws as the validation cap does (one derivation, recorded), in
    manifest order, without replacement; no cap (or one past the split) takes every row."""
    from reprotune._train.data import RunData

    rows = list(range(3, 300, 3))
    for cap, seed in ((1, 0), (7, 11), (32, 2**40 + 5), (98, 3)):
        manifest = SimpleNamespace(indices={"validation": rows})
        data = RunData(None, manifest, None, "", "prompt", "response", eval_max_rows=cap)  # type: ignore[arg-type]
        drawn = sample_rows(rows, cap, seed)
        assert drawn == data.eval_rows(seed)
        assert len(set(drawn)) == cap and drawn == sorted(drawn) and set(drawn) <= set(rows)
    assert (
        sample_rows(rows, None, 5) == rows == sample_rows(rows, len(rows), 5) == sample_rows(rows, 10**6, 5)
    )
    assert sample_rows(rows, 10, 5) != rows[:10]
    assert sample_rows(rows, 10, 5) != sample_rows(rows, 10, 6)


def test_sample_rows_is_the_same_in_every_process() -> None:
    """Another interpreter (another hash seed, no shared generator) draws the same rows."""
    code = (
        "from reprotune._eval.inputs import sample_rows\n"
        "print([sample_rows(range(500), n, s) for n, s in ((5, 1), (40, 123456789), (3, 0))])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "977"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    here = [sample_rows(range(500), n, s) for n, s in ((5, 1), (40, 123456789), (3, 0))]
    assert done.stdout.strip() == str(here)


def test_max_rows_evaluates_a_seeded_sample_of_the_split(project: Any, run_a: Path, tmp_path: Path) -> None:
    """--max-rows N took the split's first N rows (ascending row index: a split grouped by class
    gave its first classes); now N rows drawn with the eval seed, in manifest order, recorded
    (rows, rows_sha256, sample): the same in two fresh processes, other rows under another eval
    seed."""
    test, seed = _test_rows(run_a), _eval_seed(run_a)
    expected = sample_rows(test, 4, seed)
    assert expected != test[:4]
    for name in ("e1", "e2"):
        project.run_cli("eval", str(run_a), "--max-rows", "4", "--out", name, "--no-progress")
    one, two = (json.loads((project.root / n / "eval.json").read_text()) for n in ("e1", "e2"))
    assert [r["index"] for r in one["split"]["rows"]] == expected
    assert one["split"]["rows"] == two["split"]["rows"] and one["split"]["n_rows"] == 4
    assert one["identity_sha256"] == two["identity_sha256"]
    assert one["split"]["sample"] == {
        "max_rows": 4,
        "seed": seed,
        "rule": "numpy.random.Generator(PCG64(eval seed)).choice(split rows, max_rows, replace=False), "
        "kept in manifest order (as eval.max_rows draws the validation rows)",
    }
    lines = (project.root / "e1" / "predictions.jsonl").read_text().splitlines()
    assert [json.loads(line)["index"] for line in lines] == expected
    other = run_eval(run_a, max_rows=4, out=tmp_path / "other", overrides=["seed.overrides.eval=5"])
    assert [r["index"] for r in other.record["split"]["rows"]] == sample_rows(test, 4, 5) != expected
    assert other.record["split"]["rows_sha256"] != one["split"]["rows_sha256"]
    comparison = compare_evals(project.root / "e1", other.eval_dir)
    assert comparison.verdict == "INCOMPARABLE"
    assert f"drawn with eval seeds {seed} vs 5" in comparison.causes[0]
    # an eval made before rows were drawn (no split.sample: it took the first N): the cause says so
    older = shutil.copytree(project.root / "e1", tmp_path / "older")
    record = json.loads((older / "eval.json").read_text())
    del record["split"]["sample"]
    (older / "eval.json").write_text(json.dumps(record))
    cause = compare_evals(older, other.eval_dir).causes[0]
    assert (
        "(A: the split's first rows (made before reprotune drew" in cause
        and "B: drawn with eval seed 5)" in cause
    )
    whole = run_eval(run_a, out=tmp_path / "whole")
    assert [r["index"] for r in whole.record["split"]["rows"]] == test and whole.record["split"][
        "sample"
    ] is None


def test_prompts_cut_to_fit_are_counted_recorded_and_said(project: Any, tmp_path: Path) -> None:
    """A prompt longer than model.max_length less the end-of-turn tokens (2 with the tiny chat
    template) was cut from its start, its system turn and user header first, and nothing said
    so; now eval.json counts them (generation.prompt_truncation: the count and the rows, sorted),
    the progress channel warns once, and predictions.jsonl keeps its keys."""
    from transformers import AutoTokenizer

    from reprotune._train.batches import IGNORE_INDEX, encode_example

    cfg = project.config("short.yaml", **TINY, model={"name": "tiny-model", "max_length": SHORT})
    project.run_cli("run", str(cfg), "--run-dir", "runShort", "--no-progress")
    run = project.root / "runShort"
    said: list[str] = []
    result = run_eval(run, out=tmp_path / "e", report=said.append)

    tokenizer = AutoTokenizer.from_pretrained(project.root / "tiny-model")
    data = [json.loads(line) for line in (project.root / "data.jsonl").read_text().splitlines()]
    whole = {}
    for index in _test_rows(run):
        _, labels = encode_example(
            tokenizer,
            data[index]["prompt"],
            "",
            system_prompt=None,
            prompt_template="{prompt}",
            max_length=10**6,
        )
        whole[index] = sum(1 for label in labels if label == IGNORE_INDEX)
    cut = sorted(i for i, n in whole.items() if n > SHORT - 2)
    assert 0 < len(cut) < len(whole), whole
    assert result.record["generation"]["prompt_truncation"] == {"truncated_rows": len(cut), "rows": cut}
    warnings = [line for line in said if "prompts were cut" in line]
    shown = ", ".join(map(str, cut[:10])) + (f", ... ({len(cut) - 10} more)" if len(cut) > 10 else "")
    assert warnings == [
        f"warning: {len(cut)} of {len(whole)} prompts were cut from their start to fit {SHORT - 2} tokens "
        f"(model.max_length {SHORT} less the end-of-turn tokens training puts after the response), as "
        "training cut them: the system turn and user header go first; "
        f"rows {shown} (eval.json: generation.prompt_truncation)"
    ]
    lines = [json.loads(line) for line in (result.eval_dir / "predictions.jsonl").read_text().splitlines()]
    assert {p["index"]: p["prompt_tokens"] for p in lines} == {i: min(n, SHORT - 2) for i, n in whole.items()}
    assert all(
        set(p)
        == {
            "index",
            "row_sha256",
            "prompt_ids_sha256",
            "prompt_tokens",
            "output_ids",
            "output_ids_sha256",
            "stopped_at_eos",
            "text",
            "scores",
        }
        for p in lines
    )
    # the closing summary says it too, also with --no-progress, where no progress line is printed
    done = project.run_cli("eval", str(run), "--out", str(tmp_path / "quiet"), "--no-progress")
    assert (
        f"{len(cut)} of {len(whole)} prompts were cut from their start to fit model.max_length" in done.stdout
    )


def test_an_eval_made_before_prompt_truncation_was_recorded_still_compares(
    run_a: Path, tmp_path: Path
) -> None:
    """An eval.json without generation.prompt_truncation and torch's fp32_precision settings (made
    before them) opens, and compares IDENTICAL with one that has them, unknown there, not a
    difference."""
    made = run_eval(run_a, out=tmp_path / "new", max_rows=2).eval_dir
    old = shutil.copytree(made, tmp_path / "old")
    record = json.loads((old / "eval.json").read_text(encoding="utf-8"))
    assert record["generation"].pop("prompt_truncation") == {"truncated_rows": 0, "rows": []}
    for flags in (record["determinism"], record["environment"]["determinism"]):  # read since 2026-12-06
        for key in [k for k in flags if k.startswith("fp32_precision")]:
            del flags[key]
    (old / "eval.json").write_text(json.dumps(record), encoding="utf-8")
    assert "prompt_truncation" not in open_eval_dir(old).section("generation")
    for a, b in ((old, made), (made, old)):
        comparison = compare_evals(a, b)
        assert comparison.verdict == "IDENTICAL" and comparison.differences == (), comparison.differences


def test_compare_names_adapter_files_that_differ_with_the_same_weights(run_a: Path, tmp_path: Path) -> None:
    """Two adapters of the same weights, one with another lora_alpha in adapter_config.json: the
    outputs differ, and compare blamed nondeterminism ("nothing recorded differs"): the eval's
    identity and compare's causes held the weights' sha256 alone. Now the cause names
    adapter_config.json. The identity is kept as it was (the weights' sha256): the eval of
    another config is still told apart by its record and by compare."""
    runs = [shutil.copytree(run_a, tmp_path / name, ignore=shutil.ignore_patterns("evals")) for name in "ab"]
    config = runs[1] / "adapter" / "adapter_config.json"
    adapter_config = json.loads(config.read_text(encoding="utf-8"))
    adapter_config["lora_alpha"] = adapter_config["lora_alpha"] * 100
    config.write_text(json.dumps(adapter_config), encoding="utf-8")
    record = json.loads((runs[1] / "record.json").read_text(encoding="utf-8"))
    record["outputs"]["adapter_files"]["adapter_config.json"] = sha256_file(config)
    (runs[1] / "record.json").write_text(json.dumps(record), encoding="utf-8")
    ea, eb = (run_eval(run, out=tmp_path / f"e{run.name}") for run in runs)
    assert ea.record["adapter"]["sha256"] == eb.record["adapter"]["sha256"]
    assert ea.record["identity_sha256"] == eb.record["identity_sha256"]
    comparison = compare_evals(ea.eval_dir, eb.eval_dir)
    assert comparison.verdict == "DIVERGED"
    weights = ea.record["adapter"]["sha256"][:12]
    files = ea.record["adapter"]["files"]["adapter_config.json"][:12], sha256_file(config)[:12]
    assert comparison.causes == (
        f"adapter files differ, with the same weights {weights}...: adapter_config.json "
        f"{files[0]}... vs {files[1]}...",
    )
