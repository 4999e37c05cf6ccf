"""CONTRIBUTING.md's "add an analysis" recipe, as a contributor follows it: its code blocks (each marked with the file it
goes in) are written into a copy of the package, the recipe's own test runs against it, and its job file runs through
the CLI (on the tiny offline Pythia instead of SmolLM2). So the recipe cannot drift from the code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
FILE_BLOCK = re.compile(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", re.S)


def recipe_files(text: str) -> dict[str, str]:
    return {path: body for path, body in FILE_BLOCK.findall(text)}


def test_the_recipe_has_its_four_files():
    files = recipe_files((ROOT / "CONTRIBUTING.md").read_text())
    assert sorted(files) == [
        "mean-norm.toml",
        "raygeom/analyses/mean_norm.py",
        "raygeom/numerics/mean_norm.py",
        "tests/unit/test_mean_norm.py",
    ]
    assert "\n@register\n" in files["raygeom/analyses/mean_norm.py"]


def test_the_recipe_runs_its_test_and_its_job_through_the_cli(tmp_path, hub_cache):
    files = recipe_files((ROOT / "CONTRIBUTING.md").read_text())
    package = tmp_path / "checkout"
    shutil.copytree(ROOT / "raygeom", package / "raygeom", ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    work.mkdir()
    for path, body in files.items():
        target = (work if path.endswith(".toml") else package) / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body)
    env = {**os.environ, "PYTHONPATH": str(package), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}

    test = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "tests/unit/test_mean_norm.py"],
        capture_output=True,
        text=True,
        env=env,
        cwd=package,
        timeout=300,
    )
    assert test.returncode == 0 and "3 passed" in test.stdout, test.stdout[-2000:] + test.stderr[-2000:]

    job = work / "mean-norm.toml"
    text = job.read_text()
    assert 'id = "smollm2"' in text
    job.write_text(text.replace('id = "smollm2"', 'id = "EleutherAI/pythia-14m"\nrevisions = ["step1000"]'))

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "raygeom.cli", *args], capture_output=True, text=True, env=env, cwd=work, timeout=600
        )

    refused = cli("mean_norm", "--job", "mean-norm.toml", "--level", "1.5")
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0, refused.stdout + refused.stderr
    assert "--level must be a number > 0 and < 1, got '1.5'" in refused.stderr
    assert not (work / "runs").exists()

    run = cli("run", "mean-norm.toml", "--num-cpus", "2")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Mean norm" in run.stdout
    rows = pq.read_table(work / "runs" / "mean-norm" / "results" / "mean_norm.parquet").to_pylist()
    assert sorted(r["layer"] for r in rows) == ["block_01", "block_02", "embed"]
    store = work / "runs" / "mean-norm"
    for row in rows:  # against the stored vectors, read with pyarrow alone
        [layer] = store.glob(f"activations/model=*/revision=step1000/extraction=*/layer={row['layer']}/part-0.parquet")
        vectors = np.array(pq.read_table(layer).column("vector").to_pylist(), dtype=np.float64)
        assert row["level"] == 0.9 and len(vectors) == 40
        assert row["mean_norm"] == pytest.approx(np.linalg.norm(vectors, axis=1).mean(), rel=1e-9)
        assert row["mean_norm_lo"] < row["mean_norm"] < row["mean_norm_hi"]
    assert (store / "results" / "twonn.parquet").is_file()
