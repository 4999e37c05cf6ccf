"""Distances that are equal in exact arithmetic are ties, on any CPU.

Expected values come from scipy's exact average-rank Spearman (``spearmanr``) on
``pdist(..., "cosine")`` in float64, with the pairs that are equal in exact
arithmetic (identical input rows) made equal floats: ``reference.cosine_distances``.
raygeom works in float32, so two *distinct* distances closer than float32
resolution could be ordered either way on different CPUs; every comparison at
1e-6 first checks that its data hold no such near-tie, so no assertion hinges on
the last bits of float32.
"""

import numpy as np
import pytest
from scipy.spatial.distance import pdist
from scipy.stats import spearmanr

from raygeom.numerics import pga
from raygeom.numerics.convergence import convergence, prepare_pair
from raygeom.numerics.convergence_grid import null_grids, observed_grid
from raygeom.numerics.convergence_grid import prepare_layer as prepare_grid_layer
from raygeom.numerics.pga import null_rhos, prepare_layer, subspace_pga, subspace_rho
from raygeom.numerics.ties import duplicate_groups
from tests import reference
from tests.unit.test_convergence import convergence_null_rhos

# Distinct distances closer than this could be ordered either way by float32 arithmetic (whose
# error here is ~1e-7) on some CPU; the data of every 1e-6 comparison have none.
NEAR_TIE = 1e-6


