"""The demo's path on the real pretrained SmolLM2-135M, with small N: CLI -> Ray -> Parquet -> plot."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from raygeom.store.tree import Store

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_laptop_job_on_smollm2_writes_finite_results_for_every_layer(tmp_path):
    out = tmp_path / "out"
    # Wide enough that the console table's layer column shows "final_norm" whole (since z got its "± 95%" column).
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), COLUMNS="200")
    env.pop("HF_HUB_CACHE", None)
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "cli.py"),
            "run",
            str(ROOT / "jobs" / "laptop.toml"),
            "--out",
            str(out),
            "--n-samples",
            "110",
            "--n-null",
            "6",
            "--seq-len",
            "48",
        ],  # k=100 after CCR-1 needs rank 102: at least 104 distinct texts
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Subspace PGA" in result.stdout and "final_norm" in result.stdout
    table = pq.read_table(out / "results" / "pga.parquet").to_pandas()
    expected_layers = ["embed", *[f"block_{i:02d}" for i in range(30)], "final_norm"]
    assert sorted(table["layer"]) == sorted(expected_layers)
    assert (table["d"] == 576).all() and (table["k"] == 100).all() and (table["n"] == 110).all()
    # A layer without the rank to be scored (texts cut at 48 tokens share last tokens, so the embedding repeats
    # vectors) is shown with its reason and no z; every other layer has finite numbers.
    unscored = table["note"].fillna("") != ""
    assert table.loc[unscored, "note"].str.contains("rank").all()
    assert unscored.sum() <= 2 and not unscored[table["layer"].str.startswith("block_")].any()
    for column in ("rho_readout", "null_mean", "null_std", "z"):
        assert np.isfinite(table.loc[~unscored, column]).all(), column
    assert (table.loc[~unscored, "null_std"] > 0).all()
    plot = out / "plots" / "pga_z_vs_depth.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 20_000
    samples = pq.read_table(Store(out).samples_path("smollm2-135m-instruct-q4_1", "main"))
    # A PGA-only run skips the full-vocabulary LM head: the nll column is there, and empty.
    assert samples.num_rows == 110 and np.isnan(samples["nll"].to_numpy()).all()
    assert set(samples["label"].to_pylist()) <= {"business", "entertainment", "politics", "sports", "tech"}
    # The run ends with the store's HTML report, which renders in headless Chromium without errors.
    from tests.browser import pixel_spread, visit

    report = out / "report.html"
    assert "report:" in result.stdout and report.is_file()
    page = visit(report, probe="document.querySelectorAll('.plotly-graph-div .main-svg').length")
    assert page.errors == [] and page.probe >= 1 and pixel_spread(page.screenshot)[0] > 10
