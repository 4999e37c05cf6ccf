"""The width page's flattening test on planted held-out perplexity curves whose answer is known by hand."""

import pytest

from raygeom.jobs.width import FLAT_FALL, flattening


def _curve(run: str, values: dict[int, float]) -> list[dict]:
    return [
        {"run": run, "width": 128, "depth": 4, "run_seed": 0, "step": step, "heldout_perplexity": value}
        for step, value in values.items()
    ]


@pytest.mark.parametrize(
    "values, drop, flattened, lowest_step",
    [
        ({0: 1000.0, 300: 120.0, 600: 100.0, 800: 90.0}, 0.10, "no", 800),  # 100 at step 600 -> 90: still falling 10%
        ({0: 1000.0, 300: 120.0, 600: 100.0, 800: 99.0}, 0.01, "yes", 800),
        ({0: 1000.0, 300: 95.0, 600: 100.0, 800: 110.0}, -0.10, "yes", 300),  # a rise: past its lowest point
    ],
)
def test_flattening_reads_the_last_quarter_and_the_lowest_point(values, drop, flattened, lowest_step):
    (row,) = flattening(_curve("r", values), steps=800)
    assert row["quarter_step"] == 600  # the evaluation nearest 3/4 of 800 steps
    assert row["last_quarter_drop"] == pytest.approx(drop)
    assert row["flattened"] == flattened
    assert row["lowest_step"] == lowest_step and row["lowest_perplexity"] == min(values.values())
    assert row["final_perplexity"] == values[800]


def test_the_threshold_is_a_strict_fall_below_flat_fall():
    just = 100.0 * (1 - FLAT_FALL)
    (row,) = flattening(_curve("r", {600: 100.0, 800: just * 1.0001}), steps=800)
    assert row["flattened"] == "yes"
    (row,) = flattening(_curve("r", {600: 100.0, 800: just * 0.999}), steps=800)
    assert row["flattened"] == "no"


def test_each_run_is_read_on_its_own_curve():
    rows = flattening(_curve("b", {600: 100.0, 800: 50.0}) + _curve("a", {600: 100.0, 800: 100.0}), steps=800)
    assert [(r["run"], r["flattened"]) for r in rows] == [("a", "yes"), ("b", "no")]
