"""z from few nulls (no interval below the minimum, bias in the error) and the --n-null auto stopping rule
max(absolute, relative x |z|), against answers known in closed form or computed here with numpy/scipy."""

import numpy as np
import pytest
from rich.console import Console
from scipy import special, stats
from typer.testing import CliRunner

from raygeom.analyses import pga as pga_analysis
from raygeom.errors import RaygeomError
from raygeom.numerics.uncertainty import (
    NULL_SD_FLOOR,
    Z_MIN_NULL,
    auto_null_count,
    expected_auto_nulls,
    holds_threshold,
    null_target_reached,
    stop_half_width,
    z_jackknife_bias,
    z_uncertainty,
)
from raygeom.params import PGAParams

MU, SIGMA = 0.3, 0.02
INTERVAL = ("z_se", "z_lo", "z_hi", "z_half_width")
Q = stats.norm.ppf(0.975)


def gaussian(seed, shape):
    return np.random.default_rng([seed, 31]).normal(MU, SIGMA, shape)


# ----------------------------------------------------------------------------- no interval below the minimum


@pytest.mark.parametrize("n", [2, 3, Z_MIN_NULL - 1])
def test_below_the_minimum_z_is_kept_and_no_interval_is_given(n):
    nulls = gaussian(n, n)
    rho = MU - 2 * SIGMA
    u = z_uncertainty(rho, nulls, seed=1)
    assert all(np.isnan(u[name]) for name in INTERVAL)
    assert u["z"] == pytest.approx((rho - nulls.mean()) / nulls.std(ddof=1), rel=1e-12)
    assert u["p_upper"] == pytest.approx((1 + np.sum(nulls >= rho)) / (n + 1))


def test_the_issue_cases_two_and_three_nulls_give_no_interval():
    # --n-null 2 reported +-0.00 (every resample of 2 draws has zero or one spread) and --n-null 3 +-7.8e14 (a resample
    # of two nearly equal draws); both now carry no interval at all.
    for nulls in ([0.31, 0.29], [0.3, 0.3 + 1e-15, 0.32]):
        u = z_uncertainty(0.25, nulls)
        assert np.isfinite(u["z"]) and all(np.isnan(u[name]) for name in INTERVAL)


def test_at_the_minimum_the_interval_is_finite_sized_like_the_delta_method_and_covers():
    n, z_true = Z_MIN_NULL, 2.0
    covered, ratios = 0, []
    for t in range(200):
        nulls = gaussian(1000 + t, n)
        u = z_uncertainty(MU + z_true * SIGMA, nulls, seed=t, n_boot=300)
        assert u["z_lo"] < u["z"] < u["z_hi"]
        ratios.append(u["z_se"] / np.sqrt((1 + u["z"] ** 2 / 2) / n))  # delta method, computed here
        covered += u["z_lo"] <= z_true <= u["z_hi"]
    # Never a zero-width or an astronomically wide interval; the usual size on average.
    assert 0.8 < np.median(ratios) < 1.3 and 0.3 < min(ratios) and max(ratios) < 4
    assert 0.88 <= covered / 200 <= 0.99


def test_degenerate_draws_give_no_interval_but_keep_z():
    one_outlier = np.r_[np.full(29, 0.3), 0.31]  # 36 % of resamples hold no spread
    rounding = 0.3 + np.random.default_rng(2).normal(0, NULL_SD_FLOOR / 10, 50)  # float noise, not a distribution
    for nulls in (one_outlier, rounding):
        u = z_uncertainty(0.2, nulls)
        assert np.isfinite(u["z"]) and all(np.isnan(u[name]) for name in INTERVAL)


# ----------------------------------------------------------------------------- bias of z over the null draws


def test_jackknife_bias_is_the_leave_one_out_formula():
    x = gaussian(5, 25)
    rho = MU - 7 * SIGMA
    z = (rho - x.mean()) / x.std(ddof=1)
    loo = np.array([(rho - np.delete(x, i).mean()) / np.delete(x, i).std(ddof=1) for i in range(x.size)])
    assert z_jackknife_bias(rho, x) == pytest.approx(24 * (loo.mean() - z), rel=1e-9)
    rows = gaussian(6, (3, 25))
    np.testing.assert_allclose(z_jackknife_bias(rho, rows), [z_jackknife_bias(rho, r) for r in rows], rtol=1e-12)


