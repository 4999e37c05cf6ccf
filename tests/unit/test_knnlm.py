import numpy as np
import pytest
import torch

from raygeom.errors import InputError
from raygeom.numerics.knnlm import ExactIndex, interpolated_perplexity, knn_log_probs

# Brute-force oracles from the paper's definitions, plain numpy loops; nothing
# here imports the code under test.


def ref_neighbours(queries, keys, k):
    dist = ((queries[:, None, :] - keys[None, :, :]) ** 2).sum(axis=2)
    order = np.argsort(dist, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(dist, order, axis=1), order


def ref_knn_distribution(queries, keys, values, vocab_size, k, temperature):
    dist, ids = ref_neighbours(queries, keys, k)
    out = np.zeros((len(queries), vocab_size))
    for q in range(len(queries)):
        weights = np.exp(-(dist[q] - dist[q].min()) / temperature)
        for w, i in zip(weights / weights.sum(), ids[q]):
            out[q, values[i]] += w
    return out


def ref_interpolated_perplexity(lm, knn, lam):
    return np.exp(-np.mean(np.log(lam * np.exp(knn) + (1 - lam) * np.exp(lm))))


def datastore(seed, n_keys, d, vocab):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n_keys, d)), rng.integers(0, vocab, n_keys), rng


SHAPES = [(3, 5, 2), (20, 50, 8), (37, 200, 16)]  # (queries, keys, d)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("chunks", [(1, 1), (4, 7), (1024, 1 << 16)])
def test_exact_index_matches_brute_force(seed, shape, chunks):
    n_q, n_keys, d = shape
    keys, _, rng = datastore(seed, n_keys, d, 10)
    queries = rng.standard_normal((n_q, d))
    k = min(4, n_keys)
    index = ExactIndex(keys, device="cpu", query_chunk=chunks[0], key_chunk=chunks[1])
    dist, ids = index.search(queries, k)
    ref_dist, ref_ids = ref_neighbours(queries, keys, k)
    np.testing.assert_array_equal(ids.numpy(), ref_ids)
    np.testing.assert_allclose(dist.numpy(), ref_dist, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("k,temperature", [(1, 1.0), (3, 0.5), (5, 10.0)])
def test_knn_probabilities_match_brute_force(seed, shape, k, temperature):
    n_q, n_keys, d = shape
    vocab = 6
    keys, values, rng = datastore(seed, n_keys, d, vocab)
    queries = rng.standard_normal((n_q, d))
    k = min(k, n_keys)
    expected = ref_knn_distribution(queries, keys, values, vocab, k, temperature)
    full = knn_log_probs(queries, keys, values, vocab, k=k, temperature=temperature, chunk_size=4)
    np.testing.assert_allclose(np.exp(full), expected, atol=1e-12)
    np.testing.assert_allclose(np.exp(full).sum(axis=1), 1.0, atol=1e-12)
    targets = rng.integers(0, vocab, n_q)
    got = knn_log_probs(queries, keys, values, vocab, k=k, temperature=temperature, chunk_size=4, targets=targets)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(got, np.log(expected[np.arange(n_q), targets]), atol=1e-12)
    # Torch inputs and a prebuilt index give the same numbers.
    index = ExactIndex(torch.from_numpy(keys), device="cpu", key_chunk=3)
    again = knn_log_probs(
        torch.from_numpy(queries),
        index,
        torch.from_numpy(values),
        vocab,
        k=k,
        temperature=temperature,
        targets=torch.from_numpy(targets),
    )
    np.testing.assert_allclose(again, got, atol=1e-12)


def test_target_absent_from_neighbours_has_log_prob_minus_inf():
    keys = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    values = np.array([1, 2, 3])
    got = knn_log_probs(np.array([[0.1, 0.0]]), keys, values, 5, k=2, targets=np.array([3]))
    assert got[0] == -np.inf
    # Two neighbours at squared distances 0.01 and 98.01: p(1) = 1 / (1 + e^-98).
    got = knn_log_probs(np.array([[0.1, 0.0]]), keys, values, 5, k=2, targets=np.array([1]))
    assert got[0] == pytest.approx(-np.log1p(np.exp(-98.0)), abs=1e-15)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("lam", [0.0, 0.1, 0.25, 0.5, 0.9, 1.0])
def test_interpolated_perplexity_matches_naive_formula(seed, lam):
    rng = np.random.default_rng(seed)
    lm = np.log(rng.uniform(0.01, 1.0, 50))
    knn = np.log(rng.uniform(0.01, 1.0, 50))
    expected = ref_interpolated_perplexity(lm, knn, lam)
    assert interpolated_perplexity(lm, knn, lam) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lam_zero_gives_base_perplexity_exactly(seed):
    rng = np.random.default_rng(seed)
    lm = np.log(rng.uniform(0.001, 1.0, 100))
    knn = np.where(rng.random(100) < 0.3, -np.inf, np.log(rng.uniform(0.001, 1.0, 100)))
    assert interpolated_perplexity(lm, knn, 0.0) == np.exp(-lm.mean())


def test_interpolation_is_stable_where_the_naive_formula_underflows():
    lm = np.array([-800.0, -0.5, -1.0, -900.0])
    # Equal log-probs: any mixture of them is the same value, so ppl = exp(-mean).
    assert interpolated_perplexity(lm, lm, 0.3) == pytest.approx(np.exp(1701.5 / 4), rel=1e-12)
    knn = np.array([-np.inf, -0.5, -1.0, -800.0])
    # exp(-800) underflows to 0, so the naive formula gives inf here.
    expected = np.exp(-np.mean([np.log(0.7) - 800.0, -0.5, -1.0, np.log(0.3) - 800.0]))
    assert interpolated_perplexity(lm, knn, 0.3) == pytest.approx(expected, rel=1e-12)


def planted_layers(seed, n_test=40, n_other=300, d=24, vocab=30):
    """Layer 'good' stores the exact test contexts with their true next tokens among
    distractors; layer 'bad' stores the same values under unrelated keys."""
    rng = np.random.default_rng(seed)
    contexts = rng.standard_normal((n_test, d))
    targets = rng.integers(0, vocab, n_test)
    good_keys = np.concatenate([contexts, rng.standard_normal((n_other, d))])
    values = np.concatenate([targets, rng.integers(0, vocab, n_other)])
    bad_keys = rng.standard_normal(good_keys.shape)
    lm = np.log(rng.dirichlet(np.ones(vocab), n_test)[np.arange(n_test), targets])
    return contexts, targets, good_keys, bad_keys, values, lm, vocab


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 8, 32])
def test_datastore_with_the_test_contexts_lowers_perplexity(seed, k):
    contexts, targets, good_keys, _, values, lm, vocab = planted_layers(seed)
    knn = knn_log_probs(contexts, good_keys, values, vocab, k=k, temperature=1.0, targets=targets)
    base = np.exp(-lm.mean())
    assert interpolated_perplexity(lm, knn, 0.25) < 0.9 * base
    assert interpolated_perplexity(lm, knn, 0.0) == base


def test_bad_input_is_rejected():
    keys, values, rng = datastore(0, 10, 3, 5)
    queries = rng.standard_normal((2, 3))
    with pytest.raises(InputError):
        knn_log_probs(queries, keys, values, 5, k=11)
    with pytest.raises(InputError):
        knn_log_probs(queries, keys, values, 4, k=2)  # a value outside the vocabulary
    with pytest.raises(InputError):
        knn_log_probs(queries, keys, values[:5], 5, k=2)
    with pytest.raises(InputError):
        knn_log_probs(rng.standard_normal((2, 4)), keys, values, 5, k=2)
    with pytest.raises(InputError):
        knn_log_probs(queries, keys, values, 5, k=2, temperature=0.0)
    with pytest.raises(InputError):
        interpolated_perplexity(np.log([0.5]), np.log([0.5]), 1.5)
    with pytest.raises(InputError):
        interpolated_perplexity(np.log([0.5, 0.2]), np.log([0.5]), 0.5)
