"""``significance``: Welch's t-test and a permutation test from SciPy, honest about seed noise.

The false-positive check draws many pairs of synthetic studies from one distribution (no
training) and counts how often the verdict says "beyond seed noise": it must be about alpha.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from synthetic import MODEL, write_study_dir

from reprotune._cli import main
from reprotune._errors import InputError
from reprotune._studies.significance import _power_text, significance, study_differences
from reprotune._studies.twosample import compare_samples, p_value, seeds_for_power, verdict_line, welch_power

REPETITIONS = 1000
ALPHA = 0.05
# Over 1,000 repetitions the rate's standard error at 5 % is 0.69 points: this band is about
# three standard errors either side of the nominal rate.
BAND = (0.03, 0.07)


def test_false_positive_rate_is_nominal() -> None:
    """Two studies of 5 seeds from one normal distribution: 'beyond noise' about 5 % of the time,
    by Welch's t-test (the verdict) and by the permutation test alike."""
    rng = np.random.default_rng(20260101)
    welch = permutation = 0
    for _ in range(REPETITIONS):
        a, b = rng.normal(5.0, 0.05, size=5), rng.normal(5.0, 0.05, size=5)
        result = compare_samples(a, b, alpha=ALPHA)
        welch += result.beyond_noise
        permutation += result.permutation_p < ALPHA
    assert BAND[0] <= welch / REPETITIONS <= BAND[1], welch / REPETITIONS
    assert BAND[0] <= permutation / REPETITIONS <= BAND[1], permutation / REPETITIONS


def test_a_real_difference_is_found() -> None:
    """A shift of three standard deviations between 5 seeds each is found nearly every time."""
    rng = np.random.default_rng(7)
    found = sum(
        compare_samples(rng.normal(0, 1, 5), rng.normal(3, 1, 5), alpha=ALPHA).beyond_noise
        for _ in range(200)
    )
    assert found / 200 >= 0.9


def test_numbers_are_scipys() -> None:
    """p, the interval and the difference are SciPy's Welch test of B against A."""
    a, b = [1.0, 1.1, 0.9, 1.05], [1.2, 1.3, 1.25, 1.22]
    result = compare_samples(a, b, alpha=0.05)
    welch = stats.ttest_ind(b, a, equal_var=False)
    interval = welch.confidence_interval(0.95)
    assert result.welch_p == float(welch.pvalue)
    assert (result.ci_low, result.ci_high) == (float(interval.low), float(interval.high))
    assert result.difference == float(np.mean(b) - np.mean(a))
    assert result.permutation_exact and result.permutation_resamples == math.comb(8, 4)


@pytest.mark.parametrize(("d", "n"), [(1.0, 17), (0.5, 64), (2.0, 6)], ids=["d1", "d0.5", "d2"])
def test_seeds_for_power(d: float, n: int) -> None:
    """Seeds per side for 80 % power at alpha 0.05, two-sided: the textbook values."""
    assert seeds_for_power(d, 0.05) == n


def simulated_power(
    d: float, seeds: int, alpha: float, ratio: float, rng: np.random.Generator, pairs: int = 20_000
) -> float:
    """The share of ``pairs`` simulated pairs of studies of ``seeds`` runs each in which Welch's
    test (SciPy's) at ``alpha`` finds B apart from A: A of variance 1, B of variance ``ratio``
    shifted by ``d`` pooled deviations (of equal-sized studies)."""
    a = rng.normal(0.0, 1.0, (pairs, seeds))
    b = rng.normal(d * math.sqrt((1 + ratio) / 2), math.sqrt(ratio), (pairs, seeds))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # B without spread (ratio 0): SciPy warns
        return float(np.mean(stats.ttest_ind(b, a, axis=1, equal_var=False).pvalue < alpha))


