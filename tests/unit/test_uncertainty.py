"""z's Monte-Carlo error against its known large-sample law, p-values by counting, determinism."""

import numpy as np
import pytest

from raygeom.errors import InputError
from raygeom.numerics.uncertainty import z_delta_se, z_uncertainty


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("z_true", [0.0, 3.0, -20.0])
def test_bootstrap_se_of_z_matches_the_delta_method_on_gaussian_nulls(seed, z_true):
    n = 400
    nulls = np.random.default_rng(seed).normal(0.1, 0.02, n)
    rho = 0.1 + z_true * 0.02
    result = z_uncertainty(rho, nulls, seed)
    z = (rho - nulls.mean()) / nulls.std(ddof=1)
    assert result["z_se"] == pytest.approx(z_delta_se(z, n), rel=0.15)
    assert result["z_lo"] < z < result["z_hi"]
    assert result["z_half_width"] == pytest.approx((result["z_hi"] - result["z_lo"]) / 2)


def test_the_interval_covers_the_z_of_an_independent_null_draw_about_95_percent_of_the_time():
    covered, trials = 0, 300
    for t in range(trials):
        rng = np.random.default_rng([7, t])
        rho = 0.5  # true z = (0.5 - 0.2) / 0.1 = 3 against N(0.2, 0.1^2) nulls
        result = z_uncertainty(rho, rng.normal(0.2, 0.1, 100), seed=t, n_boot=500)
        covered += result["z_lo"] <= 3.0 <= result["z_hi"]
    assert 0.88 <= covered / trials <= 0.99


def test_empirical_p_values_count_nulls_at_or_beyond_rho():
    nulls = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    result = z_uncertainty(0.3, nulls)
    assert result["p_upper"] == pytest.approx((1 + 3) / 6) and result["p_lower"] == pytest.approx((1 + 3) / 6)
    extreme = z_uncertainty(0.9, nulls)
    assert extreme["p_upper"] == pytest.approx(1 / 6) and extreme["p_lower"] == pytest.approx(1.0)


def test_same_seed_same_numbers_and_degenerate_nulls_are_refused():
    nulls = np.random.default_rng(3).normal(size=50)
    assert z_uncertainty(1.0, nulls, 5) == z_uncertainty(1.0, nulls.copy(), 5)
    with pytest.raises(InputError):
        z_uncertainty(1.0, np.full(10, 0.2))
    with pytest.raises(InputError):
        z_uncertainty(1.0, [0.1])


def test_half_sample_spread_matches_the_spread_of_rho_over_independent_samples_of_texts():
    """Planted geometry: texts drawn from one Gaussian population; the delete-half jackknife se of rho on one
    sample of N texts should be close to the true sd of rho across independent samples of N texts."""
    from raygeom.numerics import pga
    from raygeom.numerics.uncertainty import half_sample_spread

    d, k, n = 24, 6, 60
    rng = np.random.default_rng(0)
    mixing = rng.normal(size=(d, d)) * np.linspace(2.0, 0.2, d)
    basis = np.linalg.qr(rng.normal(size=(d, k)))[0]
    rhos = []
    for t in range(12):
        h = np.random.default_rng([1, t]).normal(size=(n, d)) @ mixing
        rhos.append(pga.subspace_rho(pga.prepare_layer(h, 1), basis))
    true_sd = np.std(rhos, ddof=1)
    h = np.random.default_rng([1, 99]).normal(size=(n, d)) @ mixing
    spread = half_sample_spread(h, basis, r=1, k=k, seed=3, n_half=16, n_null=4)
    assert 0.4 * true_sd < spread["rho_texts_se"] < 2.5 * true_sd
    assert spread == half_sample_spread(h, basis, r=1, k=k, seed=3, n_half=16, n_null=4)  # seeded
    duplicated = np.repeat(h[:20], 3, axis=0)  # a corpus of duplicated texts: ties, still finite
    assert np.isfinite(half_sample_spread(duplicated, basis, r=1, k=k, seed=0, n_half=4, n_null=2)["rho_texts_se"])


@pytest.mark.parametrize("successes,n", [(0, 25), (13, 25), (25, 25), (230, 400)])
def test_wilson_interval_matches_statsmodels_formula_and_covers(successes, n):
    from raygeom.numerics.uncertainty import wilson_interval

    z = 1.959963984540054
    p = successes / n
    # Wilson (1927): (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), written out independently
    denominator = 1 + z ** 2 / n
    centre = p + z ** 2 / (2 * n)
    spread = z * np.sqrt(p * (1 - p) / n + z ** 2 / (4 * n ** 2))
    low, high = wilson_interval(successes, n)
    assert low == pytest.approx(max(0.0, (centre - spread) / denominator), abs=1e-12)
    assert high == pytest.approx(min(1.0, (centre + spread) / denominator), abs=1e-12)
    assert low <= p <= high


def test_wilson_interval_covers_the_true_accuracy_about_95_percent_of_the_time():
    from raygeom.numerics.uncertainty import wilson_interval

    rng = np.random.default_rng(0)
    hits = [wilson_interval(int(rng.binomial(40, 0.7)), 40) for _ in range(2000)]
    coverage = np.mean([low <= 0.7 <= high for low, high in hits])
    assert 0.92 <= coverage <= 0.98
