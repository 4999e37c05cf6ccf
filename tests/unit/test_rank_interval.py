"""Spearman with an interval, against scipy: rho, the Fisher-z interval, and the bootstrap recomputed
resample by resample with scipy.stats.spearmanr."""

import math
import warnings

import numpy as np
import pytest
from scipy.stats import norm, spearmanr

from raygeom.numerics.rank_interval import spearman_with_ci


def _scipy_bootstrap(x, y, n_boot, seed, level):
    draws = np.random.default_rng([seed, 0x5BEA]).integers(0, len(x), size=(n_boot, len(x)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rhos = np.array([spearmanr(x[d], y[d])[0] for d in draws])
    rhos = rhos[np.isfinite(rhos)]
    return np.quantile(rhos, [(1 - level) / 2, (1 + level) / 2]), rhos.size


@pytest.mark.parametrize("n,noise,ties", [(17, 0.5, False), (12, 2.0, True), (30, 0.1, False)])
def test_matches_scipy(n, noise, ties):
    rng = np.random.default_rng(n)
    x = rng.normal(size=n)
    y = x + noise * rng.normal(size=n)
    if ties:
        x = np.round(x * 2) / 2  # planted ties
    result = spearman_with_ci(x, y, level=0.9, n_boot=500, seed=3)
    expected = spearmanr(x, y)[0]
    assert result.rho == pytest.approx(expected, abs=1e-12)
    half = norm.ppf(0.95) * math.sqrt(1.06 / (n - 3))
    assert result.fisher_lo == pytest.approx(math.tanh(math.atanh(expected) - half), abs=1e-12)
    assert result.fisher_hi == pytest.approx(math.tanh(math.atanh(expected) + half), abs=1e-12)
    (lo, hi), kept = _scipy_bootstrap(x, y, 500, 3, 0.9)
    assert (result.boot_lo, result.boot_hi, result.n_boot) == (pytest.approx(lo, abs=1e-12), pytest.approx(hi, abs=1e-12), kept)


def test_planted_order_and_its_reverse():
    x = np.arange(15.0)
    up, down = spearman_with_ci(x, x ** 3), spearman_with_ci(x, -np.exp(x))
    assert up.rho == pytest.approx(1.0) and up.fisher_lo > 0.9 and up.boot_lo > 0.9
    assert down.rho == pytest.approx(-1.0) and down.fisher_hi < -0.9 and down.boot_hi < -0.9


def test_unrelated_values_give_an_interval_around_zero():
    rng = np.random.default_rng(7)
    result = spearman_with_ci(rng.normal(size=40), rng.normal(size=40))
    assert result.fisher_lo < 0 < result.fisher_hi and result.boot_lo < 0 < result.boot_hi


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="at least 4"):
        spearman_with_ci([1, 2, 3], [3, 2, 1])
    with pytest.raises(ValueError, match="one length"):
        spearman_with_ci([1, 2, 3, 4], [1, 2, 3])
    with pytest.raises(ValueError, match="finite"):
        spearman_with_ci([1, 2, np.nan, 4], [1, 2, 3, 4])
