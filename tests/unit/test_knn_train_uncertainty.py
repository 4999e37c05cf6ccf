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


# ----------------------------------------------------------------------------- issue 45: the PGA standard for kNN-LM


def _planted_blocks(n_blocks, per_block=16, seed=0):
    """Per-token LM log-probs, a kNN-LM mixture that doubles every probability (perplexity exactly halves), and labels
    cutting the tokens into ``n_blocks`` blocks of ``per_block``."""
    rng = np.random.default_rng(seed)
    lm = np.log(rng.uniform(0.01, 0.5, n_blocks * per_block))
    return lm, lm + np.log(2), np.repeat(np.arange(n_blocks), per_block)


@pytest.mark.parametrize("n_blocks", [2, 3, 9])
def test_a_difference_over_fewer_than_ten_blocks_has_no_interval_and_says_why(n_blocks):
    lm, mixed, blocks = _planted_blocks(n_blocks)
    result = knn._difference_interval(lm, mixed, blocks, knn.KnnSettings())
    # the estimate stays: half the base perplexity, less the base perplexity
    assert result["estimate"] == pytest.approx(np.exp(-mixed.mean()) - np.exp(-lm.mean()), rel=1e-12)
    assert np.isnan(result["lo"]) and np.isnan(result["hi"]) and np.isnan(result["se"])
    assert result["n_units"] == n_blocks and result["note"] == f"no interval below 10 blocks ({n_blocks})"


def test_ten_blocks_carry_an_interval_and_no_note():
    lm, mixed, blocks = _planted_blocks(10)
    result = knn._difference_interval(lm, mixed, blocks, knn.KnnSettings(n_boot=200))
    exact = np.exp(-mixed.mean()) - np.exp(-lm.mean())
    assert result["note"] == "" and result["n_units"] == 10
    assert result["lo"] <= exact <= result["hi"] < 0


def test_why_ten_blocks_a_percentile_interval_over_fewer_blocks_undercovers():
    # The reason for BLOCK_MIN, measured with plain numpy (no raygeom): the percentile bootstrap interval of a mean
    # over B i.i.d. normal blocks covers the true mean in about half the cases at B = 2 and far below 95 % at 3;
    # at 10 it is within a few points of nominal.
    from raygeom.numerics.uncertainty import BLOCK_MIN

    def coverage(b, trials=600):
        rng = np.random.default_rng([7, b])
        x = rng.standard_normal((trials, b))
        draws = rng.integers(0, b, size=(trials, 400, b))
        means = np.take_along_axis(x[:, None, :].repeat(400, axis=1), draws, axis=2).mean(axis=2)
        lo, hi = np.quantile(means, [0.025, 0.975], axis=1)
        return float(np.mean((lo <= 0) & (0 <= hi)))

    assert BLOCK_MIN == 10
    assert coverage(2) < 0.6 and coverage(3) < 0.82
    assert coverage(BLOCK_MIN) > 0.86


