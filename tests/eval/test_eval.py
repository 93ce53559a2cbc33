"""``reprotune eval`` on real tiny runs: byte-identical in fresh processes, independent of the batch
size, seeded sampling, the tokenizer rule, comparison, and bad input refused with nothing written."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from html import escape
from pathlib import Path
from typing import Any

import pytest

from reprotune._cli import main
from reprotune._eval.compare import compare_evals, latest_pairs
from reprotune._eval.evalfile import open_eval_dir
from reprotune._eval.evaluate import EvalResult, run_eval
from reprotune._proof.report import write_report

TINY = {"eval": {"batch_size": 8, "max_new_tokens": 8}}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny project of its own (tests here edit its data and tokenizer, and put them back)."""
    from tinyrun import TinyProject

    return TinyProject.create(tmp_path_factory.mktemp("eval-project"))


@pytest.fixture(scope="module")
def run_a(project: Any) -> Path:
    project.run_cli("run", str(project.config("a.yaml", **TINY)), "--run-dir", "runA", "--no-progress")
    return Path(project.root / "runA")


def _eval(run_dir: Path, out: Path, *args: str, batch_size: int | None = None) -> EvalResult:
    return run_eval(run_dir, out=out, batch_size=batch_size, overrides=list(args))


def _listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


@pytest.fixture()
def restored(project: Any) -> Iterator[None]:
    """Put the project's data and tokenizer files back after a test that edits them."""
    files = [project.root / "data.jsonl", *sorted((project.root / "tiny-model").glob("tokenizer*"))]
    saved = {f: f.read_bytes() for f in files}
    yield
    for f, data in saved.items():
        f.write_bytes(data)


def test_eval_twice_in_fresh_processes_is_byte_identical(project: Any, run_a: Path) -> None:
    """Two evals of one run, each in a fresh process, write byte-identical predictions.jsonl and
    the same metrics; compare says IDENTICAL (exit 0)."""
    first = project.run_cli("eval", str(run_a), "--out", "e1", "--no-progress")
    project.run_cli("eval", str(run_a), "--out", "e2", "--no-progress")
    one, two = project.root / "e1", project.root / "e2"
    assert (one / "predictions.jsonl").read_bytes() == (two / "predictions.jsonl").read_bytes()
    rec1, rec2 = (json.loads((d / "eval.json").read_text()) for d in (one, two))
    assert rec1["metrics"] == rec2["metrics"]
    assert set(rec1["metrics"]) == {
        "bleu",
        "chrf",
        "rouge1",
        "rouge2",
        "rougeL",
        "exact_match",
        "mean_length",
    }
    assert rec1["split"]["name"] == "test" and rec1["split"]["n_rows"] == rec1["split"]["split_rows"] > 0
    assert (
        rec1["adapter"]["sha256"]
        == json.loads((run_a / "record.json").read_text())["outputs"]["adapter_sha256"]
    )
    assert rec1["generation"]["batch_invariant"] is True and rec1["adapter"]["merged"] is False
    # The claim carries its evidence: the GEMM blocks in force and the check that was passed.
    evidence = rec1["generation"]["invariance"]
    assert evidence["shown"] and evidence["check"]["equal"]
    assert rec1["generation"]["gemm_blocks"] == evidence["gemm"]["blocks"]
    assert "predictions sha256" in first.stdout
    done = project.run_cli("compare", "e1", "e2")
    assert done.stdout.startswith("IDENTICAL")
    # Whether the block plan came from the cache, and how long probing took, are no fact of the
    # eval: not listed as record differences (they were, as "gemm.cached: False vs True").
    cached = shutil.copytree(one, project.root / "e1-cached")
    record = json.loads((cached / "eval.json").read_text())
    gemm = record["generation"]["invariance"]["gemm"]
    gemm.update(cached=not gemm["cached"], probe_s=gemm["probe_s"] + 1.5)
    (cached / "eval.json").write_text(json.dumps(record))
    assert compare_evals(one, cached).differences == ()


