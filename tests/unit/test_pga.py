import numpy as np
import pytest
from scipy.spatial.distance import pdist
from scipy.stats import ortho_group, spearmanr

from raygeom.errors import InputError
from raygeom.numerics import (
    ccr,
    null_rhos,
    pairwise_cosine_distances,
    prepare_layer,
    random_subspace,
    readout_basis,
    subspace_pga,
    subspace_rho,
)
from tests import reference


def planted(seed, n=150, d=64, k=4, where="readout", vocab=200):
    """W_U whose top-k right singular vectors are the first k axes, and H with
    cluster structure either inside that readout subspace or orthogonal to it."""
    rng = np.random.default_rng(seed)
    w_u = rng.standard_normal((vocab, d)) * 0.1
    w_u[:, :k] += rng.standard_normal((vocab, k)) * 5.0
    centres = rng.standard_normal((6, d))
    labels = rng.integers(0, 6, n)
    h = rng.standard_normal((n, d)) * 0.5
    if where == "readout":
        h[:, :k] += 1.0 * centres[labels, :k]
    elif where == "orthogonal":
        h[:, k:] += 6.0 * centres[labels, k:]
    return h, w_u


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shape", [(60, 20, 5), (120, 40, 10), (90, 33, 4)])
@pytest.mark.parametrize("r", [0, 1, 3])
def test_matches_plain_scipy_reference(seed, shape, r):
    n, d, k = shape
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((n, d)) @ rng.standard_normal((d, d))  # anisotropic
    w_u = rng.standard_normal((3 * d, d))
    expected = reference.pga(h, w_u, k=k, r=r, n_null=30, seed=seed)
    got = subspace_pga(h, w_u, k=k, r=r, n_null=30, seed=seed)
    assert got.rho_readout == pytest.approx(expected["rho_readout"], abs=2e-4)
    assert got.null_mean == pytest.approx(expected["null_mean"], abs=2e-4)
    assert abs(got.z - expected["z"]) <= 0.05


