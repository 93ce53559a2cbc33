"""``welch_power``'s speed: the same numbers as the quadrature it replaced, for less work."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from scipy import special, stats

from reprotune._studies.twosample import welch_power


def reference_welch_power(d: float, n: int, alpha: float, *, variance_ratio: float = 1.0) -> float:
    """``welch_power`` as it was (2 ms a call): Legendre nodes computed and ``stdtrit`` evaluated
    at every one of the 48 x 48 quadrature points, each call."""
    ratio = min(max(variance_ratio, 0.0), 1.0)
    nodes, weights = np.polynomial.legendre.leggauss(48)
    k = n - 1
    scaled = stats.chi2.ppf((nodes + 1) / 2, k) / k
    var_a, var_b = scaled[:, None], ratio * scaled[None, :]
    shift = abs(d) * math.sqrt((1 + ratio) / 2)
    spread = math.sqrt((1 + ratio) / n)
    df = (var_a + var_b) ** 2 * k / (var_a**2 + var_b**2)
    margin = special.stdtrit(df, 1 - alpha / 2) * np.sqrt((var_a + var_b) / n)
    found = special.ndtr((shift - margin) / spread) + special.ndtr((-shift - margin) / spread)
    return float(np.einsum("i,j,ij->", weights / 2, weights / 2, found))


GRID = list(
    itertools.product(
        [0.0, 0.3, 1.0, 2.5, 8.61, 40.0],  # d
        [2, 3, 5, 17, 64, 10**5, 10**7],  # n per side
        [1e-10, 0.001, 0.05, 0.5],  # alpha, over the range significance takes: (0, 0.5]
        [0.0, 0.27, 1.0],  # variance ratio
    )
)


def test_welch_power_is_the_quadrature_it_was() -> None:
    """Over d, n (2 to 10**7), alpha (1e-10 to 0.5) and variance ratio: within 1e-9 of the
    quadrature with SciPy's t quantile at every point (the interpolated quantile is within 2e-13)."""
    gap = {
        (d, n, alpha, r): abs(
            welch_power(d, n, alpha, variance_ratio=r) - reference_welch_power(d, n, alpha, variance_ratio=r)
        )
        for d, n, alpha, r in GRID
    }
    worst = max(gap, key=gap.__getitem__)
    assert gap[worst] <= 1e-9, (worst, gap[worst])


@pytest.mark.parametrize(
    ("n", "alpha"), [(1, 0.05), (5, 0.0), (5, 1.0), (5, 1.5)], ids=["n1", "a0", "a1", "a1.5"]
)
def test_welch_power_outside_its_domain_is_what_it_was(n: int, alpha: float) -> None:
    """Where the t quantile has no logarithm (alpha 0, 1 or more) or there is no spread of df
    (n = 1): the same number as before (NaN for n = 1), not an error."""
    got, want = (
        welch_power(2.0, n, alpha, variance_ratio=0.5),
        reference_welch_power(2.0, n, alpha, variance_ratio=0.5),
    )
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=1e-12)


def _counting(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, size: Callable[..., int]) -> list[int]:
    """Record ``size(*args)`` for each call of ``owner.name``."""
    seen: list[int] = []
    real = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        seen.append(size(*args))
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return seen


def test_welch_power_does_its_costly_work_once_per_n_and_alpha(monkeypatch: pytest.MonkeyPatch) -> None:
    """The t quantile at 21 degrees of freedom per (n, alpha), not at each of the 2,304 quadrature
    points every call (two thirds of its 2 ms), and the Legendre nodes once (a third): 20 calls
    at 2 values of n evaluate no more than 42 quantiles, and make no nodes after the first."""
    quantiles = _counting(monkeypatch, special, "stdtrit", lambda df, q: int(np.size(df)))
    legendre = _counting(monkeypatch, np.polynomial.legendre, "leggauss", lambda deg: 1)
    for d in np.linspace(0.5, 2.0, 10):
        for n in (7, 8):
            welch_power(float(d), n, 0.0123, variance_ratio=0.4)
    assert sum(quantiles) <= 2 * 21, sum(quantiles)
    assert sum(legendre) <= 1, legendre
