import numpy as np
import pytest
from scipy.stats import ortho_group

from raygeom.errors import InputError
from raygeom.numerics.convergence import (
    convergence,
    convergence_result,
    null_subspaces,
    prepare_pair,
)
from tests import reference


def convergence_null_rhos(pair, k: int, seed: int, indices) -> np.ndarray:
    """Convergence rho in the null subspaces with the given indices (null ``i`` depends only on (seed, i)), from the
    scorer the units use: what these tests compare null by null."""
    from raygeom.numerics.convergence import _PairScorer

    scorer = _PairScorer(pair, None)
    return np.array([scorer.rho_of_null(k, seed, i) for i in indices], dtype=np.float64)


def related_models(seed, n, d_a, d_b, k):
    """Two models' H for the same inputs: B is a noisy linear image of A, both anisotropic."""
    rng = np.random.default_rng(seed)
    h_a = rng.standard_normal((n, d_a)) @ rng.standard_normal((d_a, d_a)) + rng.standard_normal(d_a)
    h_b = h_a @ rng.standard_normal((d_a, d_b)) + 2.0 * rng.standard_normal((n, d_b))
    basis_a = np.linalg.qr(rng.standard_normal((d_a, k)))[0]
    basis_b = np.linalg.qr(rng.standard_normal((d_b, k)))[0]
    return h_a, h_b, basis_a, basis_b


SHAPES = [(40, 20, 24, 5), (60, 30, 30, 8), (50, 16, 40, 4)]  # (N, d_a, d_b, k)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n, d_a, d_b, k", SHAPES)
@pytest.mark.parametrize("r", [0, 1, 2])
def test_matches_plain_pdist_spearmanr_reference(seed, n, d_a, d_b, k, r):
    h_a, h_b, basis_a, basis_b = related_models(seed, n, d_a, d_b, k)
    expected = reference.convergence(h_a, h_b, basis_a, basis_b, k, r=r, n_null=8, seed=seed)
    got = convergence(h_a, h_b, basis_a, basis_b, k, r=r, n_null=8, seed=seed)
    # float32 distances: agreement within the same 2e-4 that the PGA fast path meets.
    assert got["rho_full"] == pytest.approx(expected["rho_full"], abs=2e-4)
    assert got["rho_readout"] == pytest.approx(expected["rho_readout"], abs=2e-4)
    assert got["null_mean"] == pytest.approx(expected["null_mean"], abs=2e-4)
    assert got["null_std"] == pytest.approx(expected["null_std"], abs=2e-4)
    np.testing.assert_allclose(convergence_null_rhos(prepare_pair(h_a, h_b, r), k, seed, range(8)), expected["nulls"], atol=2e-4)
    assert (got["k"], got["r"], got["n"], got["n_null"], got["seed"]) == (k, r, n, 8, seed)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("r", [0, 1, 3])
def test_rotated_copy_converges_perfectly(seed, r):
    # CCR commutes with a rotation, and cosine distances are rotation invariant.
    h_a, _, basis_a, _ = related_models(seed, 80, 24, 24, 6)
    rotation = ortho_group.rvs(24, random_state=seed)
    got = convergence(h_a, h_a @ rotation, basis_a, rotation.T @ basis_a, 6, r=r, n_null=5, seed=seed)
    assert got["rho_full"] == pytest.approx(1.0, abs=1e-6)
    assert got["rho_readout"] == pytest.approx(1.0, abs=1e-6)
    assert got["null_mean"] < 1.0  # independent random subspaces of the two copies


@pytest.mark.parametrize("seed", range(4))
def test_independent_models_do_not_converge(seed):
    rng = np.random.default_rng(seed)
    h_a, h_b = rng.standard_normal((100, 30)), rng.standard_normal((100, 40))
    basis_a, basis_b = np.eye(30)[:, :5], np.eye(40)[:, :5]
    got = convergence(h_a, h_b, basis_a, basis_b, 5, n_null=0)
    # Spread seen over seeds is ~0.01; pairs share points, so this is looser than 1/sqrt(#pairs).
    assert abs(got["rho_full"]) < 0.06


