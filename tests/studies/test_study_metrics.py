"""A run's metrics: the final validation loss from its record, and its evaluations, read defensively."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from reprotune._config.loading import config_from_dict
from reprotune._config.schema import config_sha256
from reprotune._jsonio import sha256_bytes
from reprotune._run.record import new_record, typed_record
from reprotune._studies import study as study_module
from reprotune._studies.execute import RunOutcome
from reprotune._studies.layout import StudyLayout
from reprotune._studies.metrics import eval_setup, run_metrics
from reprotune._studies.plan import PlannedRun
from reprotune._studies.study import StudyOptions, run_study

FINAL = (5.4375).hex()  # the record's outputs.final_val_loss


def _eval(run: Path, name: str, body: object) -> None:
    path = run / "evals" / name / "eval.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(body) if not isinstance(body, str) else body, encoding="utf-8")


def test_final_val_loss_exact_bits(tmp_path: Path) -> None:
    """The value is the record's float.hex, bit for bit."""
    metrics, notes, setups = run_metrics(tmp_path, FINAL)
    assert metrics == {"final_val_loss": 5.4375} and notes == [] and setups == {}


def test_eval_metrics_read_defensively(tmp_path: Path) -> None:
    """Numbers become <split>/<name> (nested with dots); unfinished, broken and numberless evals are
    left out with a note; a name two evals disagree on is kept apart by eval id."""
    first = {"bleu": 12.5, "chrf": {"score": 40}}
    _eval(tmp_path, "e1", {"split": "test", "status": "completed", "metrics": first})
    second = {"bleu": 13.0, "signature": "BLEU|nrefs:1", "em": True}
    _eval(tmp_path, "e2", {"split": "test", "metrics": second})
    _eval(tmp_path, "e3", {"split": "test", "status": "running", "metrics": {"bleu": 1.0}})
    _eval(tmp_path, "e4", "{not json")
    _eval(tmp_path, "e5", {"metrics": {"note": "text only"}})
    metrics, notes, _ = run_metrics(tmp_path, FINAL)
    assert metrics == {
        "final_val_loss": 5.4375,
        "test/bleu": 12.5,
        "test/chrf.score": 40.0,
        "test/bleu@e2": 13.0,
    }
    assert [n.split(": ", 1)[1] for n in notes] == [
        "left out, status 'running'",
        "left out, unreadable (JSONDecodeError)",
        "left out, no numeric metrics",
    ]


def test_no_validation_loss(tmp_path: Path) -> None:
    """A run without a final validation loss: no such metric, and a note."""
    metrics, notes, _ = run_metrics(tmp_path, None)
    assert metrics == {} and "no final validation loss" in notes[0]


def _generation(**changes: Any) -> dict[str, Any]:
    prompt = {"format": "chat_template", "max_length": 64, "truncation": "prompt cut from its start"}
    return {"decoding": "greedy", "max_new_tokens": 64, "temperature": None, "prompt": prompt, **changes}


def test_evals_that_do_not_measure_the_run_alike_are_told_apart(tmp_path: Path) -> None:
    """An eval of the base model alone is left out (it does not measure the run); a whole-split
    eval takes the plain name before an earlier one of the first 3 rows, which is kept apart with
    its setup; the setup says rows, decoding, sampling and prompt, and not the eval seed."""

    def body(n_rows: int, **generation: Any) -> dict[str, Any]:
        return {
            "split": {"name": "test", "n_rows": n_rows, "split_rows": 7},
            "metrics": {"bleu": float(n_rows)},
            "generation": {**_generation(**generation), "eval_seed": n_rows},
        }

    _eval(tmp_path, "e1-quick", body(3))
    _eval(tmp_path, "e2-full", body(7))
    _eval(tmp_path, "e3-base", {**body(7), "base_only": True})
    metrics, notes, setups = run_metrics(tmp_path, FINAL)
    quick = f"test/bleu@{sha256_bytes(eval_setup(body(3)).encode())[:8]}"  # named by its setup
    assert metrics == {"final_val_loss": 5.4375, "test/bleu": 7.0, quick: 3.0}
    assert notes == [
        f"{tmp_path.name}/evals/e3-base/eval.json: left out, an eval of the base model alone "
        "(--base-only), not of this run"
    ]
    assert setups["test/bleu"] == (
        "test all rows, greedy, 64 new tokens, format 'chat_template', max_length 64"
    )
    assert setups[quick].startswith("test first 3 rows, greedy")  # an eval made before rows were drawn
    drawn = {**body(3), "split": {**body(3)["split"], "sample": {"max_rows": 3, "seed": 5}}}
    assert eval_setup(drawn).startswith("test 3 rows drawn with the eval seed, greedy")
    sampled = body(7, decoding="sampling", temperature=0.7)
    assert "sampling, temperature 0.7" in eval_setup(sampled) != eval_setup(body(7))
    assert eval_setup({**body(7), "generation": {**body(7)["generation"], "eval_seed": 99}}) == eval_setup(
        body(7)
    )