@pytest.mark.parametrize("ratio", [1.0, 0.1, 0.01])
def test_seeds_for_power_reach_the_power_of_welchs_test(ratio: float) -> None:
    """At the n it gives, Welch's test (the verdict's) reaches 80 % power, and at n - 1 it does not,
    with the variances in ``ratio``: 20,000 simulated pairs of studies each (Monte Carlo standard
    error about 0.003; the bounds allow 0.01). With unequal variances the Student answer (17 for
    d = 1) falls short, so the seeds asked for are more."""
    d = 1.0
    n = seeds_for_power(d, 0.05, variance_ratio=ratio)
    assert n is not None
    rng = np.random.default_rng(7)
    assert simulated_power(d, n, 0.05, ratio, rng) >= 0.79
    assert simulated_power(d, n - 1, 0.05, ratio, rng) < 0.8
    if ratio < 1:
        assert n > seeds_for_power(d, 0.05) == 17


def test_verdict_lines() -> None:
    """The one-line verdict says direction, size, interval, beyond or within, p and seeds."""
    lower = compare_samples([1.0, 1.02, 0.98, 1.01, 0.99], [0.88, 0.9, 0.86, 0.89, 0.87])
    line = verdict_line(lower)
    assert line.startswith("B is lower than A by 0.12 (95% CI 0.0969..0.143), ")
    assert line.endswith(f"beyond seed noise (p = {lower.welch_p:.2g}, 5 seeds each)")
    same = compare_samples([1.0, 1.2, 0.9], [1.1, 0.95, 1.05, 1.0])
    assert "within seed noise" in verdict_line(same) and "3 and 4 seeds" in verdict_line(same)


def test_no_spread_in_either_study() -> None:
    """No seed moves the metric: equal means are 'within', different ones 'beyond', said why."""
    equal = compare_samples([2.0, 2.0, 2.0], [2.0, 2.0, 2.0])
    assert not equal.beyond_noise and equal.note is not None
    apart = compare_samples([2.0, 2.0, 2.0], [1.5, 1.5, 1.5])
    assert apart.beyond_noise and apart.difference == -0.5 and apart.cohens_d is None
    # The verdict says the difference is exact, not a p that no test computed.
    assert verdict_line(apart) == (
        "B is lower than A by 0.5 exactly: no seed noise in either study, every run of each gives the "
        "same value (3 seeds each)"
    )
    assert verdict_line(equal).startswith("B equals A exactly: no seed noise")
    # No test ran: no p-value stands in for one (it said 0.0, and 1.0 when equal).
    assert apart.welch_p is None and apart.welch_t is None and equal.welch_p is None


def test_values_whose_sum_rounds_are_no_spread() -> None:
    """Runs that all give the same bits, in a number whose n-fold sum rounds (NumPy's mean of five
    or seven copies is not the value, their sd 1e-16): no spread, the difference exact (before,
    Welch's test ran on rounding and said "beyond seed noise, p = 0.05")."""
    x = float.fromhex("0x1.601d72e52e52ep+2")
    assert np.mean([x] * 5) != x or np.std([x] * 7, ddof=1) != 0  # the rounding this guards against
    result = compare_samples([x] * 5, [x] * 7)
    assert result.welch_p is None and result.difference == 0 and not result.beyond_noise
    assert (result.mean_a, result.std_a, result.mean_b, result.std_b) == (x, 0.0, x, 0.0)
    assert verdict_line(result).startswith("B equals A exactly: no seed noise")


def test_p_is_shown_with_the_digits_that_tell_it_from_alpha() -> None:
    """p = 0.0496 is beyond and 0.0504 within seed noise at alpha 0.05: neither reads "p = 0.05"."""
    assert (p_value(0.0496, 0.05), p_value(0.0504, 0.05), p_value(0.05, 0.05)) == ("0.0496", "0.0504", "0.05")
    assert (p_value(0.031, 0.05), p_value(0.0499996, 0.05, 3)) == ("0.031", "0.0499996")


