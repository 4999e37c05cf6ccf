"""Sample-level dispersion with its jackknife interval: against scipy's pairwise cosine distances and a brute-force
leave-one-out loop, on planted geometry, its invariances, and the interval's calibration over fresh samples."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist

from raygeom.errors import InputError
from raygeom.numerics.dispersion import sample_dispersion_interval


def brute(h: np.ndarray) -> tuple[float, float]:
    d = pdist(h, "cosine")
    n = h.shape[0]
    leave = np.array([pdist(np.delete(h, i, axis=0), "cosine").mean() for i in range(n)])
    return d.mean(), np.sqrt((n - 1) / n * ((leave - leave.mean()) ** 2).sum())


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shape", [(5, 3), (40, 16), (120, 64)])
def test_equals_scipy_pairs_and_brute_force_jackknife(seed, shape):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=shape) + rng.normal(size=shape[1])  # an offset: D well below 1
    value, se = brute(h)
    out = sample_dispersion_interval(h)
    assert out["dispersion"] == pytest.approx(value, rel=1e-10)
    assert out["dispersion_se"] == pytest.approx(se, rel=1e-8)
    assert out["dispersion_lo"] < out["dispersion"] < out["dispersion_hi"]
    # the interval is the normal one on the logit scale of D / 2 (it stays inside [0, 2]), written out here
    p = value / 2
    centre, half = np.log(p / (1 - p)), 1.959964 * se / (2 * p * (1 - p))
    expected = [2 / (1 + np.exp(-(centre + s * half))) for s in (-1, 1)]
    assert [out["dispersion_lo"], out["dispersion_hi"]] == pytest.approx(expected, rel=1e-5)


def test_planted_geometry():
    same = np.tile(np.arange(1.0, 6.0), (10, 1))
    assert sample_dispersion_interval(same)["dispersion"] == pytest.approx(0.0, abs=1e-12)
    assert sample_dispersion_interval(same)["dispersion_se"] == pytest.approx(0.0, abs=1e-12)
    onehot = np.eye(8)
    assert sample_dispersion_interval(onehot)["dispersion"] == pytest.approx(1.0)
    pairs = np.vstack([np.eye(4), -np.eye(4)])  # 28 pairs: 4 at distance 2, 24 at 1
    assert sample_dispersion_interval(pairs)["dispersion"] == pytest.approx((4 * 2 + 24) / 28)


def test_invariant_to_row_scale_and_rotation_and_accepts_torch():
    rng = np.random.default_rng(4)
    h = rng.normal(size=(30, 12)) + 1.0
    q, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    base = sample_dispersion_interval(h)
    moved = sample_dispersion_interval((h * rng.uniform(0.1, 10, size=(30, 1))) @ q)
    assert moved["dispersion"] == pytest.approx(base["dispersion"], rel=1e-10)
    assert moved["dispersion_se"] == pytest.approx(base["dispersion_se"], rel=1e-8)
    bf16 = sample_dispersion_interval(torch.tensor(h, dtype=torch.bfloat16, requires_grad=True))
    assert bf16["dispersion"] == pytest.approx(base["dispersion"], abs=2e-2)


def test_interval_is_calibrated_over_fresh_samples():
    """The jackknife se matches the spread of D over fresh samples of one population, and the 95 % interval covers
    the population's D (from a large sample) at about the nominal rate."""
    rng = np.random.default_rng(9)
    mean = rng.normal(size=8)
    truth = sample_dispersion_interval(rng.normal(size=(20000, 8)) + mean)["dispersion"]
    draws = [sample_dispersion_interval(rng.normal(size=(60, 8)) + mean) for _ in range(400)]
    spread = np.std([d["dispersion"] for d in draws], ddof=1)
    assert np.median([d["dispersion_se"] for d in draws]) == pytest.approx(spread, rel=0.15)
    covered = sum(d["dispersion_lo"] <= truth <= d["dispersion_hi"] for d in draws)
    assert 0.90 <= covered / 400 <= 0.98


@pytest.mark.parametrize("bad", [np.ones((2, 3)), np.ones(5), np.array([[1.0, np.nan], [0, 1], [1, 1]])])
def test_refuses_what_it_cannot_score(bad):
    with pytest.raises(InputError):
        sample_dispersion_interval(bad)
