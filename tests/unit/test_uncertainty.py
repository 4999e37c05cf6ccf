"""Uncertainty functions against known answers: planted distributions whose true values are known,
exact counts, and independent scipy implementations (never the code under test)."""

import numpy as np
import pytest
from scipy import stats

from raygeom.errors import InputError
from raygeom.numerics import (
    auto_null_count,
    auto_nulls,
    bootstrap_ci,
    empirical_p_values,
    half_sample_spread,
    jackknife_se,
    normal_interval,
    null_blocks,
    null_rhos,
    null_target_reached,
    paired_t,
    pga_text_interval,
    prepare_layer,
    spearman_with_ci,
    subspace_rho,
    text_subsample,
    wilson_interval,
    z_delta_se,
    z_uncertainty,
)

MU, SIGMA = 0.3, 0.02  # a null distribution of rho like real layers give


def gaussian_nulls(seed, n):
    return np.random.default_rng([seed, n]).normal(MU, SIGMA, n)


# ----------------------------------------------------------------------------- z from a finite null


@pytest.mark.parametrize("z_true", [0.0, 3.0, -10.0, -35.0])
@pytest.mark.parametrize("n", [100, 400])
def test_bootstrap_se_of_z_agrees_with_the_delta_method_on_gaussian_nulls(z_true, n):
    # For Gaussian nulls the delta method sqrt((1 + z^2/2) / n) is the known first-order answer.
    ratios = []
    for rep in range(30):
        u = z_uncertainty(MU + z_true * SIGMA, gaussian_nulls(rep, n), seed=rep, n_boot=1000)
        ratios.append(u["z_se"] / z_delta_se(u["z"], n))
    assert 0.93 < np.median(ratios) < 1.07
    # One bootstrap se is itself an estimate (its sd is 5-15 % here, more at small n and large z).
    assert 0.6 < min(ratios) and max(ratios) < 1.7


@pytest.mark.parametrize("z_true, n", [(-10.0, 200), (2.0, 100)])
def test_z_interval_covers_the_true_z_about_95_percent_of_the_time(z_true, n):
    # The true z is known: (rho - MU) / SIGMA. 200 independent null sets.
    covered = []
    for rep in range(200):
        u = z_uncertainty(MU + z_true * SIGMA, gaussian_nulls(10_000 + rep, n), seed=rep, n_boot=500)
        covered.append(u["z_lo"] <= z_true <= u["z_hi"])
        assert u["z_hi"] - u["z"] == pytest.approx(u["z"] - u["z_lo"]) == pytest.approx(u["z_half_width"])
    assert 0.90 <= np.mean(covered) <= 0.99


def test_z_uncertainty_is_seeded_and_z_does_not_depend_on_the_seed():
    nulls = gaussian_nulls(0, 150)
    a, b = z_uncertainty(0.25, nulls, seed=4), z_uncertainty(0.25, nulls, seed=4)
    assert a == b
    c = z_uncertainty(0.25, nulls, seed=5)
    assert c["z"] == a["z"] and c["z_se"] != a["z_se"]
    assert a["z"] == pytest.approx((0.25 - nulls.mean()) / nulls.std(ddof=1), rel=1e-12)


@pytest.mark.parametrize("rho, upper, lower", [(50.0, 51, 51), (0.0, 100, 1), (100.0, 1, 100), (50.5, 50, 51)])
def test_empirical_p_values_count_the_observed_value_as_a_draw(rho, upper, lower):
    nulls = np.arange(1.0, 100.0)  # 99 draws: 1, 2, ..., 99
    p = empirical_p_values(rho, nulls)
    assert p == {"p_upper": upper / 100, "p_lower": lower / 100}
    u = z_uncertainty(rho, nulls)
    assert (u["p_upper"], u["p_lower"]) == (upper / 100, lower / 100)


def test_z_uncertainty_rejects_too_few_or_bad_nulls():
    with pytest.raises(InputError, match="at least 2"):
        z_uncertainty(0.1, [0.2])
    with pytest.raises(InputError, match="NaN"):
        z_uncertainty(0.1, [0.2, np.nan, 0.3])
    with pytest.raises(InputError, match="no spread"):
        z_uncertainty(0.1, [0.2, 0.2, 0.2])  # the mean of equal floats need not be that float: no 1e-17 sd
    assert null_target_reached(0.1, np.full(150, 0.2))  # more draws of a degenerate null cannot help


# The first tests of z_uncertainty, written with its first caller (analyses/pga.py).
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