def test_an_effect_too_small_to_power_is_not_called_no_difference() -> None:
    """d = 1e-6 needs more seeds than reprotune computes: said so, not "no difference"."""
    result = compare_samples([1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.00001])
    assert result.seeds_for_power is None and result.cohens_d is not None and result.cohens_d > 0
    assert _power_text(result) == "more than 10,000,000 per side (the effect is that small)"


def test_the_confidence_level_is_not_rounded_to_100_percent() -> None:
    """--alpha 0.001 gives a 99.9% interval; the line said "100% CI"."""
    result = compare_samples([1.0, 1.1, 1.2, 0.9], [1.3, 1.5, 1.4, 1.45], alpha=0.001)
    assert "(99.9% CI " in verdict_line(result)
    assert "(95% CI " in verdict_line(compare_samples([1.0, 1.1, 1.2], [1.3, 1.5, 1.4]))


def test_the_smallest_possible_permutation_p_is_the_one_the_test_can_reach() -> None:
    """Exact over few arrangements: 2 / arrangements (3 each: 2/20). Resampled (8 each: 12,870
    arrangements, more than 9,999 resamples): 2 / 10,000, not 2 / 12,870, which it cannot reach."""
    assert compare_samples([1.0, 1.1, 1.2], [2.0, 2.1, 2.2]).permutation_smallest_p == 0.1
    rng = np.random.default_rng(3)
    apart = compare_samples(rng.normal(0, 1, 8).tolist(), rng.normal(9, 1, 8).tolist())
    assert not apart.permutation_exact
    assert apart.permutation_smallest_p == 2 / 10_000 <= apart.permutation_p


@pytest.mark.parametrize(("d", "alpha"), [(10.0, 0.001), (6.0, 0.001), (12.0, 0.01), (8.0, 0.05)])
def test_large_effects_at_small_alpha_get_enough_seeds(d: float, alpha: float) -> None:
    """SciPy's noncentral t is NaN far in a tail; that NaN ended the search at its first guess:
    d = 10 at alpha 0.001 asked for 2 seeds per side, whose real power is about 3 %. The answer
    now reaches the power and the seed below it does not (20,000 simulated pairs of studies, one
    without spread, as variance_ratio 0 says; the bounds allow 0.01)."""
    n = seeds_for_power(d, alpha, variance_ratio=0.0)
    assert n is not None
    rng = np.random.default_rng(11)
    assert simulated_power(d, n, alpha, 0.0, rng) >= 0.79
    if n > 2:
        assert simulated_power(d, n - 1, alpha, 0.0, rng) < 0.81


def test_two_seeds_are_not_called_enough_when_welchs_test_falls_short() -> None:
    """d = 8.61 with variances in ratio 0.27: the answer was 2 per side (a noncentral t at the
    population variances' Welch-Satterthwaite degrees of freedom, 1.5), where Welch's test, which
    estimates its degrees of freedom from 2 values a side, finds the effect in 69 % of pairs of
    studies. Now 3, which reaches 80 % (20,000 simulated pairs each, seed 5; Monte Carlo standard
    error at most 0.0035, the bounds allow 0.01)."""
    n = seeds_for_power(8.61, 0.05, variance_ratio=0.27)
    rng = np.random.default_rng(5)
    assert n == 3
    assert simulated_power(8.61, 2, 0.05, 0.27, rng) < 0.7
    assert simulated_power(8.61, 3, 0.05, 0.27, rng) >= 0.79


