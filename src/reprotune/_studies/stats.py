"""Summaries of a study's values: mean, spread, a bootstrap interval of the mean, variance shares.

The 95 % interval of the mean is SciPy's bootstrap (``scipy.stats.bootstrap``, BCa, 9,999
resamples) drawing from ``numpy.random.Generator(PCG64(seed))`` with a seed the study records.
When every value is equal there is nothing to resample: the interval is the value itself. When
BCa cannot be computed (a degenerate sample), the percentile bootstrap with the same seed is used
and named. With few runs (under about 10) a bootstrap interval of the mean is too narrow; read
it as a description of the runs, and use ``significance`` to judge a difference.

Variance shares (``--vary each``): each source's sample variance (ddof 1, over the runs where only
that seed moved) divided by the sum over the sources. This reads the sources as independent and
additive; with few runs per source each variance is itself uncertain.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

BOOTSTRAP_RESAMPLES: Final = 9999
CONFIDENCE: Final = 0.95
BOOTSTRAP_METHOD: Final = "BCa"


def mean_and_std(data: np.ndarray) -> tuple[float, float | None]:
    """The mean and standard deviation (ddof 1; None for one value) of ``data``; for values that
    are all equal, exactly the value and 0 (NumPy's sum of them can round: a mean below the
    minimum, a spread of 1e-16 that a test would read as noise)."""
    if np.all(data == data[0]):
        return float(data[0]), 0.0 if data.size >= 2 else None
    return float(np.mean(data)), float(np.std(data, ddof=1)) if data.size >= 2 else None


def describe(values: Sequence[float], *, seed: int) -> dict[str, Any]:
    """n, the values, mean, standard deviation (ddof 1), min, max and a bootstrap 95 % interval.

    Args:
        values: one value per run (at least one).
        seed: the bootstrap's seed (recorded by the caller).

    Returns:
        ``{"n", "values", "mean", "std", "min", "max", "ci_low", "ci_high", "ci_method"}``; ``std``
        and the interval are None for a single value.
    """
    data = np.asarray(values, dtype=np.float64)
    n = int(data.size)
    low, high, method = _bootstrap_mean(data, seed) if n >= 2 else (None, None, None)
    mean, std = mean_and_std(data)
    return {
        "n": n,
        "values": [float(v) for v in data],
        "mean": mean,
        "std": std,
        "min": float(np.min(data)),
        "max": float(np.max(data)),
        "ci_low": low,
        "ci_high": high,
        "ci_method": method,
    }


def _bootstrap_mean(data: np.ndarray, seed: int) -> tuple[float, float, str]:
    """The bootstrap 95 % interval of the mean of ``data``, and the method that gave it."""
    from scipy import stats

    if np.all(data == data[0]):
        return float(data[0]), float(data[0]), "none: every value is equal"
    for method in (BOOTSTRAP_METHOD, "percentile"):
        with warnings.catch_warnings():
            # Tiny samples make SciPy warn (degenerate BCa, precision loss); the result says so.
            warnings.simplefilter("ignore")
            result = stats.bootstrap(
                (data,),
                np.mean,
                n_resamples=BOOTSTRAP_RESAMPLES,
                confidence_level=CONFIDENCE,
                method=method,
                rng=np.random.default_rng(seed),
            )
        low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
        if np.isfinite(low) and np.isfinite(high):
            return low, high, method
    raise AssertionError("the percentile bootstrap of a non-constant finite sample is finite")


def variance_shares(groups: Mapping[str, Sequence[float]]) -> dict[str, dict[str, float | None]]:
    """Each group's sample variance (ddof 1) and its share of the sum over the groups.

    Args:
        groups: source of randomness -> the values of the runs where only that seed moved.

    Returns:
        ``{source: {"variance": v, "share": v / sum}}``; shares are None when every variance is 0.
    """
    variances = {name: sample_variance(np.asarray(v, dtype=np.float64)) for name, v in groups.items()}
    total = sum(variances.values())
    return {
        name: {"variance": var, "share": (var / total) if total > 0 else None}
        for name, var in variances.items()
    }


def sample_variance(data: np.ndarray) -> float:
    """The sample variance (ddof 1): exactly 0 for values that are all equal (see :func:`mean_and_std`)."""
    return 0.0 if np.all(data == data[0]) else float(np.var(data, ddof=1))


def shares_line(shares: Mapping[str, Mapping[str, float | None]]) -> str:
    """``data order: 61%, LoRA init: 30%, dropout: 9%``, largest first."""
    known = [(name, s["share"]) for name, s in shares.items() if s["share"] is not None]
    if not known:
        return "no source moves it (every variance is 0)"
    ordered = sorted(known, key=lambda item: (-float(item[1] or 0.0), item[0]))
    return ", ".join(f"{source_label(name)}: {float(share or 0.0):.0%}" for name, share in ordered)


_LABELS: Final = {
    "split": "split",
    "data_order": "data order",
    "lora_init": "LoRA init",
    "dropout": "dropout",
    "all": "all seeds",
}


def source_label(name: str) -> str:
    """A source of randomness as people write it (``data_order`` -> ``data order``)."""
    return _LABELS.get(name, name)