# ----------------------------------------------------------------------------- --n-null auto


def test_null_blocks_are_a_fixed_schedule():
    assert null_blocks() == [range(s, s + 100) for s in range(0, 1000, 100)]
    assert null_blocks(cap=120, block=50) == [range(0, 50), range(50, 100), range(100, 120)]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("z_true", [0.0, -4.0])
def test_auto_stops_at_the_first_block_whose_half_width_meets_the_target(seed, z_true):
    rho = MU + z_true * SIGMA
    all_nulls = np.concatenate([gaussian_nulls(seed * 1000 + i, 50) for i in range(20)])
    count = auto_null_count(rho, all_nulls, seed=seed, block=50)
    assert count is not None and count % 50 == 0 and 100 <= count <= 1000
    assert z_uncertainty(rho, all_nulls[:count], seed=seed)["z_half_width"] <= 0.25
    if count > 100:
        assert z_uncertainty(rho, all_nulls[: count - 50], seed=seed)["z_half_width"] > 0.25
    # The delta method says how many that takes: n = (1.96 / 0.25)^2 (1 + z^2/2), give or take its noise.
    assert count == pytest.approx((1.96 / 0.25) ** 2 * (1 + z_true**2 / 2), rel=0.5, abs=50)
    # The default blocks of 100 (as the CLI's) stop at a multiple of 100 that meets the target.
    hundreds = auto_null_count(rho, all_nulls, seed=seed)
    assert hundreds % 100 == 0 and z_uncertainty(rho, all_nulls[:hundreds], seed=seed)["z_half_width"] <= 0.25
    assert auto_null_count(rho, all_nulls[: count - 1], seed=seed, block=50) is None  # not decided before the block ends


def test_auto_goes_to_the_cap_for_a_large_z_unless_a_relative_target_is_given():
    # |z| = 35 needs ~ (1.96 / 0.25)^2 * (1 + 35^2 / 2) = 37,700 nulls for a half-width of 0.25.
    rho = MU - 35.0 * SIGMA
    nulls = np.concatenate([gaussian_nulls(7000 + i, 50) for i in range(20)])
    assert auto_null_count(rho, nulls) == 1000
    assert not null_target_reached(rho, nulls[:999])
    assert null_target_reached(rho, nulls[:1000])
    # 5 % of |z|: a half-width of 1.75 needs ~ (1.96 / 1.75)^2 (1 + 35^2 / 2) = 770 nulls.
    assert auto_null_count(rho, nulls, relative_target=0.05) == pytest.approx(770, abs=120)


@pytest.mark.parametrize("seed", [0, 3])
def test_auto_nulls_are_bit_identical_however_the_blocks_are_split(seed):
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((60, 12)) @ rng.standard_normal((12, 12))
    layer = prepare_layer(h, 1)
    k = 3
    basis = np.linalg.qr(rng.standard_normal((12, k)))[0]
    rho = subspace_rho(layer, basis)
    serial = auto_nulls(rho, lambda indices: null_rhos(layer, k, seed, indices), target_half_width=0.3, cap=400, seed=seed)
    # A parallel driver: chunks of other sizes, drawn ahead in any order, settled in index order.
    for sizes in ([7, 13, 130, 250], [400], [25] * 16):
        bounds = np.cumsum([0, *sizes])
        chunks = [null_rhos(layer, k, seed, range(a, b)) for a, b in reversed(list(zip(bounds[:-1], bounds[1:])))]
        drawn = np.concatenate(chunks[::-1])
        count = auto_null_count(rho, drawn, target_half_width=0.3, cap=400, seed=seed)
        assert count == serial.size
        np.testing.assert_array_equal(drawn[:count], serial)
        assert z_uncertainty(rho, drawn[:count], seed=seed) == z_uncertainty(rho, serial, seed=seed)


# ----------------------------------------------------------------------------- interval over texts

D, K = 16, 4
_POPULATION = np.random.default_rng(123)
CENTRES = _POPULATION.standard_normal((8, D)) * np.r_[np.full(K, 1.0), np.full(D - K, 2.0)]
BASIS = np.eye(D)[:, :K]


def draw_texts(seed, n):
    """N texts from one population: 8 topics, structure mostly outside the readout subspace."""
    rng = np.random.default_rng(seed)
    return CENTRES[rng.integers(0, 8, n)] + rng.standard_normal((n, D)) * np.linspace(1.5, 0.5, D)


