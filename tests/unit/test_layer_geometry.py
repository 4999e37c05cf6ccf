import numpy as np
import pytest

from raygeom.errors import InputError
from raygeom.numerics.layer_geometry import (
    align_by_key,
    blindness_summary,
    loss_geometry_correlation,
    pc1_variance_fraction,
    per_sample_readout_share,
)


def test_pc1_variance_fraction_of_a_planted_spectrum():
    rng = np.random.default_rng(0)
    q = np.linalg.qr(rng.standard_normal((12, 12)))[0]
    # Orthonormal, mean-zero columns scaled to variances 9 : 1 : 1 : 1.
    z = rng.standard_normal((200, 4))
    z = np.linalg.qr(z - z.mean(axis=0))[0]
    h = (z * np.array([3.0, 1.0, 1.0, 1.0])) @ q[:4] + 5.0
    assert pc1_variance_fraction(h) == pytest.approx(9.0 / 12.0, rel=1e-6)
    with pytest.raises(InputError, match="no variance"):
        pc1_variance_fraction(np.ones((5, 3)))


def test_readout_share_is_one_inside_zero_outside_and_k_over_d_at_random():
    rng = np.random.default_rng(1)
    d, k = 40, 8
    basis = np.linalg.qr(rng.standard_normal((d, d)))[0]
    inside = rng.standard_normal((300, k)) @ basis[:, :k].T
    outside = rng.standard_normal((300, d - k)) @ basis[:, k:].T
    np.testing.assert_allclose(per_sample_readout_share(inside, basis[:, :k], r=0), 1.0, atol=1e-9)
    np.testing.assert_allclose(per_sample_readout_share(outside, basis[:, :k], r=0), 0.0, atol=1e-9)
    share = per_sample_readout_share(rng.standard_normal((2000, d)), basis[:, :k], r=1)
    assert share.mean() == pytest.approx(k / d, abs=0.01)


def test_loss_geometry_correlation_sign_and_degenerate_input():
    rng = np.random.default_rng(2)
    share = rng.uniform(size=200)
    nll = 3.0 - 2.0 * share + 0.05 * rng.standard_normal(200)
    got = loss_geometry_correlation(nll, share)
    assert got["spearman"] < -0.95 and got["pearson"] < -0.95
    assert np.isnan(loss_geometry_correlation(np.ones(10), share[:10])["spearman"])
    with pytest.raises(InputError):
        loss_geometry_correlation(nll, share[:5])


def test_alignment_matches_texts_not_positions_and_pairs_duplicates_in_order():
    keys_a = ["x", "y", "dup", "z", "dup", "only_a"]
    keys_b = ["dup", "z", "y", "x", "dup", "only_b"]
    ia, ib = align_by_key(keys_a, keys_b)
    assert [keys_a[i] for i in ia] == [keys_b[j] for j in ib] == ["x", "y", "dup", "z", "dup"]
    assert list(ia) == [0, 1, 2, 3, 4]
    assert list(ib) == [3, 2, 0, 1, 4]


def test_blindness_summary_flat_metric_against_swinging_z():
    z = np.array([5.0, 8.0, -20.0, -30.0, 4.0])
    flat = np.array([100.0, 101.0, 100.5, 99.5, 100.0])
    got = blindness_summary(z, flat)
    assert got["z_range"] == pytest.approx(38.0)
    assert got["metric_relative_range"] == pytest.approx(1.5 / 100.0)
    tracking = blindness_summary(z, 2 * z + 100)
    assert tracking["spearman_with_z"] == pytest.approx(1.0)
    with pytest.raises(InputError):
        blindness_summary([1.0, np.nan], [1.0, 2.0])
