"""The test of two samples of one metric: are they apart beyond seed noise? All from SciPy.

- Welch's t-test (``scipy.stats.ttest_ind(equal_var=False)``): the verdict's test. It assumes each
  sample is roughly normal, not that their variances are equal. Its confidence interval (level
  ``1 - alpha``) is the one the verdict gives for the difference of means.
- A permutation test of the difference of means (``scipy.stats.permutation_test``): no normality
  assumption; exact when there are at most 9,999 arrangements, else 9,999 resamples from a
  recorded seed. With few seeds it cannot reach a small p (3 seeds each: never below 0.1), so it
  is reported beside the verdict, which says when the two disagree.
- Effect size: Cohen's d (difference of means over the pooled standard deviation), and the seeds
  per side the verdict's test (Welch's, two-sided, at ``alpha``) needs to detect that d with 80 %
  power, with the two studies' variances in the ratio they show (:func:`welch_power`: the test's
  power integrated over the sample variances, whose degrees of freedom the test estimates from
  them; equal variances give the textbook Student values).

Never imports torch.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.polynomial import Chebyshev

from reprotune._studies.stats import mean_and_std, sample_variance

PERMUTATION_RESAMPLES: Final = 9999
POWER: Final = 0.8
MAX_SEEDS: Final = 10**7


@dataclass(frozen=True)
class TestResult:
    """Two samples compared; ``difference`` and its interval are ``mean(B) - mean(A)``."""

    alpha: float
    n_a: int
    n_b: int
    mean_a: float
    mean_b: float
    std_a: float
    std_b: float
    difference: float
    ci_low: float
    ci_high: float
    welch_t: float | None
    welch_df: float | None
    welch_p: float | None
    """None with no spread in either study: no test ran (the difference is exact)."""
    permutation_p: float
    permutation_exact: bool
    permutation_resamples: int
    permutation_seed: int
    permutation_smallest_p: float
    cohens_d: float | None
    seeds_for_power: int | None
    beyond_noise: bool
    note: str | None


def compare_samples(
    a: Sequence[float], b: Sequence[float], *, alpha: float = 0.05, seed: int = 0
) -> TestResult:
    """Welch's t-test, a permutation test, effect size and power for samples ``a`` and ``b``.

    Args:
        a: study A's values (at least 2).
        b: study B's values (at least 2).
        alpha: the significance level; the interval's level is ``1 - alpha``.
        seed: the permutation test's seed (used only when it resamples instead of enumerating).

    Returns:
        The result; ``beyond_noise`` is Welch's ``p < alpha``.
    """
    from scipy import stats

    xa, xb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    (mean_a, sa), (mean_b, sb) = ((m, s or 0.0) for m, s in map(mean_and_std, (xa, xb)))
    diff = mean_b - mean_a
    note = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nearly equal values make SciPy warn; handled below
        if sa == 0 and sb == 0:
            # No seed moves the metric in either study: the difference is exact, not an estimate.
            t_value, df, p = None, None, None
            low = high = diff
            note = "the metric is the same in every run of each study: no seed noise to test against"
        else:
            welch = stats.ttest_ind(xb, xa, equal_var=False)
            interval = welch.confidence_interval(confidence_level=1 - alpha)
            t_value, df, p = float(welch.statistic), float(welch.df), float(welch.pvalue)
            low, high = float(interval.low), float(interval.high)
        perm = stats.permutation_test(
            (xb, xa),
            _mean_difference,
            permutation_type="independent",
            vectorized=True,
            n_resamples=PERMUTATION_RESAMPLES,
            alternative="two-sided",
            rng=np.random.default_rng(seed),
        )
    arrangements = math.comb(xa.size + xb.size, xa.size)
    d = _cohens_d(xa, xb, diff)
    return TestResult(
        alpha=alpha,
        n_a=int(xa.size),
        n_b=int(xb.size),
        mean_a=mean_a,
        mean_b=mean_b,
        std_a=sa,
        std_b=sb,
        difference=diff,
        ci_low=low,
        ci_high=high,
        welch_t=t_value,
        welch_df=df,
        welch_p=p,
        permutation_p=float(perm.pvalue),
        permutation_exact=arrangements <= PERMUTATION_RESAMPLES,
        permutation_resamples=min(arrangements, PERMUTATION_RESAMPLES),
        permutation_seed=seed,
        # two-sided: twice the one-sided floor, 1/arrangements exact, 1/(resamples + 1) resampled
        permutation_smallest_p=min(1.0, 2 / min(arrangements, PERMUTATION_RESAMPLES + 1)),
        cohens_d=d,
        seeds_for_power=(
            seeds_for_power(d, alpha, variance_ratio=min(sa, sb) ** 2 / max(sa, sb) ** 2)
            if d is not None
            else None
        ),
        beyond_noise=diff != 0 if p is None else p < alpha,  # no spread: any difference is real
        note=note,
    )


def _mean_difference(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
    return np.asarray(np.mean(x, axis=axis) - np.mean(y, axis=axis))


def _cohens_d(xa: np.ndarray, xb: np.ndarray, diff: float) -> float | None:
    """``diff`` (mean B - mean A) / pooled standard deviation; None when that deviation is 0."""
    na, nb = xa.size, xb.size
    pooled = math.sqrt(((na - 1) * sample_variance(xa) + (nb - 1) * sample_variance(xb)) / (na + nb - 2))
    return diff / pooled if pooled > 0 else None


def seeds_for_power(
    d: float, alpha: float, power: float = POWER, *, variance_ratio: float = 1.0
) -> int | None:
    """The smallest n per side at which Welch's two-sided test at ``alpha`` detects an effect of
    Cohen's d ``d`` with probability ``power`` (:func:`welch_power`); None for d = 0 or beyond 10**7.

    ``variance_ratio``: the smaller variance over the larger, in [0, 1].
    """
    if d == 0 or not math.isfinite(d):
        return None
    from scipy import stats

    # The normal approximation is within a seed or two of the t-test's answer: start there and
    # step to the first n whose power reaches the target (power grows with n).
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    n = max(2, math.ceil(2 * (z / abs(d)) ** 2))
    if n > MAX_SEEDS:
        return None
    while n > 2 and welch_power(d, n - 1, alpha, variance_ratio=variance_ratio) >= power:
        n -= 1
    while welch_power(d, n, alpha, variance_ratio=variance_ratio) < power:
        n += 1
    return int(n)


#: Gauss-Legendre nodes per sample variance in :func:`welch_power`. Against 300 nodes, 48 are
#: within 1e-4 wherever the power is between 0.6 and 0.95 (where :func:`seeds_for_power` decides),
#: and within 1e-3 anywhere (a few seeds, a large effect at alpha 0.001, power under 0.1); 32 were
#: off by 1e-3 near 0.8.
_NODES: Final = 48
#: Degree of the interpolant of log t in 1/df (:func:`_t_quantiles`). Against SciPy's ``stdtrit``
#: at every df, 20 is within 2e-13 (relative) for 1 to 10**7 degrees of freedom and alpha from
#: 1e-14 to 0.5; 16 was within 4e-13, 28 no closer (rounding).
_T_DEGREE: Final = 20


def welch_power(d: float, n: int, alpha: float, *, variance_ratio: float = 1.0) -> float:
    """The probability that Welch's two-sided test at ``alpha``, with ``n`` values per side, finds
    an effect of Cohen's d ``d`` when the variances are in ``variance_ratio`` (smaller over larger).

    Exact up to quadrature, for every n >= 2. The test estimates its degrees of freedom from the
    sample variances; at few seeds they are far below the value the population variances give
    (Welch-Satterthwaite), so a noncentral t at that value overstates the power: d = 8.61, ratio
    0.27, n = 2 passed for 80 %, where the test's power is 0.68. Given both sample variances the
    difference of means is normal and independent of them, so the power is an integral of two
    normal tails over the two variances' scaled chi-square distributions (with n - 1 degrees of
    freedom each), taken by Gauss-Legendre quadrature in their quantiles.
    """
    from scipy import special

    ratio = min(max(variance_ratio, 0.0), 1.0)
    k = n - 1
    weights = _legendre()[1]
    scaled = _scaled_variances(k)  # a sample variance over its population's, at each node
    var_a, var_b = scaled[:, None], ratio * scaled[None, :]
    shift = abs(d) * math.sqrt((1 + ratio) / 2)  # d times the pooled deviation (variances 1, ratio)
    spread = math.sqrt((1 + ratio) / n)  # the difference of means' deviation
    df = (var_a + var_b) ** 2 * k / (var_a**2 + var_b**2)
    margin = _t_quantiles(df, k, alpha) * np.sqrt((var_a + var_b) / n)
    found = special.ndtr((shift - margin) / spread) + special.ndtr((-shift - margin) / spread)
    return float(np.einsum("i,j,ij->", weights / 2, weights / 2, found))


@functools.cache
def _legendre() -> tuple[np.ndarray, np.ndarray]:
    """The Gauss-Legendre nodes and weights on [-1, 1] (computing them took a third of a call),
    read-only."""
    nodes, weights = np.polynomial.legendre.leggauss(_NODES)
    nodes.flags.writeable = weights.flags.writeable = False
    return nodes, weights


@functools.lru_cache(maxsize=512)
def _scaled_variances(k: int) -> np.ndarray:
    """The chi-square quantiles with ``k`` degrees of freedom over ``k`` at the Legendre nodes
    (read-only: one array serves every call with that ``k``)."""
    from scipy import stats

    scaled = np.asarray(stats.chi2.ppf((_legendre()[0] + 1) / 2, k) / k)
    scaled.flags.writeable = False
    return scaled


def _t_quantiles(df: np.ndarray, k: int, alpha: float) -> np.ndarray:
    """``scipy.special.stdtrit(df, 1 - alpha / 2)`` for Welch's degrees of freedom ``df`` of two
    samples of ``k + 1`` values, each in [k, 2k]: interpolated (within 2e-13, relative).

    ``stdtrit`` at each of the 48 x 48 quadrature points was two thirds of a call; the quantile
    is a smooth function of the one variable df, and its logarithm a polynomial in 1/df of
    degree :data:`_T_DEGREE` to rounding over [k, 2k].
    """
    from scipy import special

    if k < 1 or not 0 < alpha < 1:  # no [k, 2k], or a quantile with no logarithm (0, inf, < 0)
        return np.asarray(special.stdtrit(df, 1 - alpha / 2))
    return np.asarray(np.exp(_log_t_interpolant(k, 1 - alpha / 2)(1 / df)))


@functools.lru_cache(maxsize=512)
def _log_t_interpolant(k: int, q: float) -> Chebyshev:
    """log ``stdtrit(df, q)`` as a Chebyshev interpolant in 1/df over df in [k, 2k]."""
    from scipy import special

    return Chebyshev.interpolate(
        lambda u: np.log(special.stdtrit(1 / u, q)), _T_DEGREE, domain=[1 / (2 * k), 1 / k]
    )


def percent(level: float) -> str:
    """A confidence level as people write it: ``95%``, ``99.9%`` (``:.0%`` made 0.999 "100%")."""
    return f"{level * 100:.6g}%"


def verdict_line(result: TestResult) -> str:
    """``B is lower than A by 0.12 (95% CI 0.07..0.17), beyond seed noise (p = 0.002, 5 seeds each)``."""
    r = result
    level = percent(1 - r.alpha)
    if r.difference < 0:
        head, low, high = f"B is lower than A by {_g(-r.difference)}", -r.ci_high, -r.ci_low
    elif r.difference > 0:
        head, low, high = f"B is higher than A by {_g(r.difference)}", r.ci_low, r.ci_high
    else:
        head, low, high = "B equals A on average", r.ci_low, r.ci_high
    seeds = f"{r.n_a} seeds each" if r.n_a == r.n_b else f"{r.n_a} and {r.n_b} seeds"
    where = "beyond seed noise" if r.beyond_noise else "within seed noise"
    if r.welch_t is None:  # no spread in either study: the difference is exact, there is no test
        head = head.replace(" on average", "")
        same = "every run of each gives the same value"
        return f"{head} exactly: no seed noise in either study, {same} ({seeds})"
    p = p_value(r.welch_p or 0.0, r.alpha)
    return f"{head} ({level} CI {_g(low)}..{_g(high)}), {where} (p = {p}, {seeds})"


def p_value(p: float, alpha: float, digits: int = 2) -> str:
    """``p`` in ``digits`` significant digits, or as many more as tell it from ``alpha`` (0.0496
    and 0.0504 both read "0.05" at alpha 0.05, one beyond seed noise and one within)."""
    shown = f"{p:.{digits}g}"
    while p != alpha and float(shown) == alpha and digits < 17:
        digits += 1
        shown = f"{p:.{digits}g}"
    return shown


def _g(value: float) -> str:
    return f"{value:.3g}"