def test_scaling_either_model_changes_nothing():
    h_a, h_b, basis_a, basis_b = related_models(3, 50, 20, 25, 4)
    base = convergence(h_a, h_b, basis_a, basis_b, 4, n_null=6, seed=2)
    scaled = convergence(1e-3 * h_a, 1e4 * h_b, basis_a, basis_b, 4, n_null=6, seed=2)
    for key in ("rho_full", "rho_readout", "null_mean", "null_std"):
        assert scaled[key] == pytest.approx(base[key], abs=1e-5)


def test_null_split_into_chunks_gives_identical_rhos():
    h_a, h_b, _, _ = related_models(0, 70, 20, 28, 5)
    pair = prepare_pair(h_a, h_b, 1)
    whole = convergence_null_rhos(pair, 5, 11, range(40))
    for n_chunks in (1, 7, 40):
        parts = np.array_split(np.arange(40), n_chunks)
        joined = np.concatenate([convergence_null_rhos(pair, 5, 11, part) for part in parts])
        np.testing.assert_array_equal(joined, whole)


def test_gathered_chunks_give_the_same_result_as_one_call():
    h_a, h_b, basis_a, basis_b = related_models(1, 50, 20, 20, 4)
    whole = convergence(h_a, h_b, basis_a, basis_b, 4, n_null=12, seed=5)
    parts = convergence(h_a, h_b, basis_a, basis_b, 4, seed=5, null_indices=[])
    assert np.isnan(parts["null_mean"]) and parts["n_null"] == 0
    pair = prepare_pair(h_a, h_b, 1)
    nulls = np.concatenate([convergence_null_rhos(pair, 4, 5, chunk) for chunk in (range(0, 5), range(5, 12))])
    gathered = convergence_result(parts["rho_full"], parts["rho_readout"], nulls, k=4, r=1, n=50, seed=5)
    assert gathered == whole
    offset = convergence(h_a, h_b, basis_a, basis_b, 4, seed=5, null_indices=range(5, 12))
    assert offset["null_mean"] == pytest.approx(nulls[5:].mean(), abs=1e-12)


@pytest.mark.parametrize("d_a, d_b", [(30, 30), (20, 35)])
def test_null_draws_are_seeded_per_index_and_differ_between_models(d_a, d_b):
    q_a, q_b = null_subspaces(d_a, d_b, 5, seed=3, index=9)
    np.testing.assert_array_equal(q_a, reference.null_subspace(d_a, 5, 3, 9))
    np.testing.assert_array_equal(q_b, reference.null_subspace(d_b, 5, 3 + 2**32, 9))
    np.testing.assert_allclose(q_b.T @ q_b, np.eye(5), atol=1e-12)
    if d_a == d_b:
        assert not np.allclose(q_a, q_b)
    assert not np.allclose(q_a, null_subspaces(d_a, d_b, 5, seed=3, index=8)[0])


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: convergence(np.ones((10, 5)), np.ones((9, 5)), np.eye(5)[:, :2], np.eye(5)[:, :2], 2), "same N"),
        (lambda: convergence(np.ones((10, 5)), np.ones((10, 6)), np.eye(5), np.eye(6)[:, :5], 5), "k must satisfy"),
        (lambda: convergence(np.ones((2, 5)), np.ones((2, 5)), np.eye(5)[:, :2], np.eye(5)[:, :2], 2), "at least 3"),
        (lambda: convergence(np.ones((10, 5)), np.ones((10, 6)), np.eye(5)[:, :2], np.eye(5)[:, :2], 2), "basis_b has 5 rows"),
        (lambda: convergence(np.ones((10, 5)), np.ones((10, 5)), np.eye(5)[:, :1], np.eye(5)[:, :2], 2), "fewer than k"),
        (lambda: convergence(np.full((10, 5), np.nan), np.ones((10, 5)), np.eye(5)[:, :2], np.eye(5)[:, :2], 2), "NaN"),
        (lambda: convergence(np.ones((10, 5)), np.ones((10, 5)), np.eye(5)[:, :2], np.eye(5)[:, :2], 2, seed=-1), "seed"),
        (lambda: null_subspaces(5, 5, 2, 2**32, 0), "seed"),
    ],
)
def test_bad_input_raises_input_error(make, message):
    with pytest.raises(InputError, match=message):
        make()
