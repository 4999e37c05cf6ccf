"""Uncertainty of the dispersion numbers against independent references: the chunk bootstrap of G against
the dispersion of the explicit multiset of positions, the slice-agreement bootstrap against a per-draw
recomputation with scipy, the correlation intervals against scipy per draw and scipy.stats.bootstrap,
bits per byte by hand on a tiny tokenizer."""

import math
import warnings

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from raygeom.errors import InputError
from raygeom.numerics.dispersion import (
    GAP_STREAM,
    MIN_GAP_POSITIONS,
    SLICE_STREAM,
    bits_per_byte,
    dispersion,
    dispersion_gap,
    gap_interval,
    gap_of_parts,
    gap_warning,
    slice_agreement_interval,
)


def _chunks(seed, n_chunks=9, length=20, d=6, domain_share=0.2, planted=0.0):
    """Random chunks of position vectors and next-token ids; domain positions (id 0) share a planted direction."""
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n_chunks, length, d))
    ids = np.where(rng.random((n_chunks, length)) < domain_share, 0, 1 + rng.integers(0, 50, (n_chunks, length)))
    vectors[ids == 0] += planted * np.eye(d)[0]
    return vectors, ids


def _parts(vectors, ids):
    """Per chunk and side: sum of unit vectors, sum of their squared norms, count (plain numpy)."""
    unit = vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)
    sums = np.stack([np.stack([unit[c][ids[c] == 0].sum(0), unit[c][ids[c] != 0].sum(0)]) for c in range(len(ids))])
    diagonal = np.stack([[(unit[c][ids[c] == 0] ** 2).sum(), (unit[c][ids[c] != 0] ** 2).sum()] for c in range(len(ids))])
    counts = np.stack([[(ids[c] == 0).sum(), (ids[c] != 0).sum()] for c in range(len(ids))])
    return sums, diagonal, counts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gap_of_parts_is_the_gap_of_the_multiset_of_positions(seed):
    vectors, ids = _chunks(seed)
    sums, diagonal, counts = _parts(vectors, ids)
    whole = dispersion_gap(vectors.reshape(-1, vectors.shape[-1]), ids.reshape(-1), [0]).gap
    assert gap_of_parts(sums, diagonal, counts)[0] == pytest.approx(whole, abs=1e-12)
    weights = np.random.default_rng(seed + 10).multinomial(len(ids), np.full(len(ids), 1 / len(ids)), size=4)
    for row, w in zip(gap_of_parts(sums, diagonal, counts, weights), weights):
        take = np.repeat(np.arange(len(ids)), w)  # a chunk drawn twice is two copies of its positions
        domain = vectors[take][ids[take] == 0]
        generic = vectors[take][ids[take] != 0]
        assert row == pytest.approx(dispersion(domain) - dispersion(generic), abs=1e-12)


def test_gap_interval_matches_a_per_draw_recomputation_and_covers_a_planted_gap():
    vectors, ids = _chunks(4, n_chunks=30, planted=2.0)
    sums, diagonal, counts = _parts(vectors, ids)
    result = gap_interval(sums, diagonal, counts, seed=5, n_boot=300)
    draws = np.random.default_rng([5, GAP_STREAM]).multinomial(30, np.full(30, 1 / 30), size=300)
    boot = []
    for w in draws:
        take = np.repeat(np.arange(30), w)
        boot.append(dispersion(vectors[take][ids[take] == 0]) - dispersion(vectors[take][ids[take] != 0]))
    assert result["gap_se"] == pytest.approx(np.std(boot, ddof=1), rel=1e-9)
    assert [result["gap_lo"], result["gap_hi"]] == pytest.approx(np.quantile(boot, [0.025, 0.975]), rel=1e-9)
    assert result["gap"] < 0 and result["gap_hi"] < 0  # a planted shared direction makes domain positions less dispersed
    assert result["n_domain"] == int((ids == 0).sum()) and result["n_generic"] == int((ids != 0).sum())


def test_gap_warning_under_the_minimum():
    assert gap_warning(MIN_GAP_POSITIONS) == ""
    assert str(MIN_GAP_POSITIONS - 1) in gap_warning(MIN_GAP_POSITIONS - 1)
    with pytest.raises(InputError):
        gap_interval(np.zeros((1, 2, 3)), np.zeros((1, 2)), np.ones((1, 2)))