@pytest.mark.parametrize(
    ("d", "n", "alpha", "ratio"),
    [
        (8.61, 2, 0.05, 0.27),
        (2.0, 5, 0.05, 1.0),
        (1.0, 10, 0.05, 0.1),
        (12.0, 3, 0.01, 0.0),
        (30.0, 2, 0.01, 0.27),
    ],
    ids=["n2", "n5-equal", "n10-tenth", "n3-no-spread", "n2-alpha0.01"],
)
def test_welch_power_is_the_power_of_welchs_test(d: float, n: int, alpha: float, ratio: float) -> None:
    """welch_power against Welch's test (SciPy's) on 200,000 simulated pairs of studies (seed 3):
    Monte Carlo standard error at most 0.0012; the tolerance is 0.005."""
    simulated = simulated_power(d, n, alpha, ratio, np.random.default_rng(3), pairs=200_000)
    assert welch_power(d, n, alpha, variance_ratio=ratio) == pytest.approx(simulated, abs=0.005)


def test_a_metric_both_studies_measured_is_tested_when_one_measured_more(tmp_path: Path) -> None:
    """B's runs were also evaluated (test/bleu): final_val_loss, which both have, is still tested;
    before, any difference in the metric sets was refused."""
    a = write_study_dir(tmp_path / "a", [1.0, 1.1, 0.9])
    b = write_study_dir(tmp_path / "b", [1.2, 1.3, 1.1], extra_metrics={"test/bleu": [1.0, 2.0, 3.0]})
    result = significance(a, b, metric="final_val_loss")
    assert result.values_b == [1.2, 1.3, 1.1]


