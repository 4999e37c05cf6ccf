"""raygeom.numerics.distributions against scipy.stats, the reference it replaces (import cost only)."""

import numpy as np
import pytest
from scipy import stats

from raygeom.errors import InputError
from raygeom.numerics import distributions as dist


@pytest.mark.parametrize("p", [1e-12, 0.0005, 0.025, 0.3, 0.5, 0.8, 0.975, 1 - 1e-9])
@pytest.mark.parametrize("df", [1, 2, 3.5, 9, 30, 400])
def test_quantiles_and_tails_match_scipy_stats(p, df):
    assert dist.normal_quantile(p) == pytest.approx(stats.norm.ppf(p), rel=1e-12, abs=1e-12)
    assert dist.t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-10, abs=1e-12)
    assert dist.chi2_quantile(p, df) == pytest.approx(stats.chi2.ppf(p, df), rel=1e-10, abs=1e-300)
    x = stats.norm.ppf(p) * 3.0
    assert dist.t_sf(x, df) == pytest.approx(stats.t.sf(x, df), rel=1e-10, abs=1e-300)


def test_known_values():
    assert dist.normal_quantile(0.975) == pytest.approx(1.959963984540054, abs=1e-14)
    assert dist.t_quantile(0.975, 1) == pytest.approx(12.706204736174698, abs=1e-10)  # tan(0.475 pi)
    assert dist.t_sf(0.0, 5) == 0.5
    assert dist.chi2_quantile(1 - np.exp(-1.0), 2) == pytest.approx(2.0, abs=1e-12)  # chi2(2) is exponential, mean 2


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 11), (2, 4, 30), (5, 1)])
@pytest.mark.parametrize("levels", [3, 1000])  # many ties, and few
def test_rank_rows_matches_rankdata(seed, shape, levels):
    a = np.random.default_rng(seed).integers(0, levels, size=shape).astype(float)
    np.testing.assert_array_equal(dist.rank_rows(a), stats.rankdata(a, axis=-1))


def test_rank_rows_nan_row_and_empty():
    a = np.array([[2.0, np.nan, 1.0], [3.0, 1.0, 1.0]])
    ranks = dist.rank_rows(a)
    assert np.isnan(ranks[0]).all() and ranks[1].tolist() == [3.0, 1.5, 1.5]
    assert dist.rank_rows(np.empty((2, 0))).shape == (2, 0)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n", [2, 3, 10, 200])
@pytest.mark.parametrize("tied", [False, True])
def test_correlations_match_scipy_stats(seed, n, tied):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = 0.5 * x + rng.normal(size=n)
    if tied:
        x, y = np.round(x), np.round(y * 2)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        assert np.isnan(dist.spearman(x, y)) and np.isnan(dist.pearson(x, y))
        return
    assert dist.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
    assert dist.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)


def test_correlations_of_planted_orders():
    x = np.arange(20.0)
    assert dist.spearman(x, np.exp(x)) == 1.0 and dist.spearman(x, -(x**3)) == -1.0
    assert dist.pearson(x, 3 * x + 1) == pytest.approx(1.0, abs=1e-15)
    assert np.isnan(dist.pearson(x, np.ones(20))) and np.isnan(dist.spearman(np.ones(20), x))
    with pytest.raises(InputError, match="equal length"):
        dist.spearman([1.0, 2.0], [1.0])
