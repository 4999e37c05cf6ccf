"""Intervals over texts for the spectral metrics (issue 45 item 5: every analysis carries its uncertainty, or says it
cannot). The jackknife standard error is checked against the spread of the metric over independent samples of the
same distribution, RankMe's computed here from its definition (Garrido et al. 2023) with numpy alone."""

import numpy as np
import pytest

from raygeom.numerics.spectral import SPECTRAL_INTERVALS, spectral_intervals, spectral_summary


def rankme_by_definition(h: np.ndarray) -> float:
    s = np.linalg.svd(h, compute_uv=False)
    p = s / s.sum() + 1e-7
    return float(np.exp(-(p * np.log(p)).sum()))


def sample(rng, n: int, d: int) -> np.ndarray:
    return rng.normal(size=(n, d)) * np.linspace(1.0, 3.0, d) + 0.5


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", [(400, 12), (300, 24)])
def test_the_standard_error_matches_the_spread_over_independent_samples(seed, shape):
    rng = np.random.default_rng(seed)
    n, d = shape
    spread = {
        "rankme": np.std([rankme_by_definition(sample(rng, n, d)) for _ in range(150)], ddof=1),
        **{m: np.std([spectral_summary(sample(rng, n, d))[m] for _ in range(150)], ddof=1) for m in SPECTRAL_INTERVALS[1:]},
    }
    estimates = [spectral_intervals(sample(rng, n, d), seed=t, n_half=20) for t in range(12)]
    for metric in SPECTRAL_INTERVALS:
        ratio = np.mean([e[f"{metric}_se"] for e in estimates]) / spread[metric]
        assert 0.55 < ratio < 1.8, (metric, ratio)


def test_the_interval_holds_the_value_and_is_ordered():
    h = sample(np.random.default_rng(3), 300, 16)
    out, full = spectral_intervals(h), spectral_summary(h)
    for metric in SPECTRAL_INTERVALS:
        assert out[f"{metric}_lo"] < full[metric] < out[f"{metric}_hi"], metric
    assert 0 < out["isotropy_lo"] and out["isotropy_hi"] < 1 and out["condition_number_lo"] > 0
    assert out["spectral_half_samples"] == 10 and out["spectral_interval_note"] == ""


@pytest.mark.parametrize("n", [10, 39])
def test_no_interval_where_a_half_holds_fewer_texts_than_dimensions(n):
    out = spectral_intervals(sample(np.random.default_rng(0), n, 20))
    assert all(np.isnan(out[f"{m}_{part}"]) for m in SPECTRAL_INTERVALS for part in ("se", "lo", "hi"))
    assert out["spectral_half_samples"] == 0 and "below d=20" in out["spectral_interval_note"]


def test_the_same_seed_gives_the_same_interval_and_another_seed_another():
    h = sample(np.random.default_rng(4), 200, 8)
    assert repr(spectral_intervals(h, seed=5)) == repr(spectral_intervals(h, seed=5))  # NaN where alpha-ReQ has none
    assert spectral_intervals(h, seed=5)["rankme_se"] != spectral_intervals(h, seed=6)["rankme_se"]