def test_text_subsamples_are_without_replacement_and_seeded_per_index():
    a = text_subsample(50, 25, seed=3, index=7)
    assert a.size == 25 and np.unique(a).size == 25 and np.all(np.diff(a) > 0) and a.max() < 50
    np.testing.assert_array_equal(a, text_subsample(50, 25, seed=3, index=7))
    assert not np.array_equal(a, text_subsample(50, 25, seed=3, index=8))
    with pytest.raises(InputError):
        text_subsample(10, 10, 0, 0)


def test_delete_d_jackknife_of_a_mean_gives_the_textbook_standard_error():
    # For the mean of N values the half-sample jackknife estimates s / sqrt(N).
    values = np.random.default_rng(0).standard_normal(400)
    means = [values[text_subsample(400, 200, 0, i)].mean() for i in range(400)]
    assert jackknife_se(means, 400, 200) == pytest.approx(values.std(ddof=1) / np.sqrt(400), rel=0.1)
    means = [values[text_subsample(400, 300, 0, i)].mean() for i in range(400)]
    assert jackknife_se(means, 400, 300) == pytest.approx(values.std(ddof=1) / np.sqrt(400), rel=0.1)


def test_text_interval_matches_the_spread_over_independent_text_samples():
    # The known answer: draw 40 independent sets of N texts from the population and take the
    # standard deviation of rho_readout across them. The jackknife sees one set only.
    n = 80
    truth = np.std([subspace_rho(prepare_layer(draw_texts(1000 + s, n), 1), BASIS) for s in range(40)], ddof=1)
    estimates = [pga_text_interval(draw_texts(2000 + s, n), BASIS, K, 1, seed=s, n_subsamples=20, n_null=8) for s in range(5)]
    ratio = np.median([e["rho_texts_se"] for e in estimates]) / truth
    assert 0.6 < ratio < 1.6
    for e in estimates:
        assert e["rho_texts_lo"] < e["rho_readout"] < e["rho_texts_hi"]
        assert e["z_texts_lo"] < e["z"] < e["z_texts_hi"]
        assert (e["n"], e["subsample_size"], e["n_subsamples"]) == (n, 40, 20)


def test_half_sample_spread_matches_the_spread_of_rho_over_independent_samples_of_texts():
    """Planted geometry: texts drawn from one Gaussian population; the delete-half jackknife se of rho on one
    sample of N texts should be close to the true sd of rho across independent samples of N texts."""
    from raygeom.numerics import pga
    from raygeom.numerics.pga_texts import half_sample_spread

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


def test_half_sample_spread_is_the_pga_text_interval_at_half_sampling():
    h = draw_texts(11, 50)
    spread = half_sample_spread(h, BASIS, r=1, k=K, seed=4, n_half=6, n_null=5)
    interval = pga_text_interval(h, BASIS, K, 1, seed=4, n_subsamples=6, n_null=5, z=1.0, null_std=0.1)
    assert spread["rho_texts_se"] == interval["rho_texts_se"]
    assert spread["margin_texts_se"] == interval["margin_texts_se"] == pytest.approx(0.1 * interval["z_texts_se"])


def test_text_interval_is_deterministic_and_uses_the_given_z():
    h = draw_texts(5, 60)
    a = pga_text_interval(h, BASIS, K, 1, seed=2, n_subsamples=6, n_null=5, z=-3.0, null_std=0.05)
    assert a == pga_text_interval(h, BASIS, K, 1, seed=2, n_subsamples=6, n_null=5, z=-3.0, null_std=0.05)
    assert a["z"] == -3.0
    assert a["z_texts_hi"] - a["z"] == pytest.approx(1.959964 * a["z_texts_se"], rel=1e-6)
    # Half of the null sd gives twice the spread on the z scale.
    b = pga_text_interval(h, BASIS, K, 1, seed=2, n_subsamples=6, n_null=5, z=-3.0, null_std=0.025)
    assert b["z_texts_se"] == pytest.approx(2 * a["z_texts_se"], rel=1e-12)


def test_text_interval_handles_duplicated_texts():
    # Subsampling without replacement never creates duplicates, and keeps the ones the corpus has.
    h = np.repeat(draw_texts(9, 20), 3, axis=0)
    out = pga_text_interval(h, BASIS, K, 1, seed=0, n_subsamples=5, n_null=4)
    assert np.isfinite(out["rho_texts_se"]) and np.isfinite(out["z_texts_se"])


# ----------------------------------------------------------------------------- other decisions


