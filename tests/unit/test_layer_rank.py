"""Score only what has the rank to be scored: planted low-rank layers, checked against numpy's own SVD.

Expected ranks come from how each layer is built (and numpy.linalg.svd on it), never from raygeom.numerics.rank.
"""

import numpy as np
import pytest
from scipy.spatial.distance import pdist

from raygeom.errors import InputError
from raygeom.numerics import rank

N, D = 60, 64


def planted(rank_: int, seed: int = 0, n: int = N, d: int = D, offset: float = 3.0) -> np.ndarray:
    """N x d float32 rows spanning an affine subspace of dimension ``rank_`` (so the centred layer has that rank)."""
    rng = np.random.default_rng(seed)
    return (offset + rng.standard_normal((n, rank_)) @ rng.standard_normal((rank_, d))).astype(np.float32)


def noisy(h: np.ndarray, relative: float, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (h * (1.0 + relative * rng.standard_normal(h.shape))).astype(np.float32)


def numpy_rank(h: np.ndarray) -> tuple[int, int]:
    """The independent reference: numpy's SVD of the float64 centred layer with the documented tolerance, and the
    distinct rows by numpy.unique."""
    centred = h.astype(np.float64) - h.astype(np.float64).mean(axis=0)
    s = np.linalg.svd(centred, compute_uv=False)
    tol = max(h.shape) * np.finfo(np.float32).eps * max(s[0], np.abs(h).max())
    return int((s > tol).sum()), len(np.unique(h, axis=0))


@pytest.mark.parametrize("planted_rank", [1, 2, 9, 10, 35, 59])
def test_planted_rank_is_found_and_1e6_noise_does_not_change_it(planted_rank):
    h = planted(planted_rank, seed=planted_rank)
    found = rank.layer_rank(h)
    assert found.rank == planted_rank == numpy_rank(h)[0]
    assert found.distinct_rows == N
    s = np.linalg.svd(h.astype(np.float64) - h.astype(np.float64).mean(axis=0), compute_uv=False)
    np.testing.assert_allclose(found.singular_values[:planted_rank], s[:planted_rank], rtol=1e-9)
    for seed in range(3):
        layer = noisy(h, 1e-6, seed)
        assert rank.layer_rank(layer).rank == planted_rank
        # numpy's float64 default tolerance counts the noise as directions: the float32 one is what keeps the verdict.
        assert np.linalg.matrix_rank(layer.astype(np.float64) - layer.astype(np.float64).mean(axis=0)) == N - 1


def test_duplicate_texts_bound_the_rank():
    # 60 texts with 35 distinct ones (NOTES: centred rank 34), from full-rank distinct rows.
    distinct = np.random.default_rng(4).standard_normal((35, D)).astype(np.float32)
    h = distinct[np.r_[np.arange(35), np.random.default_rng(5).integers(0, 35, N - 35)]]
    found = rank.layer_rank(h)
    assert (found.rank, found.distinct_rows) == numpy_rank(h) == (34, 35)
    assert found.after_ccr(34) == 0
    with pytest.raises(InputError, match=r"^rank 0 after CCR-34, below k \+ 2 = 10 \(centred rank 34, 35 distinct of 60 rows\)"):
        rank.check_rank(found, 34, 8)
    rank.check_rank(found, 1, 8)  # 33 left: scored


@pytest.mark.parametrize("r, k, scored", [(1, 8, True), (2, 8, True), (3, 8, False), (0, 11, False), (0, 10, True)])
def test_the_verdict_is_rank_after_ccr_against_k_plus_2(r, k, scored):
    h = planted(12, seed=7)  # rank 12: after CCR-r, 12 - r directions; scored when 12 - r >= k + 2
    for layer in (h, noisy(h, 1e-6), noisy(h, 1e-6, seed=9)):
        info = rank.layer_rank(layer)
        if scored:
            rank.check_rank(info, r, k)
        else:
            with pytest.raises(InputError, match=f"^rank {12 - r} after CCR-{r}, below k \\+ 2 = {k + 2}"):
                rank.check_rank(info, r, k)


def test_three_distinct_texts_of_sixty_are_refused_at_ccr_1():
    # The case: 60 lines, 3 distinct texts, CCR-1, k = 8: scored z = +1.37 from rho 1.0000 before.
    rows = np.random.default_rng(2).standard_normal((3, D)).astype(np.float32)
    h = rows[np.arange(N) % 3]
    info = rank.layer_rank(h)
    assert (info.rank, info.distinct_rows) == numpy_rank(h) == (2, 3)
    for layer in (h, noisy(h, 1e-7)):
        with pytest.raises(InputError, match=r"^rank 1 after CCR-1"):
            rank.check_rank(rank.layer_rank(layer), 1, 8)


def test_a_constant_layer_has_rank_0_and_a_large_offset_does_not_make_rounding_a_direction():
    assert rank.layer_rank(np.full((10, 4), 2.5, dtype=np.float32)).rank == 0
    # Rows differing only below float32 resolution of a large common offset: rounding, not geometry.
    h = (1e4 + 1e-4 * np.random.default_rng(3).standard_normal((20, 8))).astype(np.float32)
    assert rank.layer_rank(h).rank == numpy_rank(h)[0] == 0


def test_few_distinct_residual_distances_are_refused():
    # A regular simplex: every pairwise cosine distance is the same value (scipy's pdist says so).
    simplex = np.eye(12) - 1.0 / 12
    distances = pdist(simplex, "cosine")
    assert np.ptp(distances) < 1e-12
    info = rank.layer_rank(simplex)
    assert info.rank == 11
    rounded = np.round(distances, 9)  # equal in exact arithmetic, as a tied ranking holds them
    assert rank.distinct_per_100_pairs(rounded, 66) == pytest.approx(100 / 66)
    with pytest.raises(InputError, match=r"^rank 10 after CCR-1: its cosine distances take only 1 distinct values over 66 pairs"):
        rank.check_distinct_distances(rounded, 66, info, 1)
    # Two distinct values over 66 pairs (3.03 per 100) passes; random points pass easily.
    rank.check_distinct_distances(np.r_[np.zeros(33), np.ones(33)], 66, info, 1)
    random = pdist(np.random.default_rng(0).standard_normal((12, 8)), "cosine")
    assert rank.distinct_per_100_pairs(random, 66) == 100.0


def test_a_pga_unit_on_a_planted_low_rank_layer_is_not_scored(tmp_path):
    """The unit's prepare step (what the engine runs first) refuses with the reason the CLI prints as 'not scored'."""
    from raygeom.analyses.pga import prepare_step
    from raygeom.store.tree import Store

    store = Store(tmp_path)
    layers = {"low": planted(9, seed=11), "full": planted(40, seed=12)}
    for index, (name, h) in enumerate(layers.items()):
        store.write_layer("m", "main", name, index, np.arange(N), noisy(h, 1e-6), key="x")
    store.mark_complete("m", "main", {"key": "x", "layers": list(layers), "all_layers": list(layers), "n_samples": N, "d": D})
    with pytest.raises(InputError, match=r"^rank 8 after CCR-1, below k \+ 2 = 10"):
        prepare_step(str(tmp_path), "m", "main", "low", 1, "x", 8)
    prepared = prepare_step(str(tmp_path), "m", "main", "full", 1, "x", 8)
    assert prepared.corrected.shape == (N, D)


def test_a_corpus_with_fewer_distinct_texts_than_pga_needs_is_refused_up_front():
    from raygeom.analyses.pga import check_corpus
    from raygeom.errors import RaygeomError
    from raygeom.params import PGAParams

    three = [f"text {i % 3}" for i in range(60)]
    with pytest.raises(RaygeomError) as refused:
        check_corpus("lines.txt", three, PGAParams(k=8, r=1))
    assert str(refused.value) == (
        "the 60 texts sampled from corpus 'lines.txt' hold 3 distinct texts; PGA with k=8 after CCR-1 "
        "needs at least 12 (rank k + 2 after CCR-r); use more distinct texts or a smaller --k"
    )
    some = [f"text {i % 35}" for i in range(60)]
    assert (
        check_corpus("c", some, PGAParams(k=8, r=1))
        == "corpus 'c': 60 texts sampled, 35 distinct (a duplicate adds no direction)"
    )
    with pytest.raises(RaygeomError, match="hold 35 distinct texts; PGA with k=8 after CCR-25 needs at least 36"):
        check_corpus("c", some, PGAParams(k=8, r=25))
    assert check_corpus("c", [f"t{i}" for i in range(12)], PGAParams(k=8, r=1)) is None  # 12 = k + r + 3: enough