def test_jackknife_removes_the_known_bias_of_z_on_gaussian_nulls():
    # For n Gaussian draws the mean and sd are independent and E[sigma / sd] = sqrt((n-1)/2) G((n-2)/2) / G((n-1)/2),
    # so E[z] = z_true E[sigma / sd]: 4 % outward at n = 20.
    n, z_true, sets = 20, -10.0, 4000
    x = gaussian(7, (sets, n))
    rho = MU + z_true * SIGMA
    z = (rho - x.mean(axis=1)) / x.std(axis=1, ddof=1)
    factor = np.sqrt((n - 1) / 2) * np.exp(special.gammaln((n - 2) / 2) - special.gammaln((n - 1) / 2))
    mc = z.std() / np.sqrt(sets)
    assert z.mean() == pytest.approx(z_true * factor, abs=4 * mc)
    bias = z_jackknife_bias(rho, x)
    assert bias.mean() == pytest.approx(z_true * (factor - 1), rel=0.15)
    corrected = (z - bias).mean()
    assert abs(corrected - z_true) < 4 * mc + 0.05 and abs(corrected - z_true) < abs(z.mean() - z_true) / 4


def test_z_se_is_the_root_mean_square_of_the_bootstrap_spread_and_the_bias():
    x, rho, seed, n_boot = gaussian(8, 40), MU - 15 * SIGMA, 3, 500
    rng = np.random.default_rng([seed, 0xB007])  # the documented stream of z's bootstrap
    resampled = x[rng.integers(0, x.size, size=(n_boot, x.size))]
    boot = (rho - resampled.mean(axis=1)) / resampled.std(axis=1, ddof=1)
    u = z_uncertainty(rho, x, seed=seed, n_boot=n_boot)
    assert u["z_se"] ** 2 == pytest.approx(boot.var(ddof=1) + z_jackknife_bias(rho, x) ** 2, rel=1e-9)
    assert u["z_half_width"] == pytest.approx(Q * u["z_se"]) and u["z_hi"] - u["z"] == pytest.approx(u["z_half_width"])


# ----------------------------------------------------------------------------- the stopping rule


def test_stop_half_width_is_absolute_near_zero_and_relative_far_out():
    assert stop_half_width(0.0, 0.25, 0.05) == 0.25
    assert stop_half_width(-4.0, 0.25, 0.05) == 0.25
    assert stop_half_width(-34.0, 0.25, 0.05) == pytest.approx(1.7)
    assert stop_half_width(-34.0, 0.25, None) == 0.25


def test_expected_auto_nulls_is_the_delta_method_need_in_whole_blocks():
    z = np.array([0.0, 4.0, -10.0, -34.0])
    need_abs = (Q / 0.25) ** 2 * (1 + z**2 / 2)  # 61.5 (1 + z^2/2)
    h = np.maximum(0.25, 0.05 * np.abs(z))
    need_rel = (Q / h) ** 2 * (1 + z**2 / 2)
    assert list(expected_auto_nulls(z, 0.25, None, cap=10**6)) == list(np.maximum(100, np.ceil(need_abs / 100) * 100))
    assert list(expected_auto_nulls(z, 0.25, 0.05, cap=10**6)) == list(np.maximum(100, np.ceil(need_rel / 100) * 100))
    assert list(expected_auto_nulls(z, 0.25, 0.05, cap=10**6)) == [100, 600, 800, 800]
    assert expected_auto_nulls(-34.0, 0.25, None, cap=1000) == 1000


def test_auto_with_a_relative_target_stops_at_the_first_block_meeting_the_larger_target():
    rho = MU - 12 * SIGMA
    nulls = gaussian(11, 3000)
    count = auto_null_count(rho, nulls, 0.25, cap=3000, relative_target=0.05, n_boot=400)
    u = z_uncertainty(rho, nulls[:count], n_boot=400)
    assert u["z_half_width"] <= max(0.25, 0.05 * abs(u["z"]))
    before = z_uncertainty(rho, nulls[: count - 100], n_boot=400)
    assert before["z_half_width"] > max(0.25, 0.05 * abs(before["z"]))
    # The delta method's need at h = 0.6: (1.96 / 0.6)^2 (1 + 72) = 779; at 0.25 alone it is 4,500.
    assert count == pytest.approx(779, abs=250)
    assert not null_target_reached(rho, nulls[: 2 * count], 0.25, cap=3000, n_boot=400)


