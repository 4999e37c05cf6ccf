"""`raygeom run` on a [train] job from an empty working directory: the CLI (not the Python function) trains, sweeps
the checkpoints the trainer wrote and writes the report, with the job's relative paths resolved against the job file's
folder, not the shell's.
Before issue 21 this exited 2 in seconds: `run directory not found: runs/trajectory/checkpoints`."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def tiny_trajectory_job(path: Path, corpus: Path) -> Path:
    """jobs/trajectory.toml with every size cut down: 2 steps (checkpoints step0, step1, step2), d = 32, one block."""
    text = (ROOT / "jobs" / "trajectory.toml").read_text()
    replacements = {
        "save_every = 50": "save_every = 2",
        "log_until = 64": "log_until = 1",
        'corpus = "bbc"': f'corpus = "{corpus}"',
        "steps = 400": "steps = 2",
        "batch_size = 8\nseq_len = 128": "batch_size = 4\nseq_len = 128",
        "seq_len = 128": "seq_len = 16",
        "warmup = 50": "warmup = 1",
        "hidden_size = 128": "hidden_size = 32",
        "n_layers = 4": "n_layers = 1",
        "vocab_size = 4096": "vocab_size = 300",
        "eval_every = 100": "eval_every = 2",
        "eval_sequences = 128": "eval_sequences = 4",
        "cpus_per_worker = 2": "cpus_per_worker = 1",
        "analysis_threads = 2": "analysis_threads = 1",
        "n_samples = 200": "n_samples = 16",
        "batch_size = 32": "batch_size = 16",
        "k = 32 ": "k = 8 ",
        "n_null = 100": "n_null = 6",
        "null_chunks = 4": "null_chunks = 1",
        "chunk_len = 128\nbatch_size = 8": "chunk_len = 16\nbatch_size = 3",
        "chunks_per_domain = 40": "chunks_per_domain = 3",
        "late_from = 250": "late_from = 1\nbootstrap = 100",
        'pool = "last"': 'pool = "mean"',
        "r = [0, 1, 5, 10]": "r = [0, 1]",
    }
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)
    return path


def test_a_train_job_runs_from_an_empty_directory_through_the_cli(hub_cache, ray_address, tmp_path):
    from raygeom.testing import write_labelled_corpus

    corpus = write_labelled_corpus(tmp_path / "texts.jsonl", 100)
    work = tmp_path / "work"  # the checkout: its jobs/ folder, and runs/ and docs/ beside it
    (work / "jobs").mkdir(parents=True)
    job = tiny_trajectory_job(work / "jobs" / "trajectory.toml", corpus)
    elsewhere = tmp_path / "elsewhere"  # the shell's directory: the job's relative paths are not resolved here
    elsewhere.mkdir()
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), COLUMNS="200")
    plan = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "plan", str(job)],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
    )
    assert plan.returncode == 0 and "then: 3 checkpoints x 3 layers x 7 planned analyses -> 63 units" in plan.stdout, (
        plan.stdout + plan.stderr
    )
    assert not any(elsewhere.iterdir()) and [p.name for p in work.iterdir()] == ["jobs"]  # plan writes nothing
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "run", str(job), "--address", ray_address],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    print(f"raygeom run (train, sweep, report) from an empty directory: {seconds:.1f} s")
    run_dir = work / "runs" / "trajectory" / "checkpoints"
    assert sorted(p.name for p in run_dir.glob("step*")) == ["step0", "step1", "step2"]
    table = pq.read_table(work / "runs" / "trajectory" / "results" / "pga.parquet").to_pylist()
    assert sorted({r["revision"] for r in table}) == ["step0", "step1", "step2"]
    # every PGA row of the store, as a run's table: the sweep's [pga] (CCR-1) and [analyses.pga]'s CCR-0 (its CCR-1 is
    # the sweep's units), 3 checkpoints x 3 layers each
    assert len({(r["revision"], r["layer"], r["r"]) for r in table}) == len(table) == 18
    assert len([r for r in table if r["r"] == 1]) == 9
    rows = pq.read_table(work / "runs" / "trajectory" / "results" / "trajectory_checkpoints.parquet").to_pylist()
    assert [r["step"] for r in rows] == [0, 1, 2]
    written = work / "docs" / "results" / "trajectory.md"  # the job exports its rows; the repository's script writes it
    assert not written.exists() and "python -m tools.results_pages" in result.stdout
    from tools import results_pages

    assert results_pages.main([str(written)]) == 0
    page = written.read_text()
    for heading in (
        "## The PGA paper's mechanism over training",
        "### Spectral blindness",
        "### PC1's share of the readout",
        "### Restoration by CCR rank over steps",
        "### Probe accuracy against z",
    ):
        assert heading in page, heading
    assert "| embed |" in page and "CCR-1" in page
    assert not any(elsewhere.iterdir())