@pytest.mark.parametrize(
    "overrides",
    [(), ("eval.decoding=sample", "eval.temperature=0.9", "eval.top_k=40", "eval.top_p=0.95")],
    ids=["greedy", "sample"],
)
def test_batch_sizes_give_identical_predictions(
    run_a: Path, tmp_path: Path, overrides: tuple[str, ...]
) -> None:
    """Batch sizes 1, 3 and 8 give byte-identical predictions.jsonl, greedy and sampling."""
    outputs = [
        (
            _eval(run_a, tmp_path / f"bs{b}", *overrides, batch_size=b).eval_dir / "predictions.jsonl"
        ).read_bytes()
        for b in (1, 3, 8)
    ]
    assert outputs[0] == outputs[1] == outputs[2]


def test_seeded_sampling_repeats_and_moves_with_the_eval_seed(run_a: Path, tmp_path: Path) -> None:
    """Sampling repeats under the same eval seed and differs under another; compare names the seed."""
    sample = ("eval.decoding=sample", "eval.temperature=1.0")
    a = _eval(run_a, tmp_path / "a", *sample, "seed.overrides.eval=11")
    b = _eval(run_a, tmp_path / "b", *sample, "seed.overrides.eval=11")
    c = _eval(run_a, tmp_path / "c", *sample, "seed.overrides.eval=12")
    assert (a.eval_dir / "predictions.jsonl").read_bytes() == (b.eval_dir / "predictions.jsonl").read_bytes()
    comparison = compare_evals(a.eval_dir, c.eval_dir)
    assert comparison.verdict == "DIVERGED" and comparison.rows_differing
    assert any("eval seed differs (sampling): 11 vs 12" in cause for cause in comparison.causes)


def test_evals_are_paired_by_their_seed_and_the_latest_by_time(run_a: Path, tmp_path: Path) -> None:
    """Sampled evals pair only under one eval seed, and of two alike the one made last is taken,
    whatever its directory is named (before: the seed was no part of the pairing, and the latest
    was the last by name, so a 'zzz' eval made first won)."""
    sample = ("eval.decoding=sample", "eval.temperature=1.0")
    a, b = (shutil.copytree(run_a, tmp_path / name, ignore=shutil.ignore_patterns("evals")) for name in "ab")
    _eval(a, a / "evals" / "zzz-first", *sample, "seed.overrides.eval=12")
    second = _eval(a, a / "evals" / "aaa-second", *sample, "seed.overrides.eval=12").eval_dir
    _eval(a, a / "evals" / "mmm-other-seed", *sample, "seed.overrides.eval=11")
    other = _eval(b, b / "evals" / "x", *sample, "seed.overrides.eval=12").eval_dir
    assert latest_pairs(a, b) == [(second, other)]


