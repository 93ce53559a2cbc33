"""Summaries of a study's values: exact descriptive numbers, a seeded bootstrap, variance shares."""

from __future__ import annotations

import numpy as np
import pytest

from reprotune._studies.stats import describe, shares_line, variance_shares


def test_describe_numbers() -> None:
    """n, mean, sd (ddof 1), min and max are NumPy's for the same values, exactly."""
    values = [5.25, 5.5, 5.125, 5.375, 5.0]
    d = describe(values, seed=7)
    assert d["n"] == 5 and d["values"] == values
    assert d["mean"] == float(np.mean(values))
    assert d["std"] == float(np.std(values, ddof=1))
    assert (d["min"], d["max"]) == (5.0, 5.5)
    assert d["ci_low"] < d["mean"] < d["ci_high"]
    assert d["ci_method"] == "BCa"


def test_bootstrap_is_seeded() -> None:
    """The same seed gives a bitwise-equal interval; another seed draws other resamples."""
    values = [0.91, 1.07, 1.02, 0.96, 1.13, 0.88, 1.01]
    a, b, c = describe(values, seed=3), describe(values, seed=3), describe(values, seed=4)
    assert (a["ci_low"], a["ci_high"]) == (b["ci_low"], b["ci_high"])
    assert (a["ci_low"], a["ci_high"]) != (c["ci_low"], c["ci_high"])


def test_equal_values_have_a_point_interval() -> None:
    """When no seed moves the value, the interval is the value itself, and says why."""
    d = describe([2.5, 2.5, 2.5], seed=0)
    assert (d["ci_low"], d["ci_high"], d["std"]) == (2.5, 2.5, 0.0)
    assert d["ci_method"] == "none: every value is equal"


def test_equal_values_whose_sum_rounds_are_described_exactly() -> None:
    """Three copies of a value whose sum rounds: the mean is the value (it was below the minimum),
    the sd 0, and a source whose runs all give it moves nothing."""
    x = float.fromhex("0x1.601d72e52e52ep+2")
    d = describe([x] * 3, seed=0)
    assert (d["mean"], d["std"], d["min"]) == (x, 0.0, x)
    assert shares_line(variance_shares({"data_order": [x] * 3, "dropout": [x] * 3})).startswith("no source")


def test_variance_shares() -> None:
    """Each source's sample variance over the sum: exact for simple numbers; shares sum to 1."""
    shares = variance_shares({"data_order": [0.0, 2.0], "lora_init": [0.0, 1.0], "dropout": [1.0, 1.0]})
    assert shares["data_order"] == {"variance": 2.0, "share": 0.8}
    assert shares["lora_init"] == {"variance": 0.5, "share": 0.2}
    assert shares["dropout"] == {"variance": 0.0, "share": 0.0}
    assert shares_line(shares) == "data order: 80%, LoRA init: 20%, dropout: 0%"


def test_no_variance_anywhere() -> None:
    """Shares are undefined (None) when no source moves the value, and the line says so."""
    shares = variance_shares({"data_order": [1.0, 1.0], "dropout": [1.0, 1.0]})
    assert shares["data_order"]["share"] is None
    assert shares_line(shares) == "no source moves it (every variance is 0)"


@pytest.mark.parametrize("n", [2, 3], ids=["two", "three"])
def test_tiny_samples_still_get_a_finite_interval(n: int) -> None:
    """Two or three runs: BCa or, when it cannot be computed, the percentile bootstrap, finite."""
    d = describe([1.0, 1.5, 1.25][:n], seed=0)
    assert np.isfinite(d["ci_low"]) and np.isfinite(d["ci_high"])
    assert d["ci_method"] in ("BCa", "percentile")
