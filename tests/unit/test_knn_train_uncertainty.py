"""Intervals of the kNN-LM layer choice and the push-away summary, against independent references:
scipy's paired t-test, the analytic standard error of a mean (of tokens, and of clusters), planted answers."""

import numpy as np
import pytest
from scipy import stats

from raygeom.analyses import knn, train
from raygeom.errors import InputError
from raygeom.numerics.knnlm import interpolated_log_probs, interpolated_perplexity
from raygeom.numerics.uncertainty import bootstrap_ci, paired_t, token_blocks
from raygeom.store.tree import Store


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("n", [2, 3, 5, 12])
def test_paired_t_matches_scipy_ttest_rel(seed, n):
    rng = np.random.default_rng(seed)
    control = rng.normal(100, 2, n)
    treated = control + rng.normal(-1, 0.5, n)
    ours = paired_t(treated, control)
    ref = stats.ttest_rel(treated, control)
    assert ours["t"] == pytest.approx(float(ref.statistic), rel=1e-10)
    assert ours["p"] == pytest.approx(float(ref.pvalue), rel=1e-10)
    assert ours["df"] == n - 1 and ours["se"] == pytest.approx(stats.sem(treated - control), rel=1e-10)


def test_paired_t_degenerate_cases_follow_scipy():
    with np.errstate(all="ignore"):
        ref = stats.ttest_rel([1.0, 2.0, 3.0], [0.0, 1.0, 2.0])
    ours = paired_t([1.0, 2.0, 3.0], [0.0, 1.0, 2.0])  # every difference +1: no spread
    assert ours["t"] == float(ref.statistic) == np.inf and ours["p"] == float(ref.pvalue) == 0.0
    assert np.isnan(paired_t([1.0, 2.0], [1.0, 2.0])["t"])
    with pytest.raises(InputError):
        paired_t([5.0], [4.0])
    with pytest.raises(InputError):
        paired_t([1.0, 2.0], [1.0])


def test_bootstrap_of_a_constant_ratio_is_exactly_that_ratio():
    rng = np.random.default_rng(0)
    lm = np.log(rng.uniform(0.01, 0.9, 300))
    # every token's probability doubled: perplexity exactly halves, in every resample
    result = bootstrap_ci((lm, lm + np.log(2)), lambda a, b: np.exp(-b.mean()) / np.exp(-a.mean()), seed=3, n_boot=300)
    assert result["estimate"] == pytest.approx(0.5) and result["lo"] == pytest.approx(0.5) and result["hi"] == pytest.approx(0.5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bootstrap_se_of_a_mean_matches_the_analytic_standard_error(seed):
    x = np.random.default_rng(seed).normal(3.0, 2.0, 500)
    result = bootstrap_ci(x, seed=seed)
    assert result["estimate"] == pytest.approx(x.mean())
    assert result["se"] == pytest.approx(x.std(ddof=1) / np.sqrt(len(x)), rel=0.1)
    assert result["lo"] < x.mean() < result["hi"]


@pytest.mark.parametrize("seed", [0, 1])
def test_block_bootstrap_sees_dependence_that_a_token_bootstrap_misses(seed):
    # 40 chunks of 50 tokens; each chunk shares a strong offset, so tokens are not independent.
    rng = np.random.default_rng(seed)
    offsets = rng.normal(0, 1.0, 40)
    x = np.repeat(offsets, 50) + rng.normal(0, 0.1, 2000)
    chunk = np.repeat(np.arange(40), 50)
    by_chunk = bootstrap_ci(x, seed=seed, n_boot=1000, clusters=token_blocks(chunk, 50))
    by_token = bootstrap_ci(x, seed=seed, n_boot=1000)
    chunk_means = x.reshape(40, 50).mean(axis=1)
    assert by_chunk["se"] == pytest.approx(chunk_means.std(ddof=1) / np.sqrt(40), rel=0.15)
    assert by_token["se"] < 0.5 * by_chunk["se"]


def test_the_interval_covers_the_true_mean_about_95_percent_of_the_time():
    covered, trials = 0, 200
    for t in range(trials):
        x = np.random.default_rng([11, t]).exponential(1.0, 200)
        result = bootstrap_ci(x, seed=t, n_boot=400)
        covered += result["lo"] <= 1.0 <= result["hi"]
    assert 0.88 <= covered / trials <= 0.99


def test_equal_seeds_and_clusters_resample_the_same_positions_so_separate_statistics_are_paired():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=120), rng.normal(size=120)
    blocks = token_blocks(np.repeat(np.arange(4), 30), 8)
    alone = bootstrap_ci(a, seed=9, n_boot=300, clusters=blocks)
    together = bootstrap_ci((a, b), lambda x, y: x.mean(), seed=9, n_boot=300, clusters=blocks)
    assert (alone["lo"], alone["hi"], alone["se"]) == (together["lo"], together["hi"], together["se"])
    assert bootstrap_ci(a, seed=10, n_boot=300, clusters=blocks)["lo"] != alone["lo"]