def test_float32_fast_path_within_dz_005_of_float64_reference_on_larger_data():
    # 1,000 samples: enough pairs (499,500) that the binned ranking is the one used.
    h, w_u = planted(7, n=1000, d=96, k=12)
    expected = reference.pga(h, w_u, k=12, r=1, n_null=20, seed=3)
    got = subspace_pga(h, w_u, k=12, r=1, n_null=20, seed=3)
    assert abs(got.z - expected["z"]) <= 0.05
    np.testing.assert_allclose(null_rhos(prepare_layer(h, 1), 12, 3, range(20)), expected["nulls"], atol=1e-4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_structure_in_readout_gives_large_positive_z(seed):
    h, w_u = planted(seed, where="readout")
    assert subspace_pga(h, w_u, k=4, n_null=50, seed=seed).z > 5


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dominant_structure_orthogonal_to_readout_gives_negative_z(seed):
    h, w_u = planted(seed, where="orthogonal")
    assert subspace_pga(h, w_u, k=4, n_null=50, seed=seed).z < -2


@pytest.mark.parametrize("seed", range(5))
def test_isotropic_noise_gives_small_z(seed):
    h, w_u = planted(seed, where="none", n=200)
    assert abs(subspace_pga(h, w_u, k=4, n_null=60, seed=seed).z) < 3.5


@pytest.mark.parametrize("seed", [0, 1])
def test_global_rotation_of_h_and_w_u(seed):
    h, w_u = planted(seed)
    rot = ortho_group.rvs(h.shape[1], random_state=seed)
    base = subspace_pga(h, w_u, k=4, n_null=300, seed=seed)
    rotated = subspace_pga(h @ rot, w_u @ rot, k=4, n_null=300, seed=seed)
    # rho_readout is exactly invariant; the nulls are other draws of the same
    # distribution, so their mean agrees within sampling error.
    assert rotated.rho_readout == pytest.approx(base.rho_readout, abs=1e-5)
    assert abs(rotated.null_mean - base.null_mean) <= 4 * base.null_std * np.sqrt(2 / 300)
    assert abs(rotated.z - base.z) <= 0.25 * abs(base.z) + 0.5


@pytest.mark.parametrize("scale", [1e-3, 7.0, 1e4])
def test_scaling_h_and_w_u_leaves_z_unchanged(scale):
    h, w_u = planted(4)
    base = subspace_pga(h, w_u, k=4, n_null=30, seed=1)
    scaled = subspace_pga(h * scale, w_u / scale, k=4, n_null=30, seed=1)
    assert scaled.z == pytest.approx(base.z, abs=1e-3)


def test_null_split_into_chunks_gives_identical_rhos():
    layer = prepare_layer(planted(0)[0], 1)
    whole = null_rhos(layer, 4, 11, range(100))
    for n_chunks in (1, 7, 100):
        parts = np.array_split(np.arange(100), n_chunks)
        joined = np.concatenate([null_rhos(layer, 4, 11, part) for part in parts])
        np.testing.assert_array_equal(joined, whole)


def test_random_subspace_is_orthonormal_and_seeded_per_index():
    q = random_subspace(30, 5, seed=3, index=9)
    np.testing.assert_allclose(q.T @ q, np.eye(5), atol=1e-12)
    np.testing.assert_array_equal(q, reference.null_subspace(30, 5, 3, 9))
    assert not np.allclose(q, random_subspace(30, 5, seed=3, index=8))


def test_readout_basis_matches_svd_up_to_sign():
    w_u = np.random.default_rng(0).standard_normal((300, 40))
    basis, singular = readout_basis(w_u, 6)
    _, s, vt = np.linalg.svd(w_u, full_matrices=False)
    np.testing.assert_allclose(singular, s[:6], rtol=1e-10)
    np.testing.assert_allclose(np.abs(basis.T @ vt[:6].T), np.eye(6), atol=1e-8)


@pytest.mark.parametrize("r", [0, 1, 4])
def test_ccr_matches_svd_projection(r):
    h = np.random.default_rng(r).standard_normal((50, 70)) @ np.diag(np.linspace(5, 0.1, 70))
    np.testing.assert_allclose(ccr(h, r), reference.ccr(h, r), atol=1e-8)


def test_pairwise_cosine_distances_match_pdist():
    from scipy.spatial.distance import pdist

    x = np.random.default_rng(1).standard_normal((40, 9))
    np.testing.assert_allclose(pairwise_cosine_distances(x), pdist(x, "cosine"), atol=1e-12)


def test_ties_share_their_mean_rank():
    # Duplicated rows produce many exactly tied distances, which takes the exact-rank path.
    base = np.random.default_rng(2).standard_normal((20, 12))
    h = np.repeat(base, 5, axis=0)
    layer = prepare_layer(h, 0)
    basis = np.eye(12)[:, :4]
    expected = spearmanr(
        pairwise_cosine_distances(layer.corrected.astype(np.float64)),
        pairwise_cosine_distances(layer.corrected.astype(np.float64) @ basis),
    )[0]
    assert subspace_rho(layer, basis) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: subspace_pga(np.ones((10, 5)), np.ones((20, 5)), k=5), "k must satisfy"),
        (lambda: subspace_pga(np.ones((2, 5)), np.random.default_rng(0).standard_normal((20, 5)), k=2), "at least 3 samples"),
        (lambda: subspace_pga(np.random.default_rng(0).random((10, 5)), np.ones((20, 5)), k=2), "rank 1, below k = 2"),
        (lambda: subspace_pga(np.full((10, 5), np.nan), np.ones((20, 5)), k=2), "NaN or inf"),
        (lambda: subspace_pga(np.ones((10, 5)), np.ones((20, 4)), k=2), "W_U has d=4"),
        (lambda: ccr(np.random.default_rng(0).random((10, 5)), 5), "CCR rank"),
        (lambda: prepare_layer(np.tile(np.arange(5.0), (10, 1)) + 1e-9, 1), "same vector"),
    ],
)
def test_bad_input_raises_input_error(make, message):
    with pytest.raises(InputError, match=message):
        make()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ties", [False, True])
def test_average_ranks_match_scipy_rankdata(seed, ties):
    from scipy.stats import rankdata

    from raygeom.numerics.pga import average_ranks

    rng = np.random.default_rng(seed)
    values = rng.integers(0, 50, 1000).astype(np.float32) if ties else rng.random(1000).astype(np.float32)
    np.testing.assert_array_equal(average_ranks(values), rankdata(values, method="average"))


