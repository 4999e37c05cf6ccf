"""The width page's flattening test on planted held-out perplexity curves whose answer is known by hand."""

import math

import numpy as np
import pytest

from tools.width_page import FLAT_FALL, flattening


def _curve(run: str, values: dict[int, float], width: int = 128) -> list[dict]:
    return [
        {"run": run, "width": width, "depth": 4, "run_seed": 0, "step": step, "heldout_perplexity": value}
        for step, value in values.items()
    ]


def _exponential(rate_per_quarter: float, noise: float = 0.0, seed: int = 0) -> dict[int, float]:
    """Evaluations every 100 of 800 steps; from step 600 on, perplexity changes by ``rate_per_quarter`` each 200 steps."""
    rng = np.random.default_rng(seed)
    early = {0: 1000.0, 100: 400.0, 200: 250.0, 300: 180.0, 400: 150.0, 500: 130.0}
    tail = {s: 120.0 * (1 + rate_per_quarter) ** ((s - 600) / 200) * math.exp(rng.normal(0, noise)) for s in range(600, 801, 25)}
    return {**early, **tail}


@pytest.mark.parametrize(
    "rate, flattened",
    [
        (-0.10, "no"),  # still falling 10% a quarter
        (-0.005, "yes"),  # 0.5% a quarter
        (+0.08, "yes"),  # a rise: overfitting
    ],
)
def test_an_exact_curve_has_its_planted_fall_and_verdict(rate, flattened):
    (row,) = flattening(_curve("r", _exponential(rate)), steps=800)
    assert row["tail_from"] == 600 and row["tail_points"] == 9  # 600, 625, ..., 800
    assert row["last_quarter_fall"] == pytest.approx(-rate)
    assert row["last_quarter_fall_lo"] == pytest.approx(-rate) and row["last_quarter_fall_hi"] == pytest.approx(-rate)
    assert row["flattened"] == flattened
    assert row["final_perplexity"] == pytest.approx(120.0 * (1 + rate))


def test_noise_that_hides_the_margin_is_undecided_and_more_evaluations_decide():
    noisy = flattening(_curve("r", _exponential(-0.005, noise=0.05, seed=3)), steps=800)[0]
    assert noisy["last_quarter_fall_lo"] < FLAT_FALL < noisy["last_quarter_fall_hi"]
    assert noisy["flattened"] == "undecided"
    quiet = flattening(_curve("r", _exponential(-0.005, noise=0.001, seed=3)), steps=800)[0]
    assert quiet["last_quarter_fall_hi"] < FLAT_FALL and quiet["flattened"] == "yes"


def test_the_lowest_point_and_too_few_evaluations():
    (row,) = flattening(_curve("r", {0: 1000.0, 300: 95.0, 600: 100.0, 800: 110.0}), steps=800)
    assert (row["lowest_perplexity"], row["lowest_step"]) == (95.0, 300)
    assert row["tail_points"] == 2 and math.isnan(row["last_quarter_fall_lo"]) and row["flattened"] == "undecided"
    assert row["last_quarter_fall"] == pytest.approx(1 - 110 / 100)  # a line through two points


def test_each_run_is_read_on_its_own_curve_in_ladder_order():
    rows = flattening(_curve("wide", _exponential(-0.10), width=256) + _curve("narrow", _exponential(0.0), width=128), steps=800)
    assert [(r["run"], r["flattened"]) for r in rows] == [("narrow", "yes"), ("wide", "no")]