def test_token_blocks_cut_each_chunk_into_runs():
    chunk = np.array([2, 2, 2, 2, 2, 3, 3, 3, 3, 3])
    labels = token_blocks(chunk, 2)
    assert [len(set(labels[chunk == c])) for c in (2, 3)] == [3, 3]
    assert labels[0] == labels[1] != labels[2] == labels[3] != labels[4]
    assert not set(labels[chunk == 2]) & set(labels[chunk == 3])
    assert len(set(token_blocks(chunk, 1))) == 10 and len(set(token_blocks(chunk, 100))) == 2
    with pytest.raises(InputError):
        token_blocks(chunk, 0)
    with pytest.raises(InputError, match="at least 2 clusters"):
        bootstrap_ci(np.arange(5.0), clusters=np.zeros(5))


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
def test_interpolated_log_probs_are_the_mixture_and_give_the_perplexity(lam):
    rng = np.random.default_rng(1)
    lm, knn_lp = np.log(rng.uniform(0.01, 1, 50)), np.log(rng.uniform(0.01, 1, 50))
    mixed = interpolated_log_probs(lm, knn_lp, lam)
    np.testing.assert_allclose(mixed, np.log(lam * np.exp(knn_lp) + (1 - lam) * np.exp(lm)), rtol=1e-12)
    assert np.exp(-mixed.mean()) == pytest.approx(interpolated_perplexity(lm, knn_lp, lam), rel=1e-12)


def test_grid_edges_and_their_warning():
    assert knn.grid_edge(0.01, [0.01, 0.1, 0.5]) == "lower" and knn.grid_edge(0.5, [0.01, 0.1, 0.5]) == "upper"
    assert knn.grid_edge(0.1, [0.01, 0.1, 0.5]) == "" and knn.grid_edge(0.5, [0.5]) == ""
    settings = knn.KnnSettings(lams="0.01,0.1,0.5")
    rows = [{"layer": "a", "lam_edge": "upper", "scale_edge": ""}, {"layer": "b", "lam_edge": "", "scale_edge": ""}]
    (line,) = knn.edge_warnings(rows, settings)
    assert "lambda sits at the upper edge" in line and "1 of 2 layers (a)" in line and "--lam" in line
    assert knn.edge_warnings([rows[1]], settings) == []


def _write_tokens(store, key, layer, lm, mixed, chunk):
    store.write_result(
        "knn_tokens",
        key,
        [
            {"layer": layer, "chunk": int(c), "lm_logprob": float(a), "mixed_logprob": float(b)}
            for a, b, c in zip(lm, mixed, chunk)
        ],
    )


def test_best_layer_is_separated_from_the_runner_up_only_when_the_paired_interval_excludes_zero(tmp_path):
    store = Store(tmp_path)
    rng = np.random.default_rng(2)
    chunk = np.repeat([4, 5, 6, 7], 64)
    lm = np.log(rng.uniform(0.001, 0.5, chunk.size))
    settings = knn.KnnSettings(bootstrap_block=16)
    # "good" doubles every probability (perplexity exactly halves), "noisy" adds zero-mean noise to the base.
    noise = rng.normal(0, 0.5, chunk.size)
    _write_tokens(store, "good", "good", lm, lm + np.log(2), chunk)
    _write_tokens(store, "noisy", "noisy", lm, lm + noise - noise.mean(), chunk)
    twin = lm + noise - noise.mean()
    twin[[0, 100]] = twin[[100, 0]]  # same tokens' total, other blocks: the same perplexity, other resamples
    _write_tokens(store, "twin", "twin", lm, twin, chunk)
    ppl = lambda x: float(np.exp(-np.mean(x)))  # noqa: E731
    rows = [
        {"layer": "noisy", "unit_key": "noisy", "layer_index": 1, "knn_perplexity": ppl(lm + noise - noise.mean())},
        {"layer": "good", "unit_key": "good", "layer_index": 2, "knn_perplexity": ppl(lm + np.log(2))},
    ]
    result = knn.best_against_runner_up(store, rows, settings)
    assert result["best_layer"] == "good" and result["runner_up"] == "noisy"
    assert result["difference"] == pytest.approx(ppl(lm + np.log(2)) - ppl(lm + noise - noise.mean()))
    assert result["hi"] < 0 and result["separated"] is True
    twins = [rows[0], {"layer": "twin", "unit_key": "twin", "layer_index": 3, "knn_perplexity": ppl(twin)}]
    close = knn.best_against_runner_up(store, twins, settings)
    assert {close["best_layer"], close["runner_up"]} == {"noisy", "twin"} and close["difference"] == pytest.approx(0.0, abs=1e-9)
    assert close["lo"] < 0 < close["hi"] and close["separated"] is False


def test_push_away_summary_carries_scipys_paired_t_and_p():
    plain = [103.27, 102.61, 102.85]
    pushed = [101.77, 101.67, 101.10]
    rows = [{"lam": 0.0, "seed": s, "heldout_perplexity": p, "heldout_dispersion": 0.87} for s, p in enumerate(plain)]
    rows += [{"lam": 0.1, "seed": s, "heldout_perplexity": p, "heldout_dispersion": 0.9} for s, p in enumerate(pushed)]
    summary = {r["lam"]: r for r in train.summarise(list(reversed(rows)))}
    ref = stats.ttest_rel(pushed, plain)
    assert summary[0.1]["paired_t"] == pytest.approx(float(ref.statistic))
    assert summary[0.1]["paired_p"] == pytest.approx(float(ref.pvalue))
    assert summary[0.1]["paired_t"] == pytest.approx(-5.9, abs=0.1)  # the value docs/results/dispersion.md reports
    assert summary[0.1]["n_lower"] == 3 and summary[0.1]["n_higher"] == 0 and summary[0.1]["paired_df"] == 2
    assert summary[0.1]["paired_delta_lo"] < summary[0.1]["paired_delta_mean"] < summary[0.1]["paired_delta_hi"] < 0
    assert np.isnan(summary[0.0]["paired_t"]) and summary[0.0]["n_lower"] == 0