def duplicated(seed, n, distinct, d, vocab_factor=3):
    """``n`` float32 rows drawn from ``distinct`` anisotropic vectors (each used at least once), and a W_U."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((distinct, d)) @ rng.standard_normal((d, d))
    labels = np.concatenate([np.arange(distinct), rng.integers(0, distinct, n - distinct)])
    rng.shuffle(labels)
    return base[labels].astype(np.float32), rng.standard_normal((vocab_factor * d, d))


def distinct_gap(h, r, bases):
    """Smallest gap between distinct exact distances of the CCR-r corrected ``h`` in full space and in each basis."""
    corrected = reference.ccr(h, r)
    groups = reference.tie_groups(h)
    gaps = []
    for basis in [None, *bases]:
        x = corrected if basis is None else corrected @ basis
        values = np.unique(pdist(x[groups[0]], "cosine"))
        gaps.append(np.diff(values).min())
    return min(gaps)


# (N, distinct vectors, d, k): 7-10 distinct among 50 rows, as real corpora give at the embedding
# layer, and other shapes. The distinct vectors are few enough that no two distinct distances
# fall within float32 resolution of each other (checked per case).
SHAPES = [(50, 7, 16, 4), (50, 10, 24, 6), (50, 8, 40, 10), (30, 6, 64, 6), (120, 15, 32, 8), (80, 12, 20, 5)]
N_NULL = 20


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n, distinct, d, k", SHAPES)
@pytest.mark.parametrize("r", [0, 1])
def test_pga_with_duplicated_rows_matches_scipy_average_ranks_to_1e6(seed, n, distinct, d, k, r):
    h, w_u = duplicated(seed, n, distinct, d)
    expected = reference.pga(h, w_u, k=k, r=r, n_null=N_NULL, seed=seed)
    bases = [reference.readout(w_u, k)] + [reference.null_subspace(d, k, seed, i) for i in range(N_NULL)]
    assert distinct_gap(h, r, bases) > NEAR_TIE
    got = subspace_pga(h, w_u, k=k, r=r, n_null=N_NULL, seed=seed)
    assert got.rho_readout == pytest.approx(expected["rho_readout"], abs=1e-6)
    assert got.null_mean == pytest.approx(expected["null_mean"], abs=1e-6)
    assert got.null_std == pytest.approx(expected["null_std"], abs=1e-6)
    assert got.z == pytest.approx(expected["z"], abs=1e-6 * max(1.0, abs(expected["z"])))
    np.testing.assert_allclose(null_rhos(prepare_layer(h, r), k, seed, range(N_NULL)), expected["nulls"], atol=1e-6)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("path", ["counting sort", "exact fallback"])
def test_both_ranking_paths_keep_exact_ties(monkeypatch, seed, path):
    # Force each path on a small layer: tied pairs must share one rank in both. The counting sort
    # puts values that share a bin at one rank; with bins narrower than the smallest gap between
    # distinct distances (2M bins over a range of at most 2: width < 1e-6), only equal floats share
    # a bin here, so both paths must be exact.
    n, distinct, d, k = 50, 9, 24, 6
    monkeypatch.setattr(pga, "EXACT_RANK_PAIRS", 0)
    monkeypatch.setattr(pga, "MAX_PAIRS_PER_BIN", 10**9 if path == "counting sort" else 0)
    monkeypatch.setattr(pga, "_n_bins", lambda n_values: 1 << 21)
    h, w_u = duplicated(seed, n, distinct, d)
    expected = reference.pga(h, w_u, k=k, r=1, n_null=4, seed=seed)
    bases = [reference.readout(w_u, k)] + [reference.null_subspace(d, k, seed, i) for i in range(4)]
    assert distinct_gap(h, 1, bases) > 2 * NEAR_TIE
    got = subspace_pga(h, w_u, k=k, r=1, n_null=4, seed=seed)
    assert got.rho_readout == pytest.approx(expected["rho_readout"], abs=1e-6)
    np.testing.assert_allclose(null_rhos(prepare_layer(h, 1), k, seed, range(4)), expected["nulls"], atol=1e-6)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("n, distinct", [(600, 300), (400, 390)])
def test_large_layers_with_duplicates_on_the_counting_sort_path(seed, n, distinct):
    # Tens of thousands of distinct pairs: the counting sort runs; its quantisation keeps it within 2e-4.
    h, w_u = duplicated(seed, n, distinct, 32)
    expected = reference.pga(h, w_u, k=8, r=1, n_null=6, seed=seed)
    got = subspace_pga(h, w_u, k=8, r=1, n_null=6, seed=seed)
    assert got.rho_readout == pytest.approx(expected["rho_readout"], abs=2e-4)
    np.testing.assert_allclose(null_rhos(prepare_layer(h, 1), 8, seed, range(6)), expected["nulls"], atol=2e-4)


def test_a_row_order_that_puts_copies_in_different_gemm_tiles_changes_nothing():
    # 600 rows span three 256-row pair blocks: copies of one vector land in rectangles and in
    # diagonal blocks, computed by different GEMM calls. Ties must still be exact ties.
    h, w_u = duplicated(4, 600, 9, 24)
    basis = reference.readout(w_u, 6)
    order = np.random.default_rng(0).permutation(600)
    layer, permuted = prepare_layer(h, 1), prepare_layer(h[order], 1)
    assert layer.full_ranks_norm == pytest.approx(permuted.full_ranks_norm, rel=1e-12)
    expected = spearmanr(
        *[reference.cosine_distances(x, reference.tie_groups(h)) for x in (reference.ccr(h, 1), reference.ccr(h, 1) @ basis)]
    )[0]
    assert subspace_rho(layer, basis) == pytest.approx(expected, abs=1e-6)
    assert subspace_rho(permuted, basis) == pytest.approx(expected, abs=1e-6)


def test_duplicate_groups_are_byte_equality_in_order_of_first_row():
    x = np.array([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0], [5.0, 6.0], [3.0, 4.0], [1.0, 2.0]], dtype=np.float32)
    np.testing.assert_array_equal(duplicate_groups(x), [0, 1, 0, 2, 1, 0])
    assert duplicate_groups(x[[0, 1, 3]]) is None
    # -0.0 == 0.0 but the bytes differ: a tie missed, never a false one.
    assert duplicate_groups(np.array([[0.0, 1.0], [-0.0, 1.0], [2.0, 1.0]])) is None
    assert duplicate_groups(x + np.float32(1e-7) * np.arange(6)[:, None]) is None


def test_layers_without_duplicates_keep_the_plain_layout():
    h, _ = duplicated(0, 40, 40, 12)
    assert prepare_layer(h, 1).groups is None
    layer = prepare_layer(np.repeat(h[:5], 3, axis=0), 1)
    np.testing.assert_array_equal(layer.groups, np.repeat(np.arange(5), 3))
    # Rows identical in H are bitwise identical after CCR.
    assert all(np.array_equal(layer.corrected[3 * g], layer.corrected[3 * g + j]) for g in range(5) for j in (1, 2))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("shared", [True, False])
def test_convergence_with_duplicated_rows_matches_scipy_average_ranks(seed, shared):
    # Either both models see the same duplicates (the same texts), or B's duplicates differ from A's
    # (e.g. texts ending in the same token in one tokenizer only).
    n, k = 50, 5
    h_a, _ = duplicated(seed, n, 8, 20)
    if shared:
        h_b = (h_a.astype(np.float64) @ np.random.default_rng(seed + 10).standard_normal((20, 24))).astype(np.float32)
    else:
        h_b, _ = duplicated(seed + 10, n, 11, 24)
    basis_a = np.linalg.qr(np.random.default_rng(seed).standard_normal((20, k)))[0]
    basis_b = np.linalg.qr(np.random.default_rng(seed + 1).standard_normal((24, k)))[0]
    expected = reference.convergence(h_a, h_b, basis_a, basis_b, k, r=1, n_null=6, seed=seed)
    got = convergence(h_a, h_b, basis_a, basis_b, k, r=1, n_null=6, seed=seed)
    for key in ("rho_full", "rho_readout", "null_mean", "null_std"):
        assert got[key] == pytest.approx(expected[key], abs=1e-6)
    np.testing.assert_allclose(convergence_null_rhos(prepare_pair(h_a, h_b, 1), k, seed, range(6)), expected["nulls"], atol=1e-6)
    # The factorised grid gives the same cell.
    grid = observed_grid([prepare_grid_layer(h_a, 1)], [prepare_grid_layer(h_b, 1)], basis_a, basis_b, k)
    assert grid["rho_full"][0, 0] == pytest.approx(expected["rho_full"], abs=1e-6)
    assert grid["rho_readout"][0, 0] == pytest.approx(expected["rho_readout"], abs=1e-6)
    nulls = null_grids([prepare_grid_layer(h_a, 1)], [prepare_grid_layer(h_b, 1)], k, seed, range(6))
    np.testing.assert_allclose(nulls[:, 0, 0], expected["nulls"], atol=1e-6)


@pytest.mark.parametrize("rows", [[0, 1, 0, 1, 1, 0], [0, 1, 2, 1, 1, 0], [0, 1, 2]])
def test_tiny_layers_and_two_or_three_distinct_vectors(rows):
    # N = 3 has 3 pairs and two distinct vectors have one distance besides the zeros: both used to
    # overflow the counting sort's bin count.
    rng = np.random.default_rng(len(rows))
    h, w_u = rng.standard_normal((3, 8))[rows], rng.standard_normal((30, 8))
    expected = reference.pga(h, w_u, k=3, r=0, n_null=5, seed=1)
    got = subspace_pga(h, w_u, k=3, r=0, n_null=5, seed=1)
    assert got.rho_readout == pytest.approx(expected["rho_readout"], abs=1e-6)
    np.testing.assert_allclose(null_rhos(prepare_layer(h, 0), 3, 1, range(5)), expected["nulls"], atol=1e-6)
