import numpy as np
import pytest

from raygeom.errors import InputError
from raygeom.numerics.spectral import (
    alpha_req,
    alpha_req_fit,
    condition_number,
    isotropy,
    pc1_readout_share,
    rankme,
    spectral_summary,
)
from tests import reference


def planted_spectrum(s, n, d, seed):
    """H whose centred version has exactly the singular values ``s`` (plus zeros),
    behind a common offset row that centring must remove."""
    rng = np.random.default_rng(seed)
    m = len(s)
    g = rng.standard_normal((n, m))
    left, _ = np.linalg.qr(g - g.mean(axis=0))  # orthonormal columns, each orthogonal to the ones vector
    right, _ = np.linalg.qr(rng.standard_normal((d, m)))
    return (left * s) @ right.T + rng.standard_normal(d)


def random_basis(d, k, rng):
    return np.linalg.qr(rng.standard_normal((d, k)))[0]


POWER_LAW_SHAPES = [(200, 50, 50), (120, 80, 30), (60, 100, 40)]  # (N, d, planted rank)


@pytest.mark.parametrize("a", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("n, d, m", POWER_LAW_SHAPES)
def test_planted_power_law_gives_exact_alpha_condition_number_and_rankme(a, n, d, m):
    s = 10.0 * np.arange(1, m + 1) ** (-a / 2)  # s^2 ~ i^-a
    h = planted_spectrum(s, n, d, seed=m)
    assert alpha_req(h) == pytest.approx(a, rel=1e-8)
    fit = alpha_req_fit(h)
    assert fit["alpha_req_r2"] == pytest.approx(1.0, abs=1e-10)
    assert (fit["alpha_req_first_rank"], fit["alpha_req_last_rank"]) == (11, m)  # 11-100, clamped to what exists
    assert alpha_req(h, fit_range=(1, None)) == pytest.approx(a, rel=1e-8)
    assert condition_number(h) == pytest.approx(m ** (a / 2), rel=1e-8)
    # RankMe runs over all min(N, d) singular values; the unplanted ones are zero.
    padded = np.concatenate([s, np.zeros(min(n, d) - m)])
    assert rankme(h, centred=True) == pytest.approx(reference.rankme_of_singular_values(padded), rel=1e-6)
    # H as given is the planted matrix plus an offset row; without the offset its singular values are s.
    assert rankme(h - h.mean(axis=0), centred=False) == pytest.approx(reference.rankme_of_singular_values(padded), rel=1e-6)


@pytest.mark.parametrize("m", [1, 7, 40])
def test_rankme_of_a_flat_spectrum_is_its_rank(m):
    h = planted_spectrum(np.full(m, 3.0), 90, 60, seed=m)
    assert rankme(h, centred=True) == pytest.approx(m, rel=1e-4)
    assert rankme(h - h.mean(axis=0)) == pytest.approx(m, rel=1e-4)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n, d, offset", [(400, 64, 5.0), (150, 96, 0.5), (60, 30, 20.0), (50, 80, 0.0)])
def test_rankme_is_uncentred_by_default_as_garrido_et_al_define_it(seed, n, d, offset):
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((n, d)) @ rng.standard_normal((d, d)) + offset * rng.standard_normal(d)
    assert rankme(h) == pytest.approx(reference.rankme_garrido(h), abs=1e-6)
    assert rankme(h, centred=True) == pytest.approx(reference.rankme_garrido(h, centred=True), abs=1e-6)
    summary = spectral_summary(h)
    assert summary["rankme"] == pytest.approx(reference.rankme_garrido(h), abs=1e-6)
    assert summary["rankme_centred"] == pytest.approx(reference.rankme_garrido(h, centred=True), abs=1e-6)


def test_a_common_offset_lowers_uncentred_rankme_only():
    # A mean vector far from zero is one dominant singular value of H as given; centring removes it.
    h = np.random.default_rng(0).standard_normal((500, 40))
    shifted = h + 30.0 * np.ones(40)
    assert rankme(shifted, centred=True) == pytest.approx(rankme(h, centred=True), rel=1e-9)
    assert rankme(shifted) < 0.8 * rankme(h)


def layer_like(seed, n, d, a=1.2):
    """Anisotropic, heavy-tailed data like a hidden layer: a power-law covariance, a mean offset, outliers."""
    rng = np.random.default_rng(seed)
    rotation = np.linalg.qr(rng.standard_normal((d, d)))[0]
    h = (rng.standard_t(5, (n, d)) * np.arange(1, d + 1) ** (-a / 2)) @ rotation
    return h + 3.0 * rng.standard_normal(d)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n, d", [(400, 640), (250, 576), (150, 200), (600, 120), (60, 30)])
def test_alpha_req_matches_a_rewrite_of_reptrix(seed, n, d):
    h = layer_like(seed, n, d)
    expected_alpha, expected_r2 = reference.alpha_req_reptrix(h)
    fit = alpha_req_fit(h)
    assert fit["alpha_req"] == pytest.approx(expected_alpha, abs=1e-6)
    assert fit["alpha_req_r2"] == pytest.approx(expected_r2, abs=1e-6)
    assert fit["alpha_req_first_rank"] == 11
    assert fit["alpha_req_last_rank"] == min(100, n - 1, d)
    assert spectral_summary(h)["alpha_req"] == pytest.approx(expected_alpha, abs=1e-6)


@pytest.mark.parametrize("fit_range", [(1, None), (5, 50), (2, 20)])
@pytest.mark.parametrize("seed", [0, 1])
def test_alpha_req_fit_range_is_an_option(fit_range, seed):
    h = layer_like(seed, 300, 150)
    expected_alpha, expected_r2 = reference.alpha_req_reptrix(h, fit_range)
    fit = alpha_req_fit(h, fit_range)
    assert fit["alpha_req"] == pytest.approx(expected_alpha, abs=1e-6)
    assert fit["alpha_req_r2"] == pytest.approx(expected_r2, abs=1e-6)
    assert spectral_summary(h, alpha_fit_range=fit_range)["alpha_req"] == pytest.approx(expected_alpha, abs=1e-6)


def test_alpha_req_is_nan_in_the_summary_when_its_range_is_empty():
    h = np.random.default_rng(0).standard_normal((40, 8))  # 8 eigenvalues: ranks 11-100 hold none
    summary = spectral_summary(h)
    assert np.isnan(summary["alpha_req"]) and np.isnan(summary["alpha_req_r2"])
    assert summary["rankme"] > 1 and np.isfinite(summary["condition_number"])
    with pytest.raises(InputError, match="fit range"):
        alpha_req(h)


@pytest.mark.parametrize("a", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gaussian_samples_of_a_power_law_covariance_give_alpha_within_5_percent(a, seed):
    # The fit's ranks 11-100 lie inside a d=150 spectrum, away from its smallest eigenvalues, where
    # finite N distorts a sample spectrum most; N/d = 133 keeps that distortion under ~0.3% here
    # (seen across seeds; d=40 and ranks 11-40 gave up to 6%).
    rng = np.random.default_rng(seed)
    n, d = 20000, 150
    rotation = np.linalg.qr(rng.standard_normal((d, d)))[0]
    h = (rng.standard_normal((n, d)) * np.arange(1, d + 1) ** (-a / 2)) @ rotation
    assert alpha_req(h) == pytest.approx(a, rel=0.05)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n, d", [(2000, 50), (500, 64), (300, 100)])
def test_isotropic_gaussian_is_nearly_full_rank_and_isotropic(seed, n, d):
    h = np.random.default_rng(seed).standard_normal((n, d)) + 5.0
    summary = spectral_summary(h)
    # Singular values spread only by ~(1 +- sqrt(d/N)) (Marchenko-Pastur), so p is nearly flat;
    # the +5 offset is one large singular value of H as given, which only the centred variant removes.
    assert summary["rankme_centred"] > 0.9 * d
    # Z(c) ~ N (1 + lambda_c / 2), with lambda_c the variance of the unit rows along c,
    # which lies in (1 +- sqrt(d/N))^2 / d; so isotropy ~ 1 - 2 sqrt(d/N) / d
    # (0.988-0.994 for these shapes, matching what the estimator gives). 0.95 leaves margin.
    assert summary["isotropy"] > 0.95
    assert summary["isotropy"] == pytest.approx(1 - 2 * np.sqrt(d / n) / d, abs=0.01)


@pytest.mark.parametrize("noise", [0.0, 1e-3])
def test_isotropy_of_symmetric_one_dimensional_data_is_one_over_cosh_1(noise):
    # Unit rows are +-e1: Z(e1) = N cosh(1) while every other direction gives Z = N.
    rng = np.random.default_rng(0)
    n, d = 400, 12
    h = noise * rng.standard_normal((n, d))
    h[:, 0] += np.where(np.arange(n) % 2 == 0, 7.0, -7.0)
    assert isotropy(h) == pytest.approx(1 / np.cosh(1.0), abs=1e-3 + 10 * noise)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n, d", [(150, 40), (30, 70)])
def test_isotropy_matches_plain_reference(seed, n, d):
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((n, d)) @ rng.standard_normal((d, d)) + rng.standard_normal(d)
    h[:, 0] += rng.exponential(3.0, n)  # skewed along one axis, so the sign of each direction matters
    assert isotropy(h) == pytest.approx(reference.isotropy(h), rel=1e-10)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("n, d, k", [(300, 100, 10), (80, 150, 20)])
def test_pc1_inside_the_readout_subspace_has_share_near_one(seed, n, d, k):
    rng = np.random.default_rng(seed)
    basis = random_basis(d, k, rng)
    direction = basis @ rng.standard_normal(k)
    direction /= np.linalg.norm(direction)
    h = rng.standard_normal((n, d)) + 10.0 * rng.standard_normal((n, 1)) * direction
    result = pc1_readout_share(h, basis)
    assert result["pc1_readout_share"] > 0.97
    assert result["pc1_readout_chance"] == k / d


def test_random_pc1_has_share_near_chance_k_over_d():
    n, d, k, draws = 300, 100, 10, 40
    shares = []
    for seed in range(draws):
        rng = np.random.default_rng(seed)
        basis = random_basis(d, k, rng)
        direction = rng.standard_normal(d)
        direction /= np.linalg.norm(direction)
        h = rng.standard_normal((n, d)) + 10.0 * rng.standard_normal((n, 1)) * direction
        share = pc1_readout_share(h, basis)["pc1_readout_share"]
        assert share == pytest.approx(np.sum((basis.T @ direction) ** 2), abs=0.02)
        shares.append(share)
    # The share of a uniform direction is Beta(k/2, (d-k)/2): mean k/d, sd below.
    sd = np.sqrt(2 * k * (d - k) / (d**2 * (d + 2)))
    assert abs(np.mean(shares) - k / d) < 4 * sd / np.sqrt(draws)


@pytest.mark.parametrize("seed", [0, 1])
def test_pc1_share_matches_plain_reference(seed):
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((60, 30)) @ rng.standard_normal((30, 30))
    basis = random_basis(30, 6, rng)
    assert pc1_readout_share(h, basis)["pc1_readout_share"] == pytest.approx(reference.pc1_readout_share(h, basis), rel=1e-8)


def test_summary_agrees_with_single_metrics_and_plain_reference():
    rng = np.random.default_rng(5)
    h = rng.standard_normal((120, 40)) @ rng.standard_normal((40, 40))
    basis = random_basis(40, 8, rng)
    summary = spectral_summary(h, basis)
    s = reference.singular_values(h)
    assert summary["rankme"] == pytest.approx(reference.rankme_garrido(h), rel=1e-10)
    assert summary["rankme_centred"] == pytest.approx(reference.rankme_of_singular_values(s), rel=1e-10)
    assert summary["alpha_req"] == pytest.approx(reference.alpha_req_reptrix(h)[0], rel=1e-8)
    assert summary["condition_number"] == pytest.approx(s.max() / s.min(), rel=1e-8)
    assert summary["isotropy"] == pytest.approx(isotropy(h), rel=1e-12)
    assert summary["pc1_readout_share"] == pytest.approx(pc1_readout_share(h, basis)["pc1_readout_share"])
    assert (summary["n"], summary["d"], summary["pc1_readout_chance"]) == (120, 40, 8 / 40)
    assert "pc1_readout_share" not in spectral_summary(h)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: rankme(np.full((10, 4), np.inf)), "NaN or inf"),
        (lambda: isotropy(np.ones((2, 4))), "at least 3 samples"),
        (lambda: alpha_req(np.ones((10, 4))), "no variance"),
        (lambda: alpha_req(np.outer(np.arange(10.0), np.ones(4))), "rank 1"),
        (lambda: alpha_req(np.random.default_rng(0).standard_normal((30, 40)), fit_range=(25, 25)), "fit range"),
        (lambda: rankme(np.zeros((10, 4))), "all zeros"),
        (lambda: condition_number(np.ones(5)), "2-D"),
        (lambda: pc1_readout_share(np.eye(6), np.eye(5)[:, :2]), "5 rows but H has d=6"),
        (lambda: pc1_readout_share(np.eye(6), np.eye(6)), "0 < k < d"),
        (lambda: pc1_readout_share(np.eye(6), 2.0 * np.eye(6)[:, :2]), "orthonormal"),
    ],
)
def test_bad_input_raises_input_error(make, message):
    with pytest.raises(InputError, match=message):
        make()