@pytest.mark.parametrize("successes, n", [(0, 10), (5, 10), (10, 10), (23, 25), (1, 25), (300, 400), (0, 1)])
@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_wilson_interval_matches_scipy(successes, n, level):
    expected = stats.binomtest(successes, n).proportion_ci(confidence_level=level, method="wilson")
    low, high = wilson_interval(successes, n, level)
    assert low == pytest.approx(expected.low, abs=1e-12)
    assert high == pytest.approx(expected.high, abs=1e-12)


def test_wilson_interval_known_values():
    # Textbook values (Newcombe 1998, table I: 0/10 and 5/10 at 95 %).
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    with pytest.raises(InputError):
        wilson_interval(11, 10)


@pytest.mark.parametrize("successes,n", [(0, 25), (13, 25), (25, 25), (230, 400)])
def test_wilson_interval_matches_statsmodels_formula_and_covers(successes, n):
    from raygeom.numerics.uncertainty import wilson_interval

    z = 1.959963984540054
    p = successes / n
    # Wilson (1927): (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), written out independently
    denominator = 1 + z**2 / n
    centre = p + z**2 / (2 * n)
    spread = z * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
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


def test_normal_interval():
    assert normal_interval(1.0, 0.5) == pytest.approx((1.0 - 1.959964 * 0.5, 1.0 + 1.959964 * 0.5), rel=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n", [50, 400])
def test_bootstrap_of_a_mean_matches_the_normal_theory_answer(seed, n):
    values = np.random.default_rng(seed).normal(3.0, 2.0, n)
    out = bootstrap_ci(values, np.mean, seed=seed, n_boot=2000)
    se = values.std(ddof=1) / np.sqrt(n)
    assert out["estimate"] == pytest.approx(values.mean(), rel=1e-12)
    assert out["se"] == pytest.approx(se, rel=0.1)
    assert out["lo"] == pytest.approx(values.mean() - 1.96 * se, abs=0.25 * se)
    assert out["hi"] == pytest.approx(values.mean() + 1.96 * se, abs=0.25 * se)
    # scipy's percentile bootstrap (other random draws) agrees within Monte-Carlo error.
    ref = stats.bootstrap((values,), np.mean, n_resamples=2000, method="percentile", random_state=seed)
    assert out["lo"] == pytest.approx(ref.confidence_interval.low, abs=0.25 * se)
    assert out["hi"] == pytest.approx(ref.confidence_interval.high, abs=0.25 * se)
    assert out == bootstrap_ci(values, np.mean, seed=seed, n_boot=2000)


def test_paired_bootstrap_resamples_pairs_together():
    # a and b share a large per-item effect; their difference has sd 0.1. Resampling pairs sees only that.
    rng = np.random.default_rng(0)
    item = rng.normal(0, 5, 300)
    a, b = item + 0.5 + rng.normal(0, 0.07, 300), item + rng.normal(0, 0.07, 300)
    out = bootstrap_ci((a, b), lambda x, y: np.mean(x - y), seed=1)
    se = np.std(a - b, ddof=1) / np.sqrt(300)
    assert out["se"] == pytest.approx(se, rel=0.1)
    assert out["lo"] < 0.5 < out["hi"] and out["hi"] - out["lo"] < 0.05


def test_cluster_bootstrap_resamples_whole_texts():
    # 40 texts x 25 tokens; tokens of a text share a text effect of sd 1, so the mean's se is about
    # sd(text means) / sqrt(40), far more than a token bootstrap would claim.
    rng = np.random.default_rng(3)
    texts = np.repeat(np.arange(40), 25)
    values = rng.normal(0, 1, 40)[texts] + rng.normal(0, 0.5, texts.size)
    clustered = bootstrap_ci(values, np.mean, seed=0, clusters=texts)
    text_means = values.reshape(40, 25).mean(axis=1)
    assert clustered["se"] == pytest.approx(text_means.std(ddof=1) / np.sqrt(40), rel=0.15)
    assert clustered["se"] > 3 * bootstrap_ci(values, np.mean, seed=0)["se"]


def test_spearman_fisher_interval_is_the_bonett_wright_formula():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(30)
    y = x + rng.standard_normal(30)
    r = stats.spearmanr(x, y)[0]
    half = stats.norm.ppf(0.975) * np.sqrt((1 + r**2 / 2) / 27)
    out = spearman_with_ci(x, y)
    assert out["rho"] == pytest.approx(r, abs=1e-15)
    assert (out["lo"], out["hi"]) == pytest.approx((np.tanh(np.arctanh(r) - half), np.tanh(np.arctanh(r) + half)), abs=1e-12)


@pytest.mark.parametrize("method", ["fisher", "bootstrap"])
def test_spearman_interval_covers_the_population_value(method):
    # Bivariate normal with Pearson 0.6 has population Spearman (6 / pi) asin(0.3).
    truth = 6 / np.pi * np.arcsin(0.3)
    cov = [[1, 0.6], [0.6, 1]]
    reps = 150
    covered = []
    for rep in range(reps):
        x, y = np.random.default_rng(rep).multivariate_normal([0, 0], cov, 40).T
        out = spearman_with_ci(x, y, seed=rep, method=method, n_boot=500)
        covered.append(out["lo"] <= truth <= out["hi"])
    assert 0.85 <= np.mean(covered) <= 1.0


def test_spearman_bootstrap_draws_the_same_pairs_as_bootstrap_ci():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(60)
    y = x + rng.standard_normal(60)
    fast = spearman_with_ci(x, y, seed=4, method="bootstrap", n_boot=300)
    slow = bootstrap_ci((x, y), lambda a, b: stats.spearmanr(a, b)[0], seed=4, n_boot=300)
    assert (fast["lo"], fast["hi"]) == pytest.approx((slow["lo"], slow["hi"]), abs=1e-12)
    assert fast["rho"] == pytest.approx(slow["estimate"], abs=1e-15)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [2, 3, 8, 50])
