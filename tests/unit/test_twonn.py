"""TwoNN on points whose intrinsic dimension is known, against scikit-dimension's own TwoNN, and its invariances."""

import numpy as np
import pytest

from raygeom.errors import InputError
from raygeom.numerics import twonn


def planted(n: int, dim: int, ambient: int, seed: int) -> np.ndarray:
    """Uniform points in a dim-cube, rotated into an ambient space: intrinsic dimension ``dim``."""
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.normal(size=(ambient, dim)))
    return rng.uniform(size=(n, dim)) @ rotation.T


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dim,ambient", [(2, 10), (5, 64), (10, 128)])
def test_planted_dimension_is_recovered(seed, dim, ambient):
    h = planted(1500, dim, ambient, seed)
    # TwoNN underestimates on a bounded cube as dim grows (boundary effects): within 20 %.
    assert twonn.twonn_dimension(h) == pytest.approx(dim, rel=0.2)
    mle = twonn.twonn_mle(h)
    assert mle["twonn_mle_lo"] < mle["twonn_mle"] < mle["twonn_mle_hi"]
    assert mle["twonn_mle"] == pytest.approx(dim, rel=0.2)


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("shape", [(200, 40), (400, 576)])
def test_equals_scikit_dimension(seed, shape):
    skdim = pytest.importorskip("skdim")
    h = (
        np.random.default_rng(seed).normal(size=shape)
        @ np.random.default_rng(seed + 1).normal(size=(shape[1], 30))
        @ np.random.default_rng(seed + 2).normal(size=(30, shape[1]))
    )
    expected = skdim.id.TwoNN(discard_fraction=0.1).fit(h).dimension_
    assert twonn.twonn_dimension(h, 0.1) == pytest.approx(expected, rel=1e-9)
    expected_more = skdim.id.TwoNN(discard_fraction=0.25).fit(h).dimension_
    assert twonn.twonn_dimension(h, 0.25) == pytest.approx(expected_more, rel=1e-9)


def test_mle_matches_its_formula_and_interval_covers():
    """N / sum(log mu) with an exact chi2 interval: on Pareto(d) ratios the interval covers d about 95 % of the time."""
    rng = np.random.default_rng(7)
    d, n, covered = 4.0, 300, 0
    for _ in range(400):
        log_mu = rng.exponential(1 / d, size=n)
        total = log_mu.sum()
        from scipy import stats

        lo, hi = stats.chi2.ppf(0.025, 2 * n) / (2 * total), stats.chi2.ppf(0.975, 2 * n) / (2 * total)
        covered += lo <= d <= hi
    assert 0.92 <= covered / 400 <= 0.98
    h = planted(300, 3, 12, 5)
    mu = twonn.neighbour_ratios(h)
    assert twonn.twonn_mle(h)["twonn_mle"] == pytest.approx(mu.size / np.log(mu).sum())


def test_invariant_to_rotation_translation_and_scale():
    h = planted(500, 4, 20, 11)
    q, _ = np.linalg.qr(np.random.default_rng(3).normal(size=(20, 20)))
    moved = 3.5 * h @ q + 10.0
    assert twonn.twonn_dimension(moved) == pytest.approx(twonn.twonn_dimension(h), rel=1e-6)


def test_duplicates_are_dropped_and_degenerate_input_refused():
    h = planted(300, 3, 12, 2)
    with_copies = np.vstack([h, h[:50]])
    assert twonn.neighbour_ratios(with_copies).size == 250  # the 100 duplicated points have r1 = 0
    with pytest.raises(InputError):
        twonn.twonn_dimension(np.ones((20, 5)))
    with pytest.raises(InputError):
        twonn.twonn_dimension(np.ones((2, 5)))