def test_a_damaged_eval_is_left_out_of_the_runs_comparison_and_said(
    run_a: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One eval of a run with its predictions cut: `compare RUN_A RUN_B` still compares the runs
    and their sound evals, warning of the damaged one by name; the report shows it as damaged
    (both exited 2 on it, comparing nothing)."""
    made = _eval(run_a, tmp_path / "made", "eval.max_new_tokens=2").eval_dir
    runs = [shutil.copytree(run_a, tmp_path / name, ignore=shutil.ignore_patterns("evals")) for name in "xy"]
    for run in runs:
        shutil.copytree(made, run / "evals" / "sound")
    cut = shutil.copytree(made, runs[0] / "evals" / "cut")
    (cut / "predictions.jsonl").write_text("", encoding="utf-8")
    capsys.readouterr()
    assert main(["compare", str(runs[0]), str(runs[1])]) == 0
    done = capsys.readouterr()
    assert f"warning: eval {cut} is damaged, left out of the comparison: " in done.err
    assert "IDENTICAL" in done.out and "evals of the two runs: IDENTICAL" in done.out
    html = write_report(runs, tmp_path / "report.html").read_text(encoding="utf-8")
    assert "<td>cut</td><td>damaged, left out: " in html and "<h2>Evaluations</h2>" in html


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("predictions", "x", "eval.json's predictions is 'x', not Mapping"),
        ("predictions", {"sha256": 5, "n_rows": 7}, "eval.json's predictions.sha256 is 5, not str"),
        ("predictions", {"n_rows": "x"}, "eval.json's predictions.n_rows is 'x', not int"),
        ("metrics", {"bleu": "high"}, "eval.json's metrics.bleu is 'high', not int or float or NoneType"),
        ("generation", "x", "eval.json's generation is 'x', not Mapping"),
    ],
    ids=["predictions-text", "sha256-number", "n_rows-text", "metric-text", "generation-text"],
)
def test_damaged_sections_of_eval_json_are_refused(
    run_a: Path, tmp_path: Path, key: str, value: Any, said: str
) -> None:
    """Sections compare reads, damaged: bad input naming the key (each compared IDENTICAL before:
    the predictions' check skipped, a metric's difference dropped, differences invented)."""
    from reprotune._errors import InputError

    made = _eval(run_a, tmp_path / "made", "eval.max_new_tokens=2").eval_dir
    record = json.loads((made / "eval.json").read_text(encoding="utf-8"))
    record[key] = value
    (made / "eval.json").write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(InputError, match=re.escape(said)) as refused:
        open_eval_dir(made)
    assert refused.value.source.startswith(f"{made / 'eval.json'} (key {key}")


def test_predictions_that_are_not_the_ones_eval_json_lists_are_refused(run_a: Path, tmp_path: Path) -> None:
    """An emptied, cut or doubled predictions.jsonl: bad input naming the file (before, compare of
    two emptied ones said IDENTICAL over 0 rows, and a row given twice collapsed into one)."""
    from reprotune._errors import InputError
    from reprotune._jsonio import sha256_file

    made = _eval(run_a, tmp_path / "made", "eval.max_new_tokens=2").eval_dir
    lines = (made / "predictions.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    for case, content in (("emptied", ""), ("cut", "".join(lines[:1]))):
        copy = shutil.copytree(made, tmp_path / case)
        (copy / "predictions.jsonl").write_text(content, encoding="utf-8")
        with pytest.raises(InputError, match=r"is not the file eval\.json lists"):
            open_eval_dir(copy)
    doubled = shutil.copytree(made, tmp_path / "doubled")
    (doubled / "predictions.jsonl").write_text("".join([*lines, lines[0]]), encoding="utf-8")
    record = json.loads((doubled / "eval.json").read_text(encoding="utf-8"))
    record["predictions"] |= {"sha256": sha256_file(doubled / "predictions.jsonl"), "n_rows": len(lines) + 1}
    (doubled / "eval.json").write_text(json.dumps(record), encoding="utf-8")
    first = json.loads(lines[0])["index"]
    with pytest.raises(InputError, match=rf"row {first} is in predictions\.jsonl twice"):
        open_eval_dir(doubled)


def test_an_eval_pair_emptied_with_its_listing_deleted_is_refused(
    run_a: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two copies of an eval, each with eval.json's predictions key deleted and predictions.jsonl
    emptied, compared IDENTICAL over 0 rows (exit 0); so did a file rewritten to match its
    listing but not the rows the split names. Now exit 2 naming the file, what it holds, what the
    record says, and the fix: make the eval again."""
    from reprotune._jsonio import sha256_file

    made = _eval(run_a, tmp_path / "made", "eval.max_new_tokens=2").eval_dir
    n_rows = open_eval_dir(made).record["split"]["n_rows"]
    pair = [shutil.copytree(made, tmp_path / name) for name in ("d1", "d2")]
    for copy in pair:
        record = json.loads((copy / "eval.json").read_text(encoding="utf-8"))
        del record["predictions"]
        (copy / "eval.json").write_text(json.dumps(record), encoding="utf-8")
        (copy / "predictions.jsonl").write_text("", encoding="utf-8")
    assert main(["compare", str(pair[0]), str(pair[1])]) == 2
    err = capsys.readouterr().err
    assert (
        f"{pair[0] / 'eval.json'} (key predictions): eval.json has no predictions, so predictions.jsonl "
        in err
    )
    assert f"(it holds 0 rows) cannot be checked against it; the record's split lists {n_rows} rows" in err
    assert f"fix: make the eval again (`reprotune eval {run_a.resolve()}`" in err, err

    lines = (made / "predictions.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    first, second = (json.loads(line) for line in lines[:2])
    for case, content, said in (
        ("emptied", "", f"it holds 0 rows, the split lists {n_rows}"),
        (
            "swapped",
            "".join([lines[1], lines[0], *lines[2:]]),
            f"its line 1 is row {second['index']} (row sha256 {second['row_sha256'][:12]}...), the split "
            f"lists row {first['index']} (row sha256 {first['row_sha256'][:12]}...) there",
        ),
    ):
        copy = shutil.copytree(made, tmp_path / case)
        (copy / "predictions.jsonl").write_text(content, encoding="utf-8")
        record = json.loads((copy / "eval.json").read_text(encoding="utf-8"))
        record["predictions"] |= {
            "sha256": sha256_file(copy / "predictions.jsonl"),
            "n_rows": content.count("\n"),
        }
        (copy / "eval.json").write_text(json.dumps(record), encoding="utf-8")
        assert main(["compare", str(copy), str(made)]) == 2
        err = capsys.readouterr().err
        assert (
            f"{copy / 'predictions.jsonl'}: predictions.jsonl does not hold the rows eval.json's split "
            in err
        )
        assert said in err and "fix: make the eval again" in err, err


def test_a_changed_tokenizer_is_refused(project: Any, run_a: Path, restored: None) -> None:
    """A tokenizer file that differs from the run's is refused (exit 2, both hashes and the file
    named, nothing written) unless --allow-tokenizer-change, which the eval record says."""
    config = project.root / "tiny-model" / "tokenizer_config.json"
    data = json.loads(config.read_text())
    data["model_max_length"] = 12345
    config.write_text(json.dumps(data))
    before = _listing(run_a)
    done = project.run_cli("eval", str(run_a), "--no-progress", check=False)
    assert done.returncode == 2, done.stderr
    recorded = json.loads((run_a / "record.json").read_text())["model"]["tokenizer_sha256"]
    assert recorded in done.stderr and "tokenizer_config.json" in done.stderr
    assert "--allow-tokenizer-change" in done.stderr
    assert _listing(run_a) == before
    allowed = project.run_cli(
        "eval", str(run_a), "--out", "allowed", "--allow-tokenizer-change", "--no-progress"
    )
    record = json.loads((project.root / "allowed" / "eval.json").read_text())
    assert record["tokenizer"]["allowed"] is True and record["tokenizer"]["recorded_sha256"] == recorded
    assert record["tokenizer"]["sha256"] != recorded and "WARNING" in allowed.stdout


def test_compare_names_a_changed_adapter(project: Any, run_a: Path, tmp_path: Path) -> None:
    """Evals of two runs whose adapters differ: compare names the adapter as the cause, with the
    rows that differ and the metric deltas; `compare RUN_A RUN_B` compares their evals too."""
    cfg = project.config("b.yaml", **TINY, train={**_base_train(), "learning_rate": 3.0e-2})
    project.run_cli("run", str(cfg), "--run-dir", "runB", "--no-progress")
    run_b = project.root / "runB"
    ea = _eval(run_a, run_a / "evals" / "pair").eval_dir
    eb = _eval(run_b, run_b / "evals" / "pair").eval_dir
    comparison = compare_evals(ea, eb)
    assert comparison.verdict == "DIVERGED"
    assert comparison.causes[0].startswith("adapter differs")
    assert comparison.rows_differing and all(r.first_token >= 0 for r in comparison.rows_differing)
    done = project.run_cli("compare", "runA", "runB", check=False)
    assert done.returncode == 1
    assert "evals of the two runs: DIVERGED" in done.stdout and "adapter differs" in done.stdout
    html = write_report([run_a, run_b], tmp_path / "report.html").read_text(encoding="utf-8")
    assert "<h2>Evaluations</h2>" in html and "Rows whose outputs differ" in html
    for e in (ea, eb):  # each eval's row names the adapter it scored, as compare does
        assert f"<td>{open_eval_dir(e).section('adapter')['sha256'][:12]}...</td>" in html
    for row in comparison.rows_differing:
        assert f"<td>{escape(row.text_a)}</td><td>{escape(row.text_b)}</td>" in html


def _base_train() -> dict[str, Any]:
    from tinyrun import BASE_CONFIG

    return dict(BASE_CONFIG["train"])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--max-rows", "0"], "max rows must be a whole number >= 1 (got 0)"),
        (["--batch-size", "0"], "batch size must be a whole number >= 1 (got 0)"),
        (["--set", "eval.decoding=sample", "--set", "eval.temperature=0"], "eval.temperature"),
        (["--set", "eval.decoding=sample", "--set", "eval.top_p=1.5"], "eval.top_p"),
        (["--set", "eval.top_k=5"], "has no effect with eval.decoding: greedy"),
        (["--set", "lora.r=2"], "an eval cannot change"),
        (["--set", "seed.overrides.split=3"], "changes nothing in an eval: it takes the run's own split"),
        (["--set", "seed.overrides={split: 5, lora_init: 3}"], "changes seed.overrides of lora_init, split"),
        (["--set", "foo"], "--set 'foo': expected KEY.PATH=VALUE; fix: e.g. --set eval.max_rows=8"),
        (["--set", "eval.batch_sise=2"], "record.json (the run's config) with --set: invalid config"),
    ],
    ids=[
        "max-rows-0",
        "batch-size-0",
        "temperature-0",
        "top-p-1.5",
        "top-k-greedy",
        "set-lora",
        "split-seed",
        "seeds-as-a-mapping",
        "no-equals",
        "typo",
    ],
)
def test_bad_input_exits_2_with_nothing_written(
    run_a: Path, capsys: pytest.CaptureFixture[str], args: list[str], expected: str
) -> None:
    """Bad options and settings exit 2 naming the value, and write nothing."""
    before = _listing(run_a)
    assert main(["eval", str(run_a), "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert expected in err and "fix:" in err
    assert _listing(run_a) == before


def test_changed_data_is_refused_naming_the_rows(
    project: Any, run_a: Path, restored: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Data that no longer matches the run's manifest is refused (exit 2), naming the edited row."""
    manifest = json.loads((run_a / "split.json").read_text())
    row = manifest["test"][0]
    lines = (project.root / "data.jsonl").read_text().splitlines()
    edited = json.loads(lines[row])
    edited["response"] += " (edited)"
    lines[row] = json.dumps(edited)
    (project.root / "data.jsonl").write_text("\n".join(lines) + "\n")
    before = _listing(run_a)
    assert main(["eval", str(run_a), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"edited  row {row} (test)" in err and "check-split" in err
    assert "leakage: not checked" in err and "(no text columns)" not in err  # it claimed "none"
    assert _listing(run_a) == before


@pytest.mark.parametrize("moved", ["data.jsonl", "tiny-model"])
def test_a_data_file_or_model_directory_gone_is_to_be_put_back(
    project: Any, run_a: Path, moved: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run's data file or local base model gone: exit 2, the fix says to put back the run's
    own (its path and sha256), where it said to give some data file or download a hub model."""
    place = project.root / moved
    place.rename(project.root / "moved-away")
    try:
        before = _listing(run_a)
        assert main(["eval", str(run_a), "--no-progress"]) == 2
    finally:
        (project.root / "moved-away").rename(place)
    err = capsys.readouterr().err
    assert (
        "is no longer there" in err and f"fix: put the {'file' if moved == 'data.jsonl' else 'model'}" in err
    )
    assert f"back at {place}" in err and "sha256 " in err
    assert "hf download" not in err and "give a JSONL" not in err
    assert _listing(run_a) == before


def test_a_run_without_adapter_or_test_rows_is_refused(
    project: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stopped run has no adapter (exit 2; --base-only is the way round); a split without rows
    is refused (exit 2); nothing is written either time."""
    cfg = project.config("s.yaml", **TINY, split={"stratify_by": "category", "ratios": [0.9, 0.1, 0.0]})
    project.run_cli("run", str(cfg), "--run-dir", "runS", "--no-progress", "--stop-after-step", "1")
    run_s = project.root / "runS"
    before = _listing(run_s)
    assert main(["eval", str(run_s), "--no-progress"]) == 2
    assert "has no adapter to evaluate (status 'stopped')" in capsys.readouterr().err
    assert main(["eval", str(run_s), "--base-only", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "the test split of the run" in err and "has no rows" in err and "--split validation" in err
    assert _listing(run_s) == before


def test_a_missing_adapter_file_is_refused_naming_it(
    run_a: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A completed run whose adapter_config.json is gone: exit 2 naming the file as missing (it
    was an internal error); the weights gone: the fix restores adapter/ (resume cannot: the run is
    complete)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_a, run, ignore=shutil.ignore_patterns("evals"))
    (run / "adapter" / "adapter_config.json").unlink()
    assert main(["eval", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "adapter_config.json (recorded " in err and ", now missing)" in err and "Traceback" not in err
    (run / "adapter" / "adapter_model.safetensors").unlink()
    assert main(["eval", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "fix: restore adapter/ from a copy of the run directory, or evaluate the base model" in err


def test_compare_of_evals_over_other_rows_blames_no_nondeterminism(run_a: Path, tmp_path: Path) -> None:
    """Evals over 3 rows and over all rows, every shared row alike: INCOMPARABLE for the rows, and
    no word of nondeterminism (nothing was generated differently); A is named first."""
    few = run_eval(run_a, out=tmp_path / "few", max_rows=3)
    every = run_eval(run_a, out=tmp_path / "every")
    comparison = compare_evals(few.eval_dir, every.eval_dir)
    assert comparison.verdict == "INCOMPARABLE" and not comparison.rows_differing
    assert comparison.causes[0].startswith("the evals cover different rows")
    assert not any("nondeterminism" in cause for cause in comparison.causes)
    assert comparison.format().startswith(f"INCOMPARABLE: eval {few.eval_dir} vs {every.eval_dir}")


def test_an_existing_out_is_refused(run_a: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An eval never overwrites: an existing --out directory exits 2 and is left as it was."""
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep")
    assert main(["eval", str(run_a), "--out", str(tmp_path / "taken"), "--no-progress"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert _listing(tmp_path / "taken") == ["mine.txt"]


def test_an_out_inside_the_run_but_not_its_evals_is_refused(
    run_a: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--out RUN/adapter/ev or RUN/checkpoints/ev mixed an eval into the run's own files
    (accepted: only another run's directory was refused); an eval of a run goes in its evals/."""
    before = _listing(run_a)
    for inside in (run_a / "adapter" / "ev", run_a / "checkpoints" / "ev"):
        assert main(["eval", str(run_a), "--out", str(inside), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"--out {str(inside)!r} is inside the run directory {run_a.resolve()}" in err, err
        assert "(an eval of a run goes in its evals/)" in err
    assert _listing(run_a) == before


def test_base_only_evaluates_the_base_model(run_a: Path, tmp_path: Path) -> None:
    """--base-only evaluates without the adapter (recorded), on the same rows; compare says why
    the outputs differ: the adapter."""
    base = run_eval(run_a, out=tmp_path / "base", base_only=True)
    tuned = run_eval(run_a, out=tmp_path / "tuned")
    assert base.record["base_only"] is True and base.record["adapter"] is None
    assert base.record["split"]["rows"] == tuned.record["split"]["rows"]
    comparison = compare_evals(base.eval_dir, tuned.eval_dir)
    assert comparison.verdict == "DIVERGED"
    assert comparison.causes[0].startswith("adapter differs: none (base model alone)")


def test_no_tmp_dirs_are_left_behind(run_a: Path) -> None:
    """Evals built under a temporary name leave none behind."""
    assert [p.name for p in (run_a / "evals").iterdir() if p.name.startswith(".")] == []
    assert not list(run_a.parent.glob(".*.tmp-*"))


def test_compare_of_evals_does_not_import_torch(project: Any, run_a: Path, tmp_path: Path) -> None:
    """`reprotune compare` on two eval directories never imports torch."""
    import subprocess
    import sys

    out = tmp_path / "e"
    run_eval(run_a, out=out)
    shutil.copytree(out, tmp_path / "f")
    code = (
        "import sys\nfrom reprotune._cli import main\n"
        f"rc = main(['compare', {str(out)!r}, {str(tmp_path / 'f')!r}])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("IDENTICAL")


def test_a_trainer_script_s_run_is_refused_for_what_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run the callback wrote inside a Trainer script holds the Trainer's settings, not a
    reprotune config: refused as such (before: "invalid config (4 problems): lora.lora_alpha:
    unknown key ... did you mean 'alpha'?", as if its record were to be edited)."""
    from rundirs import RunSpec, write_run_dir

    run = write_run_dir(
        tmp_path / "trainer-run", RunSpec(config={"trainer": {"per_device_train_batch_size": 4}})
    )
    assert main(["eval", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "written by ReprotuneCallback inside a Trainer script" in err and "invalid config" not in err, err