def test_paired_t_matches_scipy_ttest_rel(seed, n):
    rng = np.random.default_rng(seed)
    a = rng.normal(1.0, 1.0, n)
    b = a + rng.normal(0.3, 0.5, n)
    expected = stats.ttest_rel(a, b)
    got = paired_t(a, b)
    assert got["t"] == pytest.approx(expected.statistic, rel=1e-10)
    assert got["p"] == pytest.approx(expected.pvalue, rel=1e-10)
    assert got["df"] == n - 1 == expected.df
    assert got["mean_diff"] == pytest.approx(np.mean(a - b), rel=1e-12)


def test_z_delta_se_formula():
    assert z_delta_se(0.0, 100) == pytest.approx(0.1)
    assert z_delta_se(-10.0, 51) == pytest.approx(1.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n", [3, 8, 30])
def test_log_linear_change_is_scipys_regression_on_log_y(seed, n):
    from raygeom.numerics.uncertainty import log_linear_change

    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0, 1000, n))
    y = 100 * np.exp(-2e-4 * x + rng.normal(0, 0.02, n))
    fit = stats.linregress(x, np.log(y))
    half = stats.t.ppf(0.95, n - 2) * fit.stderr
    got = log_linear_change(x, y, span=250.0, level=0.90)
    assert got["change"] == pytest.approx(np.exp(fit.slope * 250) - 1, rel=1e-9, abs=1e-12)
    assert got["lo"] == pytest.approx(np.exp((fit.slope - half) * 250) - 1, rel=1e-9, abs=1e-12)
    assert got["hi"] == pytest.approx(np.exp((fit.slope + half) * 250) - 1, rel=1e-9, abs=1e-12)
    assert -1 < got["lo"] <= got["change"] <= got["hi"] and got["n"] == n


def test_log_linear_change_on_planted_exact_curves():
    from raygeom.numerics.uncertainty import log_linear_change

    x = np.arange(0, 100, 10.0)
    halving = log_linear_change(x, 80 * 0.5 ** (x / 50), span=50.0)  # halves every 50 steps, exactly
    assert (
        halving["change"] == pytest.approx(-0.5) and halving["lo"] == pytest.approx(-0.5) and halving["hi"] == pytest.approx(-0.5)
    )
    flat = log_linear_change(x, np.full(x.size, 7.0), span=50.0)
    assert flat["change"] == pytest.approx(0.0, abs=1e-12)
    two = log_linear_change([0.0, 10.0], [4.0, 2.0], span=10.0)  # a line through two points: no interval
    assert two["change"] == pytest.approx(-0.5) and np.isnan(two["lo"]) and np.isnan(two["hi"])
    with pytest.raises(InputError):
        log_linear_change([0.0, 1.0], [1.0, -1.0], span=1.0)
    with pytest.raises(InputError):
        log_linear_change([3.0, 3.0, 3.0], [1.0, 2.0, 3.0], span=1.0)
