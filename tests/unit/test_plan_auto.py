"""`raygeom plan` prices `--n-null auto`: bounds for Gaussian nulls, and the expected count from a stored pilot's z."""

import os

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from raygeom.analyses.pga_budget import REFERENCE_PGA_UNIT_SECONDS, job_budget
from raygeom.jobs import plan as sweep
from raygeom.jobspec import load_job
from raygeom.store.tree import Store

JOB = os.path.join(os.path.dirname(__file__), "..", "..", "jobs", "pythia-sweep.toml")
Q = stats.norm.ppf(0.975)


def small_job(tmp_path):
    """The full Pythia job cut to pythia-14m (d = 128, 8 layers) at two revisions."""
    with open(JOB) as handle:
        text = handle.read()
    text = text.replace(
        'sizes = ["14m", "31m", "70m", "160m", "410m", "1b", "1.4b", "2.8b", "6.9b", "12b"]', 'sizes = ["14m"]'
    ).replace('revisions = "all"', 'revisions = ["step1000", "step2000"]')
    path = tmp_path / "small.toml"
    path.write_text(text.replace('out = "../runs/pythia-sweep"', f'out = "{tmp_path / "store"}"'))
    return path


def small_plan(tmp_path, monkeypatch):
    """The small job with ``n_null = "auto"`` (its first block: 100 nulls, the count the job fixes)."""
    monkeypatch.setattr(sweep, "cached_config", lambda spec: None)  # layers from the sizes table
    path = small_job(tmp_path)
    path.write_text(path.read_text().replace("n_null = 100", 'n_null = "auto"'))
    job = load_job(path)
    plan = sweep.build_plan(job, Store(job.out), fingerprint="not-run")
    assert len(plan.revisions) == 2 and plan.n_units == 16
    return plan


def need(z: float, inflation: float = 1.0) -> float:
    """The delta method's need at the default rule max(0.25, 0.05 |z|) and, up to 500 nulls (--n-null-decide), until
    the half-width is below the distance to the nearest of 0, -2, 2; in blocks of 100, capped at 1000."""
    h = max(0.25, 0.05 * abs(z))
    per_null = Q**2 * (1 + z * z / 2) * inflation
    nearest = min(abs(z), abs(abs(z) - 2))
    count = max(per_null / h**2, min(500.0, per_null / nearest**2 if nearest else np.inf))
    return min(1000.0, max(100.0, np.ceil(count / 100) * 100))


def test_without_a_pilot_plan_gives_the_rule_s_bounds(tmp_path, monkeypatch):
    plan = small_plan(tmp_path, monkeypatch)
    budget = job_budget(plan)
    units = 2 * 8
    assert budget.units == units and budget.expected_nulls is None
    assert (budget.low_nulls, budget.fixed_nulls) == (100 * units, 100 * units)
    # Most the rule asks: at |z| = 5 both targets are 0.25, need 61.5 x 13.5 = 830 -> 900.
    assert budget.high_nulls == 900 * units
    per_scoring = REFERENCE_PGA_UNIT_SECONDS[128] / 101  # N = 2000 as the reference
    assert budget.cpu_seconds["fixed"] == pytest.approx(units * 101 * per_scoring)
    assert budget.cpu_seconds["high"] == pytest.approx(units * 901 * per_scoring)


def test_a_stored_pilot_gives_the_expected_count_per_unit(tmp_path, monkeypatch):
    plan = small_plan(tmp_path, monkeypatch)
    store = plan.store
    layers = plan.revisions[0].layers
    planted = {layer: z for layer, z in zip(layers, [0.3, 2.0, -4.0, -8.0, -12.0, -34.0, 1.0, 6.0])}
    for i, (layer, z) in enumerate(planted.items()):
        se = np.sqrt((1 + z * z / 2) / 100) * (1.5 if layer == layers[5] else 1.0)  # one null with heavier tails
        store.write_result(
            "pga", f"pilot{i}", {"model": "EleutherAI--pythia-14m", "layer": layer, "z": z, "z_se": se, "n_null": 100}
        )
    budget = job_budget(plan)
    expected = 2 * sum(need(z, 2.25 if layer == layers[5] else 1.0) for layer, z in planted.items())
    assert budget.expected_nulls == pytest.approx(expected)
    assert budget.pilot_rows == 8 and budget.pilot_units == 16
    per_scoring = REFERENCE_PGA_UNIT_SECONDS[128] / 101
    assert budget.cpu_seconds["expected"] == pytest.approx((expected + 16) * per_scoring)


def test_plan_prints_the_auto_budget_where_n_null_is_auto(tmp_path, monkeypatch):
    from raygeom.cli.root import app
    from raygeom.jobs import preflight

    monkeypatch.setattr(sweep, "cached_config", lambda spec: None)  # layers from the sizes table, not a test cache
    monkeypatch.setattr(preflight, "model_config", lambda spec: {})  # nor the test cache's tiny d (64) under k = 100
    fixed = CliRunner().invoke(app, ["plan", str(small_job(tmp_path))], env={"COLUMNS": "250"})
    assert fixed.exit_code == 0, fixed.output
    assert "--n-null auto" not in fixed.output and "n_null=100" in " ".join(fixed.output.split())  # the job fixes 100
    job = small_job(tmp_path)
    job.write_text(job.read_text().replace("n_null = 100", 'n_null = "auto"'))
    result = CliRunner().invoke(app, ["plan", str(job)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "n_null=auto" in text
    assert (
        "--n-null auto (stop at max(0.25, 0.05 x |z|), on while 0 or ±2 is inside, up to 500, cap 1,000) for the 16 "
        "units to compute"
    ) in text
    assert "1,600 to 14,400 nulls (100 to 900 per unit for Gaussian nulls)" in text
    assert "no pilot in this store" in text