def test_the_analysis_rule_is_split_invariant_and_is_the_numerics_rule():
    """analyses.pga.more_nulls with 1 and with 7 chunks per block (null i drawn from (seed, i) alone, as null_rhos
    draws it): the same count and the same z, equal to what auto_null_count says of the same draws."""

    def draw(indices):
        return np.array([np.random.default_rng([5, i]).normal(MU, SIGMA) for i in indices])

    rho = MU - 9 * SIGMA
    results = []
    for chunks in (1, 7):
        params = PGAParams(
            n_null=100, n_null_auto=True, z_half_width=0.25, z_rel_width=0.05, n_null_cap=2000, null_chunks=chunks, seed=5
        )
        nulls = np.concatenate([draw(c) for c in pga_analysis.null_chunks(params)])
        while extra := pga_analysis.more_nulls(params, rho, nulls):
            assert len(extra) == min(chunks, 100) and sum(map(len, extra)) == 100
            nulls = np.concatenate([nulls, *[draw(c) for c in extra]])
        results.append((nulls.size, z_uncertainty(rho, nulls, seed=5)))
    assert results[0] == results[1]
    assert results[0][0] == auto_null_count(rho, draw(range(2000)), 0.25, cap=2000, seed=5, relative_target=0.05)
    assert 100 < results[0][0] < 1000


def test_rel_width_is_checked_and_in_the_unit_key_of_auto_runs_only():
    with pytest.raises(RaygeomError, match="z.rel.width"):
        PGAParams(z_rel_width=-0.1)
    with pytest.raises(RaygeomError, match="z.rel.width"):
        PGAParams(z_rel_width=float("nan"))
    auto = {"n_null": 100, "n_null_auto": True}
    keys = {pga_analysis.pga_unit_key("x", "block_01", PGAParams(**auto, z_rel_width=w)) for w in (0.0, 0.05, 0.1)}
    assert len(keys) == 3
    fixed = {pga_analysis.pga_unit_key("x", "block_01", PGAParams(n_null=100, z_rel_width=w)) for w in (0.0, 0.05)}
    assert len(fixed) == 1


def test_a_degenerate_null_stops_auto_at_once():
    assert null_target_reached(0.1, np.r_[np.full(199, 0.3), 0.31], 0.25, cap=1000, relative_target=0.05)


def test_console_says_why_a_z_has_no_interval():
    from raygeom.report.figures import pga_table

    rows = [
        {
            "layer": "embed",
            "rho_readout": 0.3,
            "null_mean": 0.2,
            "null_std": 0.01,
            "z": 10.0,
            "z_lo": float("nan"),
            "z_hi": float("nan"),
            "p_upper": 1 / 3,
            "n_null": 2,
        },
        {
            "layer": "block_00",
            "rho_readout": 0.3,
            "null_mean": 0.2,
            "null_std": 0.01,
            "z": 10.0,
            "z_lo": 9.0,
            "z_hi": 11.0,
            "p_upper": 0.01,
            "n_null": 100,
        },
    ]
    console = Console(width=200, record=True)
    console.print(pga_table(rows, "t"))
    text = console.export_text()
    assert f"+10.00 (no interval below {Z_MIN_NULL} nulls)" in text and "+10.00 ± 1.00" in text


@pytest.mark.parametrize(
    "flag, values, bad, field",
    [("--z-rel-width", ("0.1", "0.1"), "-1", "z_rel_width"), ("--n-null-decide", ("300", "0"), "x", "n_null_decide")],
)
def test_the_rule_s_flags_reach_the_job(monkeypatch, flag, values, bad, field):
    from raygeom.cli import root

    jobs = []
    monkeypatch.setattr(root, "_run", lambda job, address, num_cpus: jobs.append(job))
    for command, value in zip((["run", "jobs/laptop.toml"], ["pga"]), values):
        assert CliRunner().invoke(root.app, [*command, "--n-null", "auto", flag, value]).exit_code == 0
    assert [getattr(j.pga, field) for j in jobs] == [float(v) if "." in v else int(v) for v in values]
    result = CliRunner().invoke(root.app, ["pga", "--n-null", "auto", flag, bad])
    assert result.exit_code == 2 and flag.lstrip("-").replace("-", "_") in result.output.replace("-", "_")


# ----------------------------------------------------------------------------- decisions still open: --n-null-decide


@pytest.mark.parametrize(
    "interval, open_",
    [
        ((1.8, 2.2), True),
        ((-2.3, -1.9), True),
        ((-0.1, 0.4), True),
        ((0.1, 1.9), False),
        ((2.01, 3.0), False),
        ((-5.0, -2.5), False),
        ((2.0, 2.5), True),
    ],
)
def test_an_interval_holding_0_or_2_leaves_a_decision_open(interval, open_):
    assert holds_threshold(*interval) is open_