def test_an_eval_metric_measured_otherwise_in_the_two_studies_is_refused(tmp_path: Path) -> None:
    """Study A evaluated its runs on the test split's first 3 rows, B on all of it: no test of
    test/bleu (before, a verdict, with only the config's differences listed)."""
    bleu = {"test/bleu": [1.0, 1.1, 1.2]}
    a = write_study_dir(tmp_path / "a", [5.0, 5.1, 5.2], extra_metrics=bleu)
    b = write_study_dir(tmp_path / "b", [5.0, 5.1, 5.3], extra_metrics=bleu)
    for path, setup in ((a, "test first 3 rows, greedy"), (b, "test all rows, greedy")):
        study = json.loads((path / "study.json").read_text())
        for run in study["runs"]:
            run["metric_setups"] = {"test/bleu": setup}
        (path / "study.json").write_text(json.dumps(study))
    with pytest.raises(
        InputError, match=r"evaluated 'test/bleu' otherwise \(A: test first 3 rows, greedy; B: test all"
    ):
        significance(a, b, metric="test/bleu")
    assert significance(a, b).metric == "final_val_loss"  # a metric measured alike is still tested


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        ("null-metrics", "run 'all-000' has no metrics mapping"),
        ("nan", "run 'all-000' gives final_val_loss nan, not a finite number"),
        ("no-summary", "its summary of 'all' lacks final_val_loss"),
        ("run-twice", "4 runs, 3 of them named apart, for --n 3 of 1 group(s)"),
        ("edited-value", "run 'all-000' gives final_val_loss 1.0, its summary of 'all' 5.1"),
        ("summary-cut", "its summary of 'all' holds 2 values of final_val_loss for 3 runs"),
    ],
)
def test_an_edited_study_json_that_does_not_hold_together_is_refused(
    edit: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run's metrics set to null, a NaN, a summary entry deleted, a run listed twice, a run's
    value edited and its summary's not, a summary cut short: exit 2 naming what, not a traceback or
    a verdict (before: TypeError, KeyError with -o, "p = nan" exit 0, a fourth run of an n=3 study
    accepted, and a verdict on the edited value while the report drew the summary's)."""
    a = write_study_dir(tmp_path / "a", [5.0, 5.02, 4.98])
    b = write_study_dir(tmp_path / "b", [5.1, 5.12, 5.08])
    study = json.loads((b / "study.json").read_text())
    if edit == "null-metrics":
        study["runs"][0]["metrics"] = None
    elif edit == "nan":
        study["runs"][0]["metrics"]["final_val_loss"] = float("nan")
    elif edit == "no-summary":
        del study["summary"]["all"]["final_val_loss"]
    elif edit == "edited-value":
        study["runs"][0]["metrics"]["final_val_loss"] = 1.0
    elif edit == "summary-cut":
        del study["summary"]["all"]["final_val_loss"]["values"][-1]
    else:
        study["runs"].append(study["runs"][0])
    (b / "study.json").write_text(json.dumps(study))  # json.dumps writes NaN as the literal NaN
    assert main(["significance", str(a), str(b), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert (
        "study.json does not hold together: " + needle in err and "fix: run the `reprotune seeds`" in err
    ), err
    assert not (tmp_path / "r.html").exists()


def test_other_data_is_a_difference_never_called_harmless(tmp_path: Path) -> None:
    """Two studies of one config whose runs trained on other data (the file edited in place):
    study.data.file_sha256 is listed as a difference that can change the numbers, and the note does
    not call them a config compared with itself. A study made before the data's hash was kept
    has none, so there its data path can change the numbers too; a study whose runs trained on
    different data says so."""
    a = write_study_dir(tmp_path / "a", [1.0, 1.1, 0.9])
    b = write_study_dir(tmp_path / "b", [1.0, 1.1, 0.9], data={"file_sha256": "e" * 64, "runs_agree": True})
    result = significance(a, b)
    (data,) = [d for d in result.differences if d["key"] == "study.data.file_sha256"]
    assert data["inert"] is False and (data["a"], data["b"]) == ("d" * 64, "e" * 64)
    assert any("their runs trained on different data" in n for n in result.notes)
    assert not any("compared with itself" in n for n in result.notes)

    other = {"data": {"path": "other.jsonl"}}
    old = write_study_dir(tmp_path / "old", [1.0, 1.1, 0.9], config={"seed": {"root": 1}, **other}, data={})
    (path,) = [d for d in significance(a, old).differences if d["key"] == "data.path"]
    assert path["inert"] is False
    hashed = write_study_dir(tmp_path / "hashed", [1.0, 1.1, 0.9], config={"seed": {"root": 1}, **other})
    (path,) = [d for d in significance(a, hashed).differences if d["key"] == "data.path"]
    assert path["inert"] is True  # the same data under another name: its hash is compared

    mixed = write_study_dir(
        tmp_path / "m", [1.0, 1.1, 0.9], data={"file_sha256": "d" * 64, "runs_agree": False}
    )
    assert any("study B's runs did not all train on the same data" in n for n in significance(a, mixed).notes)


def test_same_config_disjoint_seeds_within_noise(tmp_path: Path) -> None:
    """Studies whose values come from one distribution, through the files: within seed noise."""
    rng = np.random.default_rng(5)
    a = write_study_dir(tmp_path / "a", rng.normal(5, 0.1, 5).tolist())
    b = write_study_dir(tmp_path / "b", rng.normal(5, 0.1, 5).tolist(), config={"seed": {"root": 2}})
    result = significance(a, b)
    assert not result.test.beyond_noise
    assert [d["key"] for d in result.differences] == ["seed.root"]


def test_cli_verdict_and_differences(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 0 with a 'beyond' verdict first, the config key that differs listed, JSON on request."""
    a = write_study_dir(tmp_path / "a", [5.0, 5.02, 4.98, 5.01, 4.99])
    b = write_study_dir(
        tmp_path / "b", [4.9, 4.92, 4.88, 4.91, 4.89], config={"train": {"learning_rate": 0.002}}
    )
    assert main(["significance", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("B is lower than A by 0.1 (95% CI ")
    assert "beyond seed noise" in out.splitlines()[0]
    assert "  train.learning_rate: 0.0002 vs 0.002" in out
    assert main(["significance", str(a), str(b), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "reprotune/significance" and data["test"]["beyond_noise"] is True


def test_html_report(tmp_path: Path) -> None:
    """-o writes one self-contained HTML file: the verdict, a strip plot of both studies, no scripts."""
    a = write_study_dir(tmp_path / "a", [5.0, 5.02, 4.98])
    b = write_study_dir(tmp_path / "b", [5.01, 4.97, 5.0], config={"seed": {"root": 9}})
    out = tmp_path / "sig.html"
    assert main(["significance", str(a), str(b), "-o", str(out)]) == 0
    html = out.read_text(encoding="utf-8")
    assert "within seed noise" in html and html.count("<svg") == 1 and html.count("<circle") == 6
    assert "<script" not in html and "http://" not in html and "https://" not in html
    again = write_study_dir(tmp_path / "c", [4.0, 4.02, 3.98])
    assert main(["significance", str(a), str(again), "-o", str(out)]) == 0  # its own page: replaced
    assert "beyond seed noise" in out.read_text(encoding="utf-8")


def test_a_report_over_a_file_that_is_not_a_page_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-o onto an existing file that is not a page reprotune wrote (a config): exit 2, nothing printed but the
    error, the file keeps every byte."""
    a = write_study_dir(tmp_path / "a", [5.0, 5.02, 4.98])
    b = write_study_dir(tmp_path / "b", [5.01, 4.97, 5.0])
    out = tmp_path / "cfg.yaml"
    out.write_text("seed: {root: 1}\n", encoding="utf-8")
    assert main(["significance", str(a), str(b), "-o", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "exists and is not a page reprotune wrote" in captured.err, captured
    assert out.read_text(encoding="utf-8") == "seed: {root: 1}\n"


def test_a_report_inside_another_study_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-o L/report.html, L another study: its own report was silently replaced (exit 0)."""
    a = write_study_dir(tmp_path / "a", [5.0, 5.02, 4.98])
    b = write_study_dir(tmp_path / "b", [5.01, 4.97, 5.0])
    other = write_study_dir(tmp_path / "other", [5.0, 5.1, 4.9])
    (other / "report.html").write_text("its own report", encoding="utf-8")
    assert main(["significance", str(a), str(b), "-o", str(other / "report.html")]) == 2
    assert f"is inside the study directory {other}, whose files belong to it" in capsys.readouterr().err
    assert (other / "report.html").read_text(encoding="utf-8") == "its own report"


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("metrics", "the studies measured different metrics"),
        ("model", "different base models"),
        ("each", "is a --vary each study"),
        ("unfinished", "is not complete"),
        ("metric", "no metric 'val_loss'"),
        ("alpha", "alpha must be in (0, 0.5]"),
        ("seed", "the permutation test's seed must be an integer in [0, 2**63) (got -1)"),
        ("missing", "does not exist"),
        ("one-run", "has 1 run(s); a spread needs at least 2"),
    ],
    ids=lambda v: str(v)[:12],
)
def test_bad_input_exits_2(
    case: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each kind of bad input: exit 2 and a message naming it and the fix."""
    a = write_study_dir(tmp_path / "a", [1.0, 1.1, 0.9])
    extra: list[str] = []
    if case == "metrics":  # a metric B measured and A did not
        b = write_study_dir(tmp_path / "b", [1.0, 1.1, 0.9], extra_metrics={"test/bleu": [1.0, 2.0, 3.0]})
        extra = ["--metric", "test/bleu"]
    elif case == "model":
        b = write_study_dir(tmp_path / "b", [1.0, 1.1, 0.9], base_model={**MODEL, "weights_sha256": "c" * 64})
    elif case == "each":
        b = write_study_dir(
            tmp_path / "b",
            {"data_order": [1.0, 1.1], "lora_init": [1.0, 1.2], "split": [1.0, 0.9], "dropout": [1.0, 1.0]},
            vary="each",
        )
    elif case == "unfinished":
        b = write_study_dir(tmp_path / "b", [1.0, 1.1, 0.9], status="running")
    elif case == "one-run":  # a study.json cut by hand to one run
        b = write_study_dir(tmp_path / "b", [1.0, 1.1, 0.9])
        study = json.loads((b / "study.json").read_text(encoding="utf-8"))
        (b / "study.json").write_text(json.dumps({**study, "runs": study["runs"][:1]}), encoding="utf-8")
    else:
        b = write_study_dir(tmp_path / "b", [1.0, 1.1, 0.9])
        extra = {
            "metric": ["--metric", "val_loss"],
            "alpha": ["--alpha", "0.9"],
            "seed": ["--seed", "-1"],
        }.get(case, [])
        if case == "missing":
            b = tmp_path / "nowhere"
    assert main(["significance", str(a), str(b), *extra]) == 2
    err = capsys.readouterr().err
    assert needle in err and "fix:" in err


def test_different_base_models_allowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With --allow, studies of different base models are compared and the model hash listed."""
    a = write_study_dir(tmp_path / "a", [1.0, 1.1, 0.9])
    b = write_study_dir(tmp_path / "b", [1.0, 1.1, 0.9], base_model={**MODEL, "weights_sha256": "c" * 64})
    assert main(["significance", str(a), str(b), "--allow"]) == 0
    assert f"base_model.weights_sha256: {'a' * 64} vs {'c' * 64}" in capsys.readouterr().out


def test_a_study_whose_runs_started_from_different_models_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Study B's runs did not all start from the same model files (base_model.runs_agree false):
    exit 2 naming it, as for two studies of different models (before, its first run's model was
    compared and nothing was said); with --allow, a verdict and a note. Whether its runs agree is
    no difference between the studies."""
    a = write_study_dir(tmp_path / "a", [1.0, 1.1, 0.9])
    b = write_study_dir(tmp_path / "b", [1.0, 1.1, 0.9], base_model={**MODEL, "runs_agree": False})
    assert main(["significance", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert f"STUDY_B {b}: its runs did not all start from the same base model files" in err
    assert "fix: make the study again in a new --out, every run from one model; or pass --allow" in err
    assert main(["significance", str(a), str(b), "--allow"]) == 0
    out = capsys.readouterr().out
    assert (
        "note: study B's runs did not all start from the same base model files (the model changed "
        "while it was made): its spread mixes models with seed noise" in out
    )
    assert "runs_agree" not in out and "Nothing differs between the studies' configs" in out


def test_a_study_with_no_metric_is_refused_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A study none of whose metrics every run measured (metrics: []): exit 2 saying so, with the
    study's notes on why (before: "fix: choose one of " and nothing after it)."""
    a = write_study_dir(tmp_path / "a", [1.0, 1.1, 0.9])
    b = write_study_dir(tmp_path / "b", [1.0, 1.1, 0.9])
    study = json.loads((b / "study.json").read_text(encoding="utf-8"))
    for run in study["runs"]:
        run["metrics"] = {}
    notes = [f"{run['name']}: no final validation loss in its record" for run in study["runs"]]
    study.update(metrics=[], summary={"all": {}}, metric_notes=notes)
    (b / "study.json").write_text(json.dumps(study), encoding="utf-8")
    assert main(["significance", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert (
        f"STUDY_B {b} has no metric that every run measured, so nothing to test (its metric notes: "
        "all-000: no final validation loss in its record; all-001: no final validation loss in its "
        "record; all-002: no final validation loss in its record)" in err
    ), err
    assert "choose one of" not in err and "fix: have every run measured alike" in err


def test_the_same_model_written_another_way_is_not_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Studies whose base model has the same hashes but another spelling of its source are
    compared (no --allow); the source is listed as a difference that cannot change the numbers."""
    a = write_study_dir(tmp_path / "a", [1.0, 1.1, 0.9])
    b = write_study_dir(tmp_path / "b", [1.0, 1.1, 0.9], base_model={**MODEL, "source": "./models/elsewhere"})
    assert main(["significance", str(a), str(b)]) == 0
    assert "./models/elsewhere (cannot change the numbers)" in capsys.readouterr().out


def test_significance_never_imports_torch(tmp_path: Path) -> None:
    """The command needs no model: it answers without importing torch."""
    a = write_study_dir(tmp_path / "a", [1.0, 1.1, 0.9])
    b = write_study_dir(tmp_path / "b", [1.2, 1.3, 1.1])
    code = (
        "import sys; from reprotune._cli import main; "
        f"rc = main(['significance', {str(a)!r}, {str(b)!r}, '-o', {str(tmp_path / 'r.html')!r}]); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("where", ["unwritable", "study-file"])
def test_a_report_that_cannot_be_written_is_the_only_output(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-o under a file (no directory can be made there), or onto a study's own study.json: exit 2
    with the error alone (the verdict was printed first, then the error), the study untouched."""
    a = write_study_dir(tmp_path / "a", [5.0, 5.02, 4.98])
    b = write_study_dir(tmp_path / "b", [5.01, 4.97, 5.0])
    if where == "unwritable":
        (tmp_path / "notes.txt").write_text("mine", encoding="utf-8")
        out = tmp_path / "notes.txt" / "sig.html"
    else:
        out = b / "study.json"
    before = (b / "study.json").read_bytes()
    assert main(["significance", str(a), str(b), "-o", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "fix:" in captured.err
    assert (b / "study.json").read_bytes() == before


def test_an_empty_mapping_beside_its_keys_is_no_study_difference() -> None:
    """``seed.overrides: {}`` against ``seed.overrides.dropout: 3``: one difference, the key."""
    a = {"config": {"seed": {"root": 1, "overrides": {}}}, "vary": "all", "base_model": MODEL}
    b = {"config": {"seed": {"root": 1, "overrides": {"dropout": 3}}}, "vary": "all", "base_model": MODEL}
    assert [d["key"] for d in study_differences(a, b)] == ["seed.overrides.dropout"]


def test_one_study_given_twice_is_said_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A study given as A and B (its directory and its study.json), or a copy of it: the verdict
    stands (no difference) and a note says that a config was compared with itself."""
    a = write_study_dir(tmp_path / "a", [5.0, 5.02, 4.98])
    assert main(["significance", str(a), str(a / "study.json")]) == 0
    out = capsys.readouterr().out
    assert "within seed noise" in out.splitlines()[0]
    assert "note: A and B are one study given twice (study " in out
    assert "Nothing differs between the studies' configs, not even their seeds." in out
    shutil.copytree(a, tmp_path / "copy")
    assert main(["significance", str(a), str(tmp_path / "copy")]) == 0
    assert "note: A and B are two studies of one config and seeds" in capsys.readouterr().out
    renamed = json.loads((tmp_path / "copy" / "study.json").read_text())  # the config copied to other.yaml
    renamed["study_id"] = renamed["study_id"].replace("synthetic-", "other-name-", 1)
    (tmp_path / "copy" / "study.json").write_text(json.dumps(renamed))
    assert main(["significance", str(a), str(tmp_path / "copy")]) == 0
    out = capsys.readouterr().out
    assert "note: A and B are two studies of one config and seeds" in out and "not even their seeds" in out
    other = write_study_dir(tmp_path / "b", [5.01, 4.97, 5.0], config={"seed": {"root": 9}})
    assert main(["significance", str(a), str(other)]) == 0
    assert "A and B are" not in capsys.readouterr().out


def test_a_folder_of_studies_is_answered_with_the_studies_in_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """significance A studies/ (the folder that holds the studies): exit 2, the fix names them."""
    a = write_study_dir(tmp_path / "studies" / "lr-low", [5.0, 5.02, 4.98])
    write_study_dir(tmp_path / "studies" / "lr-high", [5.01, 4.97, 5.0])
    assert main(["significance", str(a), str(tmp_path / "studies")]) == 2
    err = capsys.readouterr().err
    assert f"fix: pass one of the studies in {tmp_path / 'studies'}: lr-high, lr-low" in err
