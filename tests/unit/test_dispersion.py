import bisect

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import adjusted_rand_score

from raygeom.errors import InputError
from raygeom.numerics.dispersion import (
    dispersion,
    dispersion_by_slice,
    dispersion_gap,
    kmeans_slices,
    perplexity_groups,
    push_away_loss,
    rank_agreement,
    token_dispersion,
)

# Oracles written from METRICS.md with scipy and plain loops; nothing here
# imports the code under test. (Kept local: tests/reference.py holds other
# engineers' uncommitted work.)


def ref_dispersion(h):
    return pdist(np.asarray(h, dtype=np.float64), "cosine").mean()


def ref_authors_groups(ppl, group_size, n_groups):
    """The authors' released grouping: Python sort, consecutive groups, bisect onto linspace targets."""
    pairs = sorted(enumerate(ppl), key=lambda x: x[1])
    groups = []
    for i in range(0, len(pairs), group_size):
        chunk = pairs[i : i + group_size]
        if len(chunk) < group_size:
            break
        groups.append(([c[0] for c in chunk], float(np.mean([c[1] for c in chunk]))))
    if len(groups) <= n_groups:
        return groups
    means = [g[1] for g in groups]
    picked = set()
    for val in np.linspace(means[0], means[-1], n_groups):
        pos = bisect.bisect_left(means, val)
        if pos == len(means):
            pos -= 1
        if pos > 0 and abs(means[pos - 1] - val) < abs(means[pos] - val):
            picked.add(pos - 1)
        else:
            picked.add(pos)
    return [groups[i] for i in sorted(picked)]


def anisotropic(rng, n, d, offset=3.0):
    """Rows sharing a common direction, so dispersion is well inside (0, 1)."""
    return rng.standard_normal((n, d)) + offset * rng.standard_normal(d)


SHAPES = [(2, 3), (7, 5), (60, 20), (300, 64)]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shape", SHAPES)
def test_identical_vectors_have_zero_dispersion(seed, shape):
    v = np.random.default_rng(seed).standard_normal(shape[1])
    assert dispersion(np.tile(v, (shape[0], 1))) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gaussian_vectors_in_high_dimension_are_nearly_orthogonal(seed):
    h = np.random.default_rng(seed).standard_normal((200, 2048))
    assert abs(dispersion(h) - 1.0) < 0.02


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_scipy_pdist(seed, shape):
    h = anisotropic(np.random.default_rng(seed), *shape)
    expected = ref_dispersion(h)
    assert dispersion(h) == pytest.approx(expected, abs=1e-12)
    assert dispersion(torch.from_numpy(h)) == pytest.approx(expected, abs=1e-12)
    assert dispersion(torch.from_numpy(h).float()) == pytest.approx(expected, abs=1e-6)
    assert dispersion(h, block_rows=3) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shape", SHAPES)
def test_invariant_to_positive_rescaling_of_each_vector(seed, shape):
    rng = np.random.default_rng(seed)
    h = anisotropic(rng, *shape)
    scales = np.exp(rng.uniform(-6, 6, (shape[0], 1)))
    assert dispersion(h * scales) == pytest.approx(dispersion(h), abs=1e-12)


def test_large_n_matches_pdist_without_materialising_pairs():
    h = anisotropic(np.random.default_rng(5), 3000, 8, offset=1.0)
    assert dispersion(h, block_rows=256) == pytest.approx(ref_dispersion(h), abs=1e-12)


def test_dispersion_rejects_bad_input():
    with pytest.raises(InputError):
        dispersion(np.ones((1, 4)))
    with pytest.raises(InputError):
        dispersion(np.ones(4))
    with pytest.raises(InputError):
        dispersion(np.array([[1.0, np.nan], [1.0, 2.0]]))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shape", [(1, 2, 3), (4, 16, 8), (3, 50, 32)])
