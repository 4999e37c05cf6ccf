"""Intervals respect their estimand (issue 40): a share or an accuracy gets an interval inside [0, 1], a correlation
one inside [-1, 1], a mean cosine distance one inside [0, 2]; none has zero width; a rank correlation over fewer than
10 points, or at |rho| = 1, gets an exact permutation p-value and "too few points for an interval" instead. Planted
cases, checked over every registered analysis that reports a bounded quantity with an interval; the references are
written out here or taken from scipy, never from the code under test."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from raygeom.numerics import uncertainty as u


def exact_p(x, y) -> float:
    """Two-sided permutation p of Spearman's rho by enumerating every ordering with scipy's spearmanr."""
    observed = abs(stats.spearmanr(x, y)[0])
    values = [abs(stats.spearmanr(x, np.asarray(y)[list(order)])[0]) for order in itertools.permutations(range(len(y)))]
    return float(np.mean(np.asarray(values) >= observed - 1e-9))


def wilson(k: int, n: int) -> tuple[float, float]:
    q = stats.norm.ppf(0.975)
    p = k / n
    centre = (p + q * q / (2 * n)) / (1 + q * q / n)
    half = q * math.sqrt(p * (1 - p) / n + q * q / (4 * n * n)) / (1 + q * q / n)
    return centre - half, centre + half


@pytest.mark.parametrize(
    "x, y",
    [
        (range(5), [4, 3, 2, 1, 0]),
        (range(6), [1, 3, 2, 6, 5, 4]),
        (range(6), [2, 2, 1, 5, 4, 6]),
        ([1, 1, 2, 3, 5, 8], [3, 1, 4, 1, 5, 9]),
    ],
)
@pytest.mark.parametrize("method", ["fisher", "bootstrap"])
def test_a_rank_correlation_over_few_points_has_an_exact_p_and_no_interval(x, y, method):
    out = u.spearman_with_ci(list(x), y, method=method, n_boot=200)
    assert out["rho"] == pytest.approx(stats.spearmanr(list(x), y)[0], abs=1e-12)
    assert math.isnan(out["lo"]) and math.isnan(out["hi"]) and out["note"] == u.TOO_FEW_POINTS
    assert out["p_method"] == "exact" and out["p_perm"] == pytest.approx(exact_p(list(x), y), abs=1e-12)


def test_rho_of_minus_one_over_nine_and_five_checkpoints_is_no_zero_width_interval():
    for n in (9, 5):
        out = u.spearman_with_ci(np.arange(n), -(np.arange(n) ** 2), method="bootstrap")
        assert out["rho"] == -1.0 and math.isnan(out["lo"]) and math.isnan(out["hi"])
        assert out["p_perm"] == pytest.approx(2 / math.factorial(n))  # only the order and its reverse reach |rho| = 1


def test_at_the_bound_over_many_points_there_is_no_interval_but_an_exact_p():
    out = u.spearman_with_ci(np.arange(12), np.arange(12) ** 3)
    assert out["note"] == u.AT_THE_BOUND and math.isnan(out["lo"])
    assert out["p_perm"] == pytest.approx(2 / math.factorial(12)) and out["p_method"] == "exact"


def test_ten_or_more_points_below_the_bound_keep_their_interval():
    rng = np.random.default_rng(0)
    x = rng.normal(size=20)
    out = u.spearman_with_ci(x, x + rng.normal(size=20))
    assert -1 < out["lo"] < out["rho"] < out["hi"] < 1 and out["note"] == ""


def test_a_bounded_seed_mean_stays_inside_its_bounds_on_the_logit_scale():
    values = [0.003, 0.389]  # two seeds of a share: the plain t interval was [-0.875, +1.653]
    out = u.bounded_mean_interval(values, bounds=(0.0, 1.0))
    logits = np.log(np.clip(values, 1e-6, 1 - 1e-6) / (1 - np.clip(values, 1e-6, 1 - 1e-6)))
    half = stats.t.ppf(0.975, 1) * np.std(logits, ddof=1) / np.sqrt(2)
    expected = 1 / (1 + np.exp(-(logits.mean() - half))), 1 / (1 + np.exp(-(logits.mean() + half)))
    assert (out["lo"], out["hi"]) == pytest.approx(expected, abs=1e-9)
    assert 0 <= out["lo"] < out["mean"] < out["hi"] <= 1


def test_seeds_that_agree_keep_their_own_interval_not_a_zero_width_one():
    out = u.bounded_mean_interval([0.26, 0.26], within=[wilson(13, 50), wilson(13, 50)], bounds=(0.0, 1.0))
    assert (out["lo"], out["hi"]) == pytest.approx(wilson(13, 50)) and out["lo"] < out["hi"]
    lone = u.bounded_mean_interval([0.5, 0.5], bounds=(0.0, 1.0))
    assert math.isnan(lone["lo"]) and "no interval" in lone["how"]


def test_a_bounded_normal_interval_is_the_logit_delta_method_and_none_on_a_bound():
    value, se = 0.97, 0.02
    q = stats.norm.ppf(0.975)
    centre, half = math.log(value / (1 - value)), q * se / (value * (1 - value))
    expected = (1 / (1 + math.exp(-(centre - half))), 1 / (1 + math.exp(-(centre + half))))
    assert u.bounded_normal_interval(value, se, 0.0, 1.0) == pytest.approx(expected, abs=1e-12)
    assert expected[1] < 1 and value + q * se > 1  # the plain normal interval would leave [0, 1]
    for bad in ((1.0, 0.01), (0.5, 0.0), (0.0, 0.1)):
        assert all(math.isnan(b) for b in u.bounded_normal_interval(*bad, 0.0, 1.0))


# ------------------------------------------------------------------ planted cases, per registered bounded metric


def _pc1_cases():
    from raygeom.numerics.spectral import pc1_readout_share_interval

    rng = np.random.default_rng(1)
    d, k = 12, 3
    basis = np.eye(d)[:, :k]
    inside = rng.normal(size=(60, d)) * 0.1
    inside[:, 0] += rng.normal(size=60) * 5  # PC1 lies in the readout subspace: share near 1
    outside = rng.normal(size=(60, d)) * 0.1
    outside[:, -1] += rng.normal(size=60) * 5  # PC1 orthogonal to it: share near 0
    middle = rng.normal(size=(60, d))
    return [
        (r["pc1_readout_share"], r["pc1_readout_share_lo"], r["pc1_readout_share_hi"])
        for r in (pc1_readout_share_interval(h, basis, seed=0, n_half=10) for h in (inside, outside, middle))
    ]


def _isotropy_cases():
    from raygeom.numerics.spectral import spectral_intervals, spectral_summary

    rng = np.random.default_rng(6)
    round_cloud = rng.normal(size=(200, 8))  # isotropy near 1
    needle = rng.normal(size=(200, 8)) * np.array([30.0, *[0.05] * 7])  # one direction: near 0
    middle = rng.normal(size=(200, 8)) * np.linspace(1.0, 4.0, 8)
    out = []
    for h in (round_cloud, needle, middle):
        r = spectral_intervals(h, seed=0, n_half=10)
        out.append((spectral_summary(h)["isotropy"], r["isotropy_lo"], r["isotropy_hi"]))
    return out


def _probe_cases():
    return [(k / n, *u.wilson_interval(k, n)) for k, n in ((0, 20), (20, 20), (37, 40), (1, 3))]


def _sample_dispersion_cases():
    from raygeom.numerics.dispersion import sample_dispersion_interval

    rng = np.random.default_rng(2)
    near = np.ones((50, 8)) + rng.normal(size=(50, 8)) * 1e-3
    near[0] += rng.normal(size=8)  # near-identical vectors and one outlier: D near 0, skewed
    opposite = np.vstack([np.ones((25, 4)), -np.ones((25, 4))]) + rng.normal(size=(50, 4)) * 1e-2  # D near 1
    return [
        (r["dispersion"], r["dispersion_lo"], r["dispersion_hi"])
        for r in (sample_dispersion_interval(h) for h in (near, opposite, rng.normal(size=(40, 16))))
    ]


def _token_dispersion_cases():
    chunks = [np.array([0.001, 0.002, 0.0005, 0.03]), np.array([1.9, 1.99, 1.97]), np.array([0.8, 0.9, 0.85, 0.7])]
    return [(float(c.mean()), (out := u.bounded_mean_interval(c, bounds=(0.0, 2.0)))["lo"], out["hi"]) for c in chunks]


def _rank_cases():
    rng = np.random.default_rng(4)
    x = rng.normal(size=40)
    out = []
    for y in (x, -x, x + rng.normal(size=40), x[:6][::-1]):
        xs = x[: len(y)]
        for method in ("fisher", "bootstrap"):
            r = u.spearman_with_ci(xs, y, method=method, n_boot=300)
            out.append((r["rho"], r["lo"], r["hi"]))
    return out


def _slice_cases():
    from raygeom.numerics.dispersion import slice_agreement_interval

    rng = np.random.default_rng(5)
    labels = np.repeat(np.arange(5), 6)
    ppl = np.exp(labels + rng.normal(size=30) * 0.05)  # slice order of perplexity fixed
    token = 1.0 - labels / 10 + rng.normal(size=30) * 0.001  # dispersion falls with it: rho = 1 in every draw
    pooled = rng.normal(size=(30, 8))
    r = slice_agreement_interval(labels, ppl, token, pooled, seed=0, n_boot=200)
    return [(1.0, r["token_lo"], r["token_hi"]), (0.0, r["sample_lo"], r["sample_hi"])]


PLANTED = {
    ("pc1", "pc1_readout_share"): _pc1_cases,
    ("probe", "accuracy"): _probe_cases,
    ("sample_dispersion", "dispersion"): _sample_dispersion_cases,
    ("token_dispersion", "token_dispersion"): _token_dispersion_cases,
    ("token_dispersion", "sample_dispersion"): _sample_dispersion_cases,
    ("token_dispersion", "group_spearman"): _rank_cases,
    ("token_dispersion", "chunk_spearman"): _rank_cases,
    ("diagnostics", "loss_share_spearman"): _rank_cases,  # diagnostics._spearman_interval is spearman_with_ci's Fisher
    ("spectral", "isotropy"): _isotropy_cases,
    **{("slices", f"{kind}_agreement_{level}"): _slice_cases for kind in ("domain", "kmeans") for level in ("token", "sample")},
}


def bounded_metrics():
    from raygeom.analyses import registry

    return [
        (name, m.column)
        for name, analysis in sorted(registry.analyses().items())
        for m in analysis.metrics
        if m.lo and m.hi and u.bounds_of(m.column) is not None
    ]


def test_every_registered_bounded_metric_with_an_interval_has_a_planted_case():
    found = bounded_metrics()
    assert ("pc1", "pc1_readout_share") in found and ("probe", "accuracy") in found  # the registry was read
    assert [m for m in found if m not in PLANTED] == []


@pytest.mark.parametrize("metric", sorted(PLANTED))
def test_planted_intervals_lie_inside_their_bounds_and_are_never_zero_width(metric):
    low, high = u.bounds_of(metric[1])
    for value, lo, hi in PLANTED[metric]():
        assert low <= value <= high
        if math.isnan(lo) or math.isnan(hi):
            assert math.isnan(lo) and math.isnan(hi)  # no interval at all, never half of one
            continue
        assert low <= lo < hi <= high, (metric, value, lo, hi)


def test_bounds_by_name():
    assert u.bounds_of("pc1_readout_share") == (0, 1) and u.bounds_of("accuracy") == (0, 1)
    assert u.bounds_of("rho_full_texts") == (-1, 1) and u.bounds_of("group_spearman") == (-1, 1)
    assert u.bounds_of("dispersion") == (0, 2) and u.bounds_of("excess_texts") == (-2, 2)
    assert u.bounds_of("z") is None and u.bounds_of("gap") is None and u.bounds_of("delta") is None