def _weighted_dispersion(vectors, w):
    """Mean cosine distance over pairs of distinct chunks, chunk i counted w_i times (explicit pairs)."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    total = pairs = 0.0
    for i in range(len(w)):
        for j in range(len(w)):
            if i != j:
                total += w[i] * w[j] * (1 - unit[i] @ unit[j])
                pairs += w[i] * w[j]
    return total / pairs


def test_slice_agreement_interval_matches_a_per_draw_recomputation():
    rng = np.random.default_rng(7)
    labels = np.repeat(np.array(["a", "b", "c", "d"]), 6)
    ppl = np.exp(rng.normal(3, 0.3, 24) + np.repeat([0.0, 0.3, 0.6, 0.9], 6))
    token = rng.uniform(0.3, 0.6, 24) - np.repeat([0.0, 0.05, 0.1, 0.15], 6)  # planted: harder slices less dispersed
    pooled = rng.normal(size=(24, 5))
    result = slice_agreement_interval(labels, ppl, token, pooled, seed=2, n_boot=200)
    stream = np.random.default_rng([2, SLICE_STREAM])
    weights = [stream.multinomial(6, np.full(6, 1 / 6), size=200) for _ in range(4)]
    token_agreement, sample_agreement = [], []
    for b in range(200):
        w = [weights[s][b] for s in range(4)]
        members = [np.flatnonzero(labels == name) for name in "abcd"]
        slice_ppl = [np.exp(np.average(np.log(ppl[m]), weights=ws)) for m, ws in zip(members, w)]
        slice_token = [np.average(token[m], weights=ws) for m, ws in zip(members, w)]
        with np.errstate(invalid="ignore"):
            slice_sample = [_weighted_dispersion(pooled[m], ws) for m, ws in zip(members, w)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            token_agreement.append(spearmanr(-np.array(slice_token), slice_ppl)[0])
            sample_agreement.append(spearmanr(-np.array(slice_sample), slice_ppl)[0])
    token_agreement = np.array(token_agreement)[np.isfinite(token_agreement)]
    sample_agreement = np.array(sample_agreement)[np.isfinite(sample_agreement)]  # a slice drawn as one chunk has no pairs
    assert [result["token_lo"], result["token_hi"]] == pytest.approx(np.quantile(token_agreement, [0.025, 0.975]), abs=1e-9)
    assert [result["sample_lo"], result["sample_hi"]] == pytest.approx(np.quantile(sample_agreement, [0.025, 0.975]), abs=1e-9)
    assert result["token_hi"] == pytest.approx(1.0)  # the planted ordering is recovered in most draws


def test_unweighted_slice_dispersion_is_the_plain_dispersion():
    rng = np.random.default_rng(1)
    pooled = rng.normal(size=(7, 4))
    assert _weighted_dispersion(pooled, np.ones(7)) == pytest.approx(dispersion(pooled), abs=1e-12)


@pytest.mark.parametrize("n,noise", [(12, 0.5), (40, 2.0)])
def test_correlation_intervals_match_scipy_per_draw(n, noise):
    from raygeom.analyses.dispersion import _correlations
    from raygeom.numerics.uncertainty import _BOOT_TAG

    rng = np.random.default_rng(n)
    x = rng.normal(size=n)
    y = x + noise * rng.normal(size=n)
    result = _correlations(x, y, "group", n_boot=400, seed=3)
    assert result["group_spearman"] == pytest.approx(spearmanr(x, y)[0], abs=1e-12)
    assert result["group_pearson"] == pytest.approx(pearsonr(x, y)[0], abs=1e-12)
    stream = np.random.default_rng([3, _BOOT_TAG])
    draws = [stream.integers(0, n, size=n) for _ in range(400)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, fn in (("spearman", spearmanr), ("pearson", pearsonr)):
            boot = np.array([fn(x[d], y[d])[0] for d in draws])
            boot = boot[np.isfinite(boot)]
            expected = np.quantile(boot, [0.025, 0.975])
            assert [result[f"group_{name}_lo"], result[f"group_{name}_hi"]] == pytest.approx(expected, abs=1e-9), name


def test_correlation_intervals_agree_with_scipy_bootstrap():
    from scipy.stats import bootstrap

    from raygeom.analyses.dispersion import _correlations

    rng = np.random.default_rng(0)
    x = rng.normal(size=60)
    y = 0.6 * x + rng.normal(size=60)
    ours = _correlations(x, y, "chunk", n_boot=4000, seed=1)
    theirs = bootstrap(
        (x, y),
        lambda a, b: pearsonr(a, b)[0],
        paired=True,
        vectorized=False,
        n_resamples=4000,
        method="percentile",
        random_state=2,
    ).confidence_interval
    assert ours["chunk_pearson_lo"] == pytest.approx(theirs.low, abs=0.04)
    assert ours["chunk_pearson_hi"] == pytest.approx(theirs.high, abs=0.04)


def test_bits_per_byte_by_hand():
    # two chunks: 3 predicted tokens at 2 nats each over 10 bytes, 1 token at 1 nat over 2 bytes
    assert bits_per_byte([2.0, 1.0], [3, 1], [10, 2]) == pytest.approx((6 + 1) / math.log(2) / 12)
    with pytest.raises(InputError):
        bits_per_byte([1.0], [3], [0])


def _word_tokenizer():
    """A tiny word-level tokenizer whose decode joins tokens with one space: bytes countable by hand."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "a": 1, "bb": 2, "ccc": 3, "é": 4, "<unk>": 5}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", unk_token="<unk>")


def test_predicted_bytes_by_hand_on_a_tiny_tokenizer():
    from raygeom.replica.tokenize import predicted_bytes

    tokenizer = _word_tokenizer()
    chunks = np.array(
        [
            [0, 2, 3, 4],  # BOS first: predicted "bb ccc é" = 2 + 1 + 3 + 1 + 2 bytes
            [1, 1, 2, 2],
        ]
    )  # no BOS: the first token is context, predicted "a bb bb" = 1 + 1 + 2 + 1 + 2
    assert predicted_bytes(tokenizer, chunks).tolist() == [9, 7]
    nll = np.array([0.5, 2.0])  # mean nats per predicted token, 3 predicted tokens per chunk
    assert bits_per_byte(nll, [3, 3], predicted_bytes(tokenizer, chunks)) == pytest.approx((1.5 + 6.0) / math.log(2) / 16)