@pytest.mark.parametrize("n, block", [(3, 256), (30, 7), (31, 10), (40, 39), (64, 16), (257, 256)])
def test_pair_layout_holds_every_pair_once_with_its_pdist_position(n, block):
    import torch
    from scipy.spatial.distance import pdist

    from raygeom.numerics.pga import PairLayout

    x = np.random.default_rng(n).standard_normal((n, 5)).astype(np.float32)
    layout = PairLayout(n, block)
    index = layout.pdist_index
    assert np.array_equal(np.sort(index), np.arange(n * (n - 1) // 2))
    products = layout.fill(torch.from_numpy(x), torch.from_numpy(x), torch.empty(layout.n_pairs)).numpy()
    expected = pdist(x.astype(np.float64), lambda a, b: a @ b)[index]
    np.testing.assert_allclose(products, expected, rtol=1e-5, atol=1e-5)


def test_the_result_carries_z_uncertainty_of_its_own_nulls():
    from raygeom.numerics.uncertainty import z_uncertainty

    h, w_u = planted(3, n=120)
    got = subspace_pga(h, w_u, k=4, n_null=40, seed=5)
    nulls = null_rhos(prepare_layer(h, 1), 4, 5, range(40))
    expected = z_uncertainty(got.rho_readout, nulls, 5)
    for name in ("z_se", "z_lo", "z_hi", "z_half_width", "p_upper", "p_lower"):
        assert getattr(got, name) == pytest.approx(expected[name], rel=1e-12), name
    assert got.z_lo < got.z < got.z_hi
    assert set(got.to_dict()) >= {"z", "z_se", "z_lo", "z_hi", "p_upper", "p_lower"}


@pytest.mark.parametrize("seed", [0, 1])
def test_read_only_layers_as_ray_hands_them_out_score_the_same_and_warn_nothing(seed):
    import warnings

    h = np.random.default_rng(seed).normal(size=(30, 16)).astype(np.float32)
    writable = null_rhos(prepare_layer(h, 1), 4, seed, range(5))
    layer = prepare_layer(h, 1)
    for array in (layer.centred_full_ranks, layer.corrected):
        array.setflags(write=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read_only = null_rhos(layer, 4, seed, range(5))
    np.testing.assert_array_equal(read_only, writable)
    assert [str(w.message) for w in caught] == []


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("budget", [None, 1])  # the default budget, and one that keeps a single null at a time
def test_nulls_drawn_once_per_process_score_bit_for_bit_as_drawn_afresh(monkeypatch, seed, budget):
    """A null's Gaussian and Cholesky inverse are kept across layers and calls: every score equals the one from an
    empty cache, in any order, whatever the cache evicts; and the scores still match the plain QR + scipy loop."""
    from raygeom.numerics import pga as pga_module

    rng = np.random.default_rng(seed)
    raw = [rng.standard_normal((70, 24)) for _ in range(3)]
    layers = [prepare_layer(h, 1) for h in raw]
    monkeypatch.setattr(pga_module, "_null_factor_cache", type(pga_module._null_factor_cache)())
    monkeypatch.setattr(pga_module, "_null_factor_bytes", 0)
    fresh = []
    for layer in layers:
        pga_module._null_factor_cache.clear()
        pga_module._null_factor_bytes = 0
        fresh.append(null_rhos(layer, 5, seed, range(12)))
    if budget is not None:
        pga_module._null_factor_cache.clear()
        pga_module._null_factor_bytes = 0
        monkeypatch.setattr(pga_module, "NULL_FACTOR_BYTES", budget)
    for layer, expected in zip(layers, fresh):  # warm from the other layers, and reversed order
        np.testing.assert_array_equal(null_rhos(layer, 5, seed, range(12)), expected)
        np.testing.assert_array_equal(null_rhos(layer, 5, seed, range(11, -1, -1))[::-1], expected)
    assert len(pga_module._null_factor_cache) == (12 if budget is None else 1)
    corrected = reference.ccr(raw[0], 1)
    plain = [
        spearmanr(pdist(corrected, "cosine"), pdist(corrected @ reference.null_subspace(24, 5, seed, i), "cosine"))[0]
        for i in range(12)
    ]
    np.testing.assert_allclose(fresh[0], plain, atol=2e-4)


def test_scoring_runs_every_thread_pool_at_one_thread_and_restores_them(monkeypatch):
    """Each null is scored with torch and every BLAS/OpenMP pool at one thread (the pools are found once per set of
    loaded modules, not per call), and the caller's settings come back afterwards, call after call."""
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    from raygeom.numerics import pga as pga_module

    seen = []
    score = pga_module._SubspaceScorer.rho_of_null

    def watched(self, *args):
        seen.append((torch.get_num_threads(), sorted({pool["num_threads"] for pool in threadpool_info()})))
        return score(self, *args)

    monkeypatch.setattr(pga_module._SubspaceScorer, "rho_of_null", watched)
    layer = prepare_layer(planted(0)[0], 1)
    before_torch = torch.get_num_threads()
    with threadpool_limits(2):
        torch.set_num_threads(2)
        before = sorted((pool["filepath"], pool["num_threads"]) for pool in threadpool_info())
        for _ in range(3):
            null_rhos(layer, 4, 0, range(2))
            assert torch.get_num_threads() == 2
            assert sorted((pool["filepath"], pool["num_threads"]) for pool in threadpool_info()) == before
    torch.set_num_threads(before_torch)
    assert seen == [(1, [1])] * 6