def test_token_dispersion_matches_per_chunk_pdist(seed, shape):
    chunks = np.stack([anisotropic(np.random.default_rng([seed, b]), *shape[1:]) for b in range(shape[0])])
    expected = np.array([pdist(c, "cosine").mean() for c in chunks])
    np.testing.assert_allclose(token_dispersion(chunks), expected, atol=1e-12)
    np.testing.assert_allclose(token_dispersion(torch.from_numpy(chunks)), expected, atol=1e-12)
    np.testing.assert_allclose(token_dispersion(list(chunks)), expected, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("left_padding", [False, True])
def test_token_dispersion_excludes_padded_positions(seed, left_padding):
    rng = np.random.default_rng(seed)
    b, t, d = 5, 20, 12
    lengths = np.array([20, 2, 13, 1, 7])
    chunks = rng.standard_normal((b, t, d)) * 1e3  # padding holds garbage
    mask = np.zeros((b, t), dtype=np.int64)
    for i, n in enumerate(lengths):
        rows = slice(t - n, t) if left_padding else slice(0, n)
        chunks[i, rows] = anisotropic(rng, n, d)
        mask[i, rows] = 1
    chunks[3, ~mask[3].astype(bool)] = np.nan  # NaN padding must not leak in
    got = token_dispersion(chunks, attention_mask=mask)
    for i, n in enumerate(lengths):
        if n < 2:
            assert np.isnan(got[i])
        else:
            assert got[i] == pytest.approx(pdist(chunks[i][mask[i] == 1], "cosine").mean(), abs=1e-12)


def planted_gap(seed, spread="domain", b=4, t=60, d=48, vocab=50):
    """Domain positions (next token in {0..4}) point in random directions; generic ones
    are one shared direction plus small noise (or the other way round)."""
    rng = np.random.default_rng(seed)
    next_ids = rng.integers(0, vocab, (b, t))
    next_ids[:, :6] = rng.integers(0, 5, (b, 6))  # enough domain positions
    is_domain = next_ids < 5
    spread_rows = is_domain if spread == "domain" else ~is_domain
    common = rng.standard_normal(d)
    vectors = np.where(
        spread_rows[..., None],
        rng.standard_normal((b, t, d)),
        common + 0.05 * rng.standard_normal((b, t, d)),
    )
    return vectors, next_ids, is_domain


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("spread", ["domain", "generic"])
def test_dispersion_gap_on_planted_data(seed, spread):
    vectors, next_ids, is_domain = planted_gap(seed, spread)
    expected = ref_dispersion(vectors[is_domain]) - ref_dispersion(vectors[~is_domain])
    got = dispersion_gap(vectors, next_ids, range(5))
    assert got.gap == pytest.approx(expected, abs=1e-12)
    assert (got.gap > 0.5) if spread == "domain" else (got.gap < -0.5)
    assert (got.n_domain, got.n_generic) == (is_domain.sum(), (~is_domain).sum())
    torch_got = dispersion_gap(torch.from_numpy(vectors), torch.from_numpy(next_ids), {0, 1, 2, 3, 4})
    assert torch_got.gap == pytest.approx(expected, abs=1e-12)


def test_dispersion_gap_masks_and_ignore_index():
    vectors, next_ids, is_domain = planted_gap(3)
    mask = np.ones(next_ids.shape, dtype=bool)
    mask[:, -1] = False  # last position has no next token
    next_ids = next_ids.copy()
    next_ids[0, 10:20] = -100
    keep = mask & (next_ids >= 0)
    expected = ref_dispersion(vectors[keep & is_domain]) - ref_dispersion(vectors[keep & ~is_domain])
    assert dispersion_gap(vectors, next_ids, range(5), mask=mask).gap == pytest.approx(expected, abs=1e-12)


def test_dispersion_gap_needs_two_positions_per_side():
    vectors = np.random.default_rng(0).standard_normal((10, 4))
    ids = np.full(10, 7)
    ids[0] = 1
    with pytest.raises(InputError, match="domain"):
        dispersion_gap(vectors, ids, [1])
    with pytest.raises(InputError, match="generic"):
        dispersion_gap(vectors, np.ones(10, dtype=int), [1])


def planted_chunks(seed, n, noise=0.05):
    rng = np.random.default_rng(seed)
    ppl = np.exp(rng.uniform(1.0, 4.0, n))
    return ppl, -np.log(ppl) + noise * rng.standard_normal(n)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("group_size,n_groups,n", [(10, 50, 2005), (7, 30, 700), (25, 100, 1000)])
def test_perplexity_groups_follow_the_authors_protocol(seed, group_size, n_groups, n):
    ppl, disp = planted_chunks(seed, n)
    got = perplexity_groups(ppl, disp, group_size=group_size, n_groups=n_groups)
    expected = ref_authors_groups(list(ppl), group_size, n_groups)
    assert got.n_full_groups == n // group_size
    assert len(got.members) == len(expected) <= max(n_groups, 3)
    for members, (ref_members, _ref_mean) in zip(got.members, expected):
        assert list(members) == ref_members
    np.testing.assert_allclose(got.mean_perplexity, [g[1] for g in expected], rtol=1e-12)
    np.testing.assert_allclose(got.mean_dispersion, [disp[g[0]].mean() for g in expected], rtol=1e-12)
    x, y = [g[1] for g in expected], [disp[g[0]].mean() for g in expected]
    assert got.spearman == pytest.approx(spearmanr(x, y)[0], abs=1e-12)
    assert got.pearson == pytest.approx(pearsonr(x, y)[0], abs=1e-12)
    assert got.spearman < -0.95


@pytest.mark.parametrize("seed", [0, 1])
def test_perplexity_groups_sizes_and_spacing(seed):
    ppl, disp = planted_chunks(seed, 2005)
    got = perplexity_groups(ppl, disp, group_size=10, n_groups=40)
    order = np.sort(ppl)
    full_means = order[:2000].reshape(200, 10).mean(axis=1)
    assert all(len(m) == 10 for m in got.members)
    assert np.all(np.diff(got.mean_perplexity) > 0)
    # Each selected group is one of the consecutive groups of the sorted chunks...
    for m in got.members:
        start = int(np.searchsorted(order, ppl[m].min()))
        assert start % 10 == 0
        np.testing.assert_array_equal(np.sort(ppl[m]), order[start : start + 10])
    # ...and is the nearest to one of the evenly spaced targets.
    targets = np.linspace(full_means[0], full_means[-1], 40)
    nearest = {float(full_means[np.argmin(np.abs(full_means - t))]) for t in targets}
    assert set(np.round(got.mean_perplexity, 12)) == set(np.round(sorted(nearest), 12))
    assert got.mean_perplexity[0] == pytest.approx(full_means[0])
    assert got.mean_perplexity[-1] == pytest.approx(full_means[-1])


def test_perplexity_groups_keep_all_groups_when_few_and_skip_nan_chunks():
    ppl, disp = planted_chunks(4, 95)
    disp[0] = np.nan
    got = perplexity_groups(ppl, disp, group_size=10, n_groups=100)
    assert len(got.members) == got.n_full_groups == 9
    for members, value in zip(got.members, got.mean_dispersion):
        assert value == pytest.approx(np.nanmean(disp[members]), abs=1e-12)
    with pytest.raises(InputError):
        perplexity_groups(ppl[:20], disp[:20], group_size=10)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n_slices", [3, 8, 20])
def test_rank_agreement(seed, n_slices):
    rng = np.random.default_rng(seed)
    ppl = rng.uniform(5, 50, n_slices)
    disp = 1.0 / np.log(ppl)  # strictly decreasing: harder slice, lower dispersion
    assert rank_agreement(disp, ppl) == pytest.approx(1.0)
    assert rank_agreement(-disp, ppl) == pytest.approx(-1.0)
    noisy = rng.standard_normal(n_slices)
    assert rank_agreement(noisy, ppl) == pytest.approx(-spearmanr(noisy, ppl)[0], abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kmeans_slices_recover_planted_directions_and_slice_dispersion(seed):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((4, 32)) * 5
    truth = rng.permutation(np.repeat(np.arange(4), 30))
    # Norms vary wildly: slices must follow direction, not length.
    h = (centres[truth] + rng.standard_normal((120, 32))) * np.exp(rng.uniform(-3, 3, (120, 1)))
    labels = kmeans_slices(h, 4, seed=seed)
    assert adjusted_rand_score(truth, labels) == pytest.approx(1.0)
    np.testing.assert_array_equal(labels, kmeans_slices(h, 4, seed=seed))
    slices, values = dispersion_by_slice(h, labels)
    np.testing.assert_allclose(values, [ref_dispersion(h[labels == s]) for s in slices], atol=1e-12)


def ref_pooled(h, mask, over):
    if over == "tokens":
        return h[mask]
    if over == "last":
        return np.stack([h[i][np.flatnonzero(mask[i])[-1]] for i in range(len(h))])
    return np.stack([h[i][mask[i]].mean(axis=0) for i in range(len(h))])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("over", ["tokens", "last", "mean"])
def test_push_away_loss_equals_dispersion_of_the_chosen_vectors(seed, over):
    rng = np.random.default_rng(seed)
    h = anisotropic(rng, 6 * 9, 16).reshape(6, 9, 16)
    mask = np.ones((6, 9), dtype=bool)
    mask[1, 5:] = False
    mask[4, :3] = False
    got = push_away_loss(torch.from_numpy(h), torch.from_numpy(mask), over=over)
    assert float(got) == pytest.approx(ref_dispersion(ref_pooled(h, mask, over)), abs=1e-12)
    flat = torch.from_numpy(h[:, 0])
    assert float(push_away_loss(flat)) == pytest.approx(ref_dispersion(h[:, 0]), abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shape", [(8, 4), (32, 64), (100, 16)])
def test_push_away_gradient_step_increases_dispersion(seed, shape):
    h = torch.from_numpy(anisotropic(np.random.default_rng(seed), *shape)).requires_grad_(True)
    d_batch = push_away_loss(h)
    assert d_batch.item() == pytest.approx(ref_dispersion(h.detach().numpy()), abs=1e-12)
    (-d_batch).backward()  # L = 0 - lambda * D_batch with lambda = 1
    with torch.no_grad():
        stepped = h - 0.5 * h.grad
    assert ref_dispersion(stepped.numpy()) > ref_dispersion(h.detach().numpy()) + 1e-6


def test_push_away_loss_rejects_bad_input():
    with pytest.raises(InputError):
        push_away_loss(torch.ones(1, 4))
    with pytest.raises(InputError):
        push_away_loss(torch.ones(2, 3, 4), over="first")
    with pytest.raises(InputError):
        push_away_loss(torch.ones(2, 3, 4), torch.tensor([[1, 1, 1], [0, 0, 0]]), over="last")


@pytest.mark.parametrize("seed", [0, 1])
def test_read_only_inputs_as_ray_hands_them_out_give_the_same_numbers_and_warn_nothing(seed):
    """A Ray task's numpy arguments are read-only views of the object store; torch warns on them, and Ray prints that
    warning on the driver's console among a command's output (a CLI test saw it as a second stderr line)."""
    import warnings

    from raygeom.numerics.knnlm import knn_log_probs

    rng = np.random.default_rng(seed)
    h, chunks = rng.normal(size=(12, 6)), rng.normal(size=(3, 5, 6))
    keys, queries, values = rng.normal(size=(20, 6)), rng.normal(size=(4, 6)), rng.integers(0, 7, 20)
    writable = (dispersion(h), token_dispersion(chunks), knn_log_probs(queries, keys, values, 7, k=5))
    for array in (h, chunks, keys, queries, values):
        array.setflags(write=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read_only = (dispersion(h), token_dispersion(chunks), knn_log_probs(queries, keys, values, 7, k=5))
    assert read_only[0] == writable[0]
    np.testing.assert_array_equal(read_only[1], writable[1])
    np.testing.assert_array_equal(read_only[2], writable[2])
    assert [str(w.message) for w in caught] == []