def test_two_evals_of_each_run_are_named_alike_whatever_order_they_were_made_in(tmp_path: Path) -> None:
    """Run a evaluated greedy then sampled, run b sampled then greedy (their directories start with
    the time): each run's greedy and sampled evals get the same names, so each is one metric of the
    study (before, the first made took the plain name, the other one named by its directory)."""

    def body(decoding: str, value: float) -> dict[str, Any]:
        generation = _generation(decoding=decoding, temperature=0.7 if decoding == "sampling" else None)
        return {
            "split": {"name": "test", "n_rows": 7, "split_rows": 7},
            "metrics": {"bleu": value},
            "generation": generation,
        }

    names = []
    for run, order in (("a", ("greedy", "sampling")), ("b", ("sampling", "greedy"))):
        run_dir = tmp_path / run
        for time, decoding in enumerate(order):
            _eval(run_dir, f"2026120{time}-{decoding}", body(decoding, 1.0 if decoding == "greedy" else 2.0))
        metrics, _, setups = run_metrics(run_dir, FINAL)
        names.append({name: (metrics[name], setups[name]) for name in metrics if name != "final_val_loss"})
    assert names[0] == names[1] and len(names[0]) == 2, names


def test_a_diverged_run_leaves_its_loss_out_with_a_note(tmp_path: Path) -> None:
    """A final validation loss of NaN or inf (a run that diverged) is no number a study can
    summarise: left out, said (before, writing study.json failed on it with a traceback)."""
    for value in (float("nan"), float("inf")):
        metrics, notes, _ = run_metrics(tmp_path, value.hex())
        assert "final_val_loss" not in metrics and notes == [
            f"{tmp_path.name}: final validation loss {value}, the run diverged: left out"
        ]


def test_an_extra_eval_of_one_run_leaves_the_metric_every_run_shares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every run evaluated with sampling, run 0 also greedily (a setup that sorts first): the
    study names test/bleu by the setup all three share, and run 0's greedy eval apart, measured
    by it alone (before, run 0's greedy eval took the plain name, and the study left test/bleu out:
    "the runs' evaluations differ")."""

    def body(decoding: str, value: float) -> dict[str, Any]:
        generation = _generation(decoding=decoding, temperature=0.7 if decoding == "sampling" else None)
        return {"split": "test", "metrics": {"bleu": value}, "generation": generation}

    def execute(runs: Sequence[PlannedRun], paths: StudyLayout, *, on_done: Any, **_: Any) -> None:
        for planned in runs:  # each run as if trained: its record and evals, made here
            run_dir = paths.run_dir(planned.name)
            _eval(run_dir, "20261201-sampling", body("sampling", 10.0 + planned.index))
            if planned.index == 0:
                _eval(run_dir, "20261202-greedy", body("greedy", 30.0))
            record = {**new_record("r", {}, config_sha256(planned.config), {}), "status": "completed"}
            record["outputs"] = {"final_val_loss": (1.0 + planned.index).hex()}
            on_done(RunOutcome(planned, run_dir, typed_record(record), "ran", 0.0))

    monkeypatch.setattr(study_module, "execute_runs", execute)
    cfg = config_from_dict({"seed": {"root": 1}})
    study = run_study(cfg, n=3, vary="all", options=StudyOptions(out=tmp_path / "s", tracking=False)).study
    greedy = f"test/bleu@{sha256_bytes(eval_setup(body('greedy', 30.0)).encode())[:8]}"
    assert study["metrics"] == ["final_val_loss", "test/bleu"]
    assert study["summary"]["all"]["test/bleu"]["values"] == [10.0, 11.0, 12.0]
    assert [run["metrics"] for run in study["runs"]] == [
        {"final_val_loss": 1.0, "test/bleu": 10.0, greedy: 30.0},
        {"final_val_loss": 2.0, "test/bleu": 11.0},
        {"final_val_loss": 3.0, "test/bleu": 12.0},
    ]
    assert study["metric_notes"] == [f"{greedy}: measured in 1 of 3 runs only, left out of the summary"]