@pytest.mark.parametrize(
    "chunk_len, test_chunks, block",
    [(512, 8, 64), (64, 4, 64), (48, 4, 8), (48, 5, 8), (512, 8, 512), (512, 20, 600), (65, 2, 1), (10, 3, 4)],
)
def test_evaluation_blocks_are_the_blocks_the_bootstrap_resamples(chunk_len, test_chunks, block):
    # Independently of the code: the held-out targets as evaluate_layer lays them out (chunk_len - 1 per chunk), the
    # evaluation half (chunks from test_chunks // 2 on), and the distinct (chunk, position // block) pairs in it.
    chunk = np.repeat(np.arange(test_chunks), chunk_len - 1)
    position = np.tile(np.arange(chunk_len - 1), test_chunks)
    held = chunk >= test_chunks // 2
    expected = len({(c, p // block) for c, p in zip(chunk[held], position[held])})
    settings = knn.KnnSettings(chunk_len=chunk_len, test_chunks=test_chunks, bootstrap_block=block, k=1)
    assert settings.evaluation_blocks() == expected
    assert len(np.unique(token_blocks(chunk[held], block))) == expected  # what the interval is computed on


def test_settings_that_give_fewer_than_ten_blocks_are_refused_in_the_job_files_words():
    from raygeom.errors import RaygeomError

    knn.KnnSettings(chunk_len=48, test_chunks=4, bootstrap_block=8).check_blocks()  # 2 x 6 = 12 blocks
    with pytest.raises(RaygeomError) as error:
        knn.KnnSettings(chunk_len=512, test_chunks=8, bootstrap_block=512).check_blocks()  # whole chunks: 4
    message = str(error.value)
    assert "into 4 block(s)" in message and "at least 10" in message and "bootstrap_block 512" in message
    assert "test_chunks 8" in message and "\n" not in message


def test_k_beyond_the_datastore_is_refused_not_clamped():
    from raygeom.errors import RaygeomError

    assert knn.KnnSettings(chunk_len=64, train_chunks=2, k=126).k == 126  # 2 x 63 keys: every key a neighbour
    with pytest.raises(RaygeomError, match=r"k 127 is more than the 126 keys the datastore holds"):
        knn.KnnSettings(chunk_len=64, train_chunks=2, k=127)
    with pytest.raises(RaygeomError, match="k 65536 is more than the 20440 keys"):
        knn.KnnSettings(k=65536)  # the defaults' datastore: 40 chunks of 511 predicted tokens


def test_lam_at_zero_or_one_is_no_grid_edge_but_a_smallest_positive_lam_is():
    grid = [0.0, 0.001, 0.01, 0.1, 1.0]
    assert knn.grid_edge(0.0, grid, knn.LAM_BOUNDS) == "" and knn.grid_edge(1.0, grid, knn.LAM_BOUNDS) == ""
    assert knn.grid_edge(0.001, [0.001, 0.01, 0.1], knn.LAM_BOUNDS) == "lower"
    assert knn.grid_edge(0.1, [0.001, 0.01, 0.1], knn.LAM_BOUNDS) == "upper"
    assert knn.grid_edge(0.01, [0.001, 0.01, 0.1], knn.LAM_BOUNDS) == ""
    assert knn.grid_edge(0.003, [0.003, 0.01, 1.0]) == "lower"  # a scale has no bound below


def _layer_rows(dispersion, perplexity, retrieval):
    return [
        {"layer": f"block_{i:02d}", "layer_index": i, "dispersion": d, "knn_perplexity": p, "target_in_neighbours": t,
         "n_keys": 100, "n_test": 50, "unit_key": f"u{i}"}
        for i, (d, p, t) in enumerate(zip(dispersion, perplexity, retrieval))
    ]  # fmt: skip


def test_the_spearman_over_layers_carries_its_fisher_interval(tmp_path):
    rng = np.random.default_rng(3)
    dispersion = rng.uniform(0.3, 0.9, 14)
    perplexity = 40 - 5 * dispersion + rng.normal(0, 1.0, 14)
    retrieval = rng.uniform(0.3, 0.5, 14)
    result = knn.summarise(Store(tmp_path), _layer_rows(dispersion, perplexity, retrieval), knn.KnnSettings())
    fit = result["spearman"]
    rho = stats.spearmanr(dispersion, -perplexity).statistic
    half = 1.959963984540054 * np.sqrt((1 + rho**2 / 2) / (14 - 3))  # Bonett & Wright's variance, Fisher's z
    assert fit["rho"] == pytest.approx(rho, rel=1e-12) and fit["note"] == ""
    assert fit["lo"] == pytest.approx(np.tanh(np.arctanh(rho) - half), rel=1e-9)
    assert fit["hi"] == pytest.approx(np.tanh(np.arctanh(rho) + half), rel=1e-9)
    assert result["spearman_retrieval"]["rho"] == pytest.approx(stats.spearmanr(dispersion, retrieval).statistic)


def test_over_fewer_than_ten_layers_the_spearman_gives_its_exact_permutation_p_instead(tmp_path):
    import itertools

    dispersion = np.array([0.9, 0.5, 0.45, 0.6, 0.4, 0.55])
    perplexity = np.array([44.0, 43.1, 43.5, 43.9, 43.0, 43.2])
    retrieval = np.full(6, 0.9)  # every layer retrieves alike (k = every key): a constant column
    result = knn.summarise(Store(tmp_path), _layer_rows(dispersion, perplexity, retrieval), knn.KnnSettings())
    fit = result["spearman"]
    rho = stats.spearmanr(dispersion, -perplexity).statistic
    orders = [stats.spearmanr(dispersion, -perplexity[list(p)]).statistic for p in itertools.permutations(range(6))]
    assert fit["rho"] == pytest.approx(rho) and np.isnan(fit["lo"]) and np.isnan(fit["hi"])
    assert fit["note"] == "too few points for an interval"
    assert fit["p_perm"] == pytest.approx(np.mean(np.abs(orders) >= abs(rho) - 1e-9))
    assert np.isnan(result["spearman_retrieval"]["rho"]) and "constant" in result["spearman_retrieval"]["note"]


def test_best_and_runner_up_over_fewer_than_ten_blocks_are_not_compared_and_the_note_says_why(tmp_path):
    store = Store(tmp_path)
    rng = np.random.default_rng(2)
    chunk = np.repeat([4, 5, 6, 7], 64)
    lm = np.log(rng.uniform(0.001, 0.5, chunk.size))
    _write_tokens(store, "good", "good", lm, lm + np.log(2), chunk)
    _write_tokens(store, "base", "base", lm, lm, chunk)
    rows = [
        {"layer": "base", "unit_key": "base", "layer_index": 1, "knn_perplexity": float(np.exp(-lm.mean()))},
        {"layer": "good", "unit_key": "good", "layer_index": 2, "knn_perplexity": float(np.exp(-lm.mean() - np.log(2)))},
    ]
    # whole chunks: 4 blocks. The difference is exact (half the base perplexity less it), its interval is not given.
    result = knn.best_against_runner_up(store, rows, knn.KnnSettings(bootstrap_block=64))
    assert result["difference"] == pytest.approx(-0.5 * np.exp(-lm.mean()), rel=1e-12)
    assert np.isnan(result["lo"]) and np.isnan(result["hi"]) and result["separated"] is None
    assert result["note"] == "no interval below 10 blocks (4)"
    assert knn.best_against_runner_up(store, rows, knn.KnnSettings(bootstrap_block=16))["separated"] is True


def _planted_features(directory, useless: bool, n_keys=60, d=4, chunks=4, per_chunk=10, vocab=7, seed=0):
    """A features directory as run_knn writes it: keys, queries, values, targets. ``useless``: no key's value is ever
    a held-out target (vocabulary split in two), so the kNN distribution never holds the target."""
    import pyarrow as pa

    from raygeom.store.tree import atomic_write_table, vector_column

    rng = np.random.default_rng(seed)
    n_queries = chunks * per_chunk
    values = rng.integers(0, 3, n_keys) if useless else rng.integers(0, vocab, n_keys)
    targets = rng.integers(3, vocab, n_queries) if useless else rng.integers(0, vocab, n_queries)
    layer = directory / "layer=block_00"
    atomic_write_table(
        pa.table({"vector": vector_column(rng.standard_normal((n_keys, d)).astype(np.float32))}), layer / "keys.parquet"
    )
    atomic_write_table(
        pa.table({"vector": vector_column(rng.standard_normal((n_queries, d)).astype(np.float32))}), layer / "queries.parquet"
    )
    atomic_write_table(pa.table({"value": values.astype(np.int64)}), directory / "values.parquet")
    lm = np.log(rng.uniform(0.05, 0.6, n_queries))
    chunk = np.repeat(np.arange(chunks), per_chunk).astype(np.int32)
    atomic_write_table(
        pa.table({"target": targets.astype(np.int64), "lm_logprob": lm, "chunk": chunk}), directory / "targets.parquet"
    )
    return lm, chunk


def test_a_useless_datastore_chooses_lam_zero_which_is_no_edge_of_either_grid(tmp_path):
    lm, chunk = _planted_features(tmp_path, useless=True)
    settings = knn.KnnSettings(chunk_len=11, train_chunks=6, test_chunks=4, k=5, lams="0,0.1,0.5", temperature_scales="0.1,1")
    result = knn.evaluate_layer(str(tmp_path), "block_00", settings, 7, "cpu")
    row = result["row"]
    held = chunk >= 2
    # lam = 0 is the base LM exactly; every lam > 0 only moves mass off the target
    assert row["lam"] == 0.0 and row["knn_perplexity"] == pytest.approx(np.exp(-lm[held].mean()), rel=1e-12)
    assert row["lam_edge"] == "" and row["scale_edge"] == ""  # nothing lies below 0; with lam = 0 every scale ties
    assert row["k"] == 5 and row["n_keys"] == 60


def test_a_k_beyond_the_stored_keys_is_refused_by_the_layer_not_clamped(tmp_path):
    from raygeom.errors import RaygeomError

    _planted_features(tmp_path, useless=False, n_keys=30)
    settings = knn.KnnSettings(chunk_len=11, train_chunks=6, test_chunks=4, k=31)  # 60 keys by the settings, 30 stored
    with pytest.raises(RaygeomError, match="k 31 is more than the 30 keys of its datastore"):
        knn.evaluate_layer(str(tmp_path), "block_00", settings, 7, "cpu")


# The tuning optimum of each of SmolLM2's 33 candidate layers (bbc, the defaults: 20,440 keys, k = 64), searched over
# temperature scales 0.001-3 and lams 0-0.9 on the tuning half (issue 45; the numbers in knn_lm's comment).
SMOLLM2_OPTIMA = {"scale": (0.003, 0.01, 0.03, 0.1), "lam": (0.02, 0.03, 0.05)}


def test_the_default_grids_hold_the_optima_measured_on_smollm2_inside_them():
    settings = knn.KnnSettings()
    scales, lams = settings.scale_values(), settings.lam_values()
    for value in SMOLLM2_OPTIMA["scale"]:
        assert value in scales and knn.grid_edge(value, scales) == "", value
    for value in SMOLLM2_OPTIMA["lam"]:
        assert value in lams and knn.grid_edge(value, lams, knn.LAM_BOUNDS) == "", value
    # room on both sides: a neighbour of each optimum either way
    assert min(scales) < min(SMOLLM2_OPTIMA["scale"]) and max(scales) > max(SMOLLM2_OPTIMA["scale"])
    assert min(lams) < min(SMOLLM2_OPTIMA["lam"]) and max(lams) > max(SMOLLM2_OPTIMA["lam"])


# Issue 45 item 5: an edge is flagged only when the optimum lies beyond the grid; a flat objective is no edge optimum;
# lam = 0 (the base LM) is the bound of lam's range, "kNN does not help" a result, not an edge.


def _write_planted(directory, keys, values, queries, targets, lm, chunks):
    """A features directory as run_knn writes it, from given arrays (one layer, block_00)."""
    import pyarrow as pa

    from raygeom.store.tree import atomic_write_table, vector_column

    layer = directory / "layer=block_00"
    atomic_write_table(pa.table({"vector": vector_column(np.asarray(keys, np.float32))}), layer / "keys.parquet")
    atomic_write_table(pa.table({"vector": vector_column(np.asarray(queries, np.float32))}), layer / "queries.parquet")
    atomic_write_table(pa.table({"value": np.asarray(values, np.int64)}), directory / "values.parquet")
    chunk = np.repeat(np.arange(chunks), len(targets) // chunks).astype(np.int32)
    atomic_write_table(
        pa.table({"target": np.asarray(targets, np.int64), "lm_logprob": np.asarray(lm, np.float64), "chunk": chunk}),
        directory / "targets.parquet",
    )


def test_a_temperature_that_changes_nothing_is_chosen_inside_its_grid_and_flagged_nowhere(tmp_path):
    # Every key equals every query: all distances are 0, so every temperature gives the same kNN distribution and
    # the tuning objective is exactly flat in the scale. 6 of each chunk's 10 targets are every key's value.
    targets = np.tile([0, 0, 0, 0, 0, 0, 1, 2, 3, 4], 4)
    _write_planted(tmp_path, np.ones((60, 4)), np.zeros(60), np.ones((40, 4)), targets, np.full(40, np.log(0.1)), 4)
    settings = knn.KnnSettings(
        chunk_len=11, train_chunks=6, test_chunks=4, k=5, lams="0.1,0.3,0.5,0.7,0.9", temperature_scales="0.1,1,10"
    )
    row = knn.evaluate_layer(str(tmp_path), "block_00", settings, 7, "cpu")["row"]
    # mean log(0.1 + 0.9 lam) * 0.6 + log(0.1 (1 - lam)) * 0.4 is highest at lam = 5/9: 0.5 of the grid
    assert row["lam"] == 0.5 and row["lam_edge"] == ""
    assert row["temperature_scale"] == 1.0 and row["scale_edge"] == ""  # the old choice: 0.1, flagged "lower"
    assert "flat objective" in row["selection"]


def test_a_temperature_still_improving_at_the_grid_top_is_flagged_upper_and_the_row_says_why(tmp_path):
    # Each query's nearest key (distance 0) holds a wrong token, four keys at distance 1 the target of half the
    # queries: p_knn(target) = 4 e^(-1/T) / (1 + 4 e^(-1/T)) rises with T up to 0.8 at T = inf, beyond any grid.
    keys = np.array([[1, 0, 0, 0]] + [[1, 1, 0, 0]] * 4 + [[9, 9, 9, 9]] * 55, dtype=float)
    values = np.array([0] + [1] * 4 + [3] * 55)
    targets = np.tile([1, 2], 20)
    _write_planted(tmp_path, keys, values, np.tile([1.0, 0, 0, 0], (40, 1)), targets, np.full(40, np.log(0.1)), 4)
    settings = knn.KnnSettings(
        chunk_len=11, train_chunks=6, test_chunks=4, k=5, lams="0.1,0.3,0.5,0.7", temperature_scales="0.1,1,10"
    )
    row = knn.evaluate_layer(str(tmp_path), "block_00", settings, 7, "cpu")["row"]
    assert row["temperature_scale"] == 10.0 and row["scale_edge"] == "upper"
    assert row["lam"] in (0.3, 0.5) and row["lam_edge"] == ""
    assert "upper edge" in row["selection"] and "optimum may lie beyond" in row["selection"]


def test_a_datastore_that_never_helps_chooses_the_base_lm_and_says_so_not_a_lower_lam_edge(tmp_path):
    lm, chunk = _planted_features(tmp_path, useless=True)
    settings = knn.KnnSettings(chunk_len=11, train_chunks=6, test_chunks=4, k=5, temperature_scales="0.1,1,10")
    row = knn.evaluate_layer(str(tmp_path), "block_00", settings, 7, "cpu")["row"]  # the default lams: 0.001-0.9
    # the old choice: lam 0.001 (the smallest tried), flagged "lower"
    assert row["lam"] == 0.0 and row["lam_edge"] == "" and row["scale_edge"] == ""
    assert row["knn_perplexity"] == pytest.approx(np.exp(-lm[chunk >= 2].mean()), rel=1e-12)
    assert np.isnan(row["temperature_scale"]) and np.isnan(row["temperature"])  # undetermined, not an edge
    assert "kNN does not help at this layer" in row["selection"]


SCALES, LAMS = [0.01, 0.1, 1.0, 10.0], [0.01, 0.05, 0.2]


def _objective(scale_part, lam_part=(0.002, 0.0, 0.003), level=30.0):
    """A tuning-perplexity grid (scales x lams): level * exp(scale_part[i] + lam_part[j]) (log-perplexity offsets)."""
    return level * np.exp(np.add.outer(np.asarray(scale_part, float), np.asarray(lam_part, float)))


@pytest.mark.parametrize(
    "scale_part, want, edge",
    [
        ([1e-3, 0.0, 0.0, 0.0], 1, ""),  # flat from 0.1 on: the lowest interior, not the edge the argmin may pick
        ([1e-3, 2e-5, 1e-5, 0.0], 2, ""),  # falls at the edge by less than the tolerance: the best interior point
        ([1e-2, 5e-3, 2e-3, 0.0], 3, "upper"),  # still falls by 2e-3 at the edge: the optimum lies beyond
        ([0.0, 5e-3, 6e-3, 7e-3], 0, "lower"),
        ([3e-3, 0.0, 1e-3, 2e-3], 1, ""),  # an interior optimum, the plain argmin
    ],
)
def test_planted_objectives_choose_the_known_point_and_flag_only_an_optimum_beyond_the_grid(scale_part, want, edge):
    choice = knn.choose_tuning_point(_objective(scale_part), 40.0, SCALES, LAMS)
    assert (choice["scale_index"], choice["lam_index"]) == (want, 1)
    assert choice["scale_edge"] == edge and choice["lam_edge"] == ""
    assert choice["tuning_perplexity"] == pytest.approx(_objective(scale_part)[want, 1], rel=1e-15)
    assert ("optimum may lie beyond" in choice["selection"]) == bool(edge)


def test_planted_lam_objectives_base_lm_within_tolerance_and_an_optimum_below_the_smallest_lam():
    grid = _objective([1e-3, 0.0, 1e-3, 2e-3])  # best 30.0 at (0.1, 0.05)
    for base in (29.0, 30.0, 30.0 * (1 + 0.5 * knn.TUNE_RTOL)):  # better than every point, or within the tolerance
        choice = knn.choose_tuning_point(grid, base, SCALES, LAMS)
        assert choice["scale_index"] is None and choice["lam_index"] is None
        assert choice["scale_edge"] == choice["lam_edge"] == "" and choice["tuning_perplexity"] == base
        assert "kNN does not help" in choice["selection"] and "temperature is undetermined" in choice["selection"]
    assert knn.choose_tuning_point(grid, 30.0 * (1 + 2 * knn.TUNE_RTOL), SCALES, LAMS)["lam_index"] == 1
    # the smallest lam best by more than the tolerance, the base LM worse: the optimum lies in (0, 0.01)
    choice = knn.choose_tuning_point(_objective([1e-3, 0.0, 1e-3, 2e-3], (0.0, 2e-3, 5e-3)), 31.0, SCALES, LAMS)
    assert (choice["scale_index"], choice["lam_index"], choice["lam_edge"]) == (1, 0, "lower")
    # lam = 1 and lam = 0 in the grid are bounds, no edges; a lam column not tried (NaN) is no part of the grid
    grid = _objective([1e-3, 0.0, 1e-3, 2e-3], (0.0, 1e-3, -2e-3))
    assert knn.choose_tuning_point(grid, 40.0, SCALES, [0.01, 0.5, 1.0])["lam_edge"] == ""
    grid[:, 2] = np.nan
    choice = knn.choose_tuning_point(grid, 40.0, SCALES, [0.01, 0.5, 1.0])
    assert choice["lam_index"] == 0 and choice["lam_edge"] == "lower"


# Tuning optima on the every-analysis run's stored features (bbc, chunk_len 128; grid.py-style scan over scales
# 1e-4 to 1e4): SmolLM2 block_11/12 at 10-30, attn_last at 3e-4; Gemma-3 block_01 at 30, block_13/16/attn_last at
# 1e-4-3e-4 (within 1e-5 of each other). The default scales must reach both limits with a point inside.
EVERY_ANALYSIS_SCALES = (0.0003, 10.0, 30.0)


def test_the_default_scales_hold_the_every_analysis_optima_inside_them():
    scales = knn.KnnSettings().scale_values()
    for value in EVERY_ANALYSIS_SCALES:
        assert value in scales and knn.grid_edge(value, scales) == "", value