def test_auto_keeps_drawing_while_the_interval_holds_a_threshold_up_to_the_decide_cap():
    """A layer planted at z = 2 (rho two null sds above the null mean): its interval holds 2 at the
    half-width target, so the rule goes on to the decide cap; without it, it stops at the half-width."""
    nulls = gaussian(21, 3000)
    rho = MU + 2.0 * SIGMA
    plain = auto_null_count(rho, nulls, 0.25, cap=3000, relative_target=0.05, n_boot=400)
    u = z_uncertainty(rho, nulls[:plain], n_boot=400)
    assert u["z_lo"] < 2 < u["z_hi"], "planted on the threshold: the half-width alone leaves |z| > 2 open"
    decided = auto_null_count(rho, nulls, 0.25, cap=3000, relative_target=0.05, n_boot=400, decide_cap=800)
    assert plain < decided == 800
    assert auto_null_count(rho, nulls, 0.25, cap=600, relative_target=0.05, n_boot=400, decide_cap=800) == 600


@pytest.mark.parametrize("z_planted", [-9.0, -3.2, 0.9, 3.5])
def test_a_decided_layer_stops_where_it_did_without_the_decide_cap(z_planted):
    nulls = gaussian(22, 2000)
    rho = MU + z_planted * SIGMA
    plain = auto_null_count(rho, nulls, 0.25, cap=2000, relative_target=0.05, n_boot=400)
    u = z_uncertainty(rho, nulls[:plain], n_boot=400)
    if holds_threshold(u["z_lo"], u["z_hi"]):
        pytest.skip("this draw left a threshold inside the interval")
    assert auto_null_count(rho, nulls, 0.25, cap=2000, relative_target=0.05, n_boot=400, decide_cap=1000) == plain


def test_the_decide_clause_stops_at_the_first_block_whose_interval_leaves_the_thresholds():
    """z planted at 2.3: the interval at the half-width target may still hold 2; the count with the clause is the
    first block end (computed here by z_uncertainty itself, block by block) where the interval excludes 0 and 2."""
    nulls = gaussian(23, 3000)
    rho = MU + 2.3 * SIGMA
    count = auto_null_count(rho, nulls, 0.25, cap=3000, relative_target=0.05, n_boot=400, decide_cap=3000)
    for end in range(100, 3001, 100):
        u = z_uncertainty(rho, nulls[:end], n_boot=400)
        if u["z_half_width"] <= 0.25 and not (u["z_lo"] <= 2 <= u["z_hi"] or u["z_lo"] <= 0 <= u["z_hi"]):
            break
    assert count == end


def test_expected_auto_nulls_with_the_decide_cap_goes_on_to_the_nearest_threshold():
    z = np.array([0.0, 1.5, 1.9, 2.0, 2.6, 3.5, -10.0])
    per_null = Q**2 * (1 + z**2 / 2)
    h = np.maximum(0.25, 0.05 * np.abs(z))
    nearest = np.minimum(np.abs(z), np.abs(np.abs(z) - 2))
    with np.errstate(divide="ignore"):
        need = np.maximum(per_null / h**2, np.minimum(per_null / nearest**2, 500))
    want = np.minimum(np.maximum(100, np.ceil(need / 100) * 100), 1000)
    got = expected_auto_nulls(z, 0.25, 0.05, cap=1000, decide_cap=500)
    assert list(got) == list(want)
    assert list(got) == [500, 200, 500, 500, 300, 500, 800]
    assert list(expected_auto_nulls(z, 0.25, 0.05, cap=1000, decide_cap=0)) == list(expected_auto_nulls(z, 0.25, 0.05, cap=1000))


def test_decide_is_checked_and_in_the_unit_key_of_auto_runs_only_and_0_keeps_the_old_key():
    from raygeom.analyses.pga import PGA_VERSION
    from raygeom.store.tree import content_key

    with pytest.raises(RaygeomError, match="n.null.decide"):
        PGAParams(n_null_decide=-1)
    auto = {"n_null": 100, "n_null_auto": True}
    keys = {pga_analysis.pga_unit_key("x", "block_01", PGAParams(**auto, n_null_decide=c)) for c in (0, 300, 500)}
    assert len(keys) == 3
    before = content_key("pga", PGA_VERSION, "x", "block_01", 100, 1, ("auto", 100, 0.25, 0.05, 1000), 0, 10)
    assert pga_analysis.pga_unit_key("x", "block_01", PGAParams(**auto, n_null_decide=0)) == before
    fixed = {pga_analysis.pga_unit_key("x", "block_01", PGAParams(n_null=100, n_null_decide=c)) for c in (0, 500)}
    assert len(fixed) == 1
