"""A width ladder through the CLI from an empty working directory (issues 18 and 40): `raygeom run` trains the
[train] grid (two runs that differ in width and depth; the skip leaves out the other two), runs every analysis at
every checkpoint of every run, the dispersion gap per checkpoint, and regenerates the [width] page and the report with
its width facet; a rerun trains nothing and computes no unit. `raygeom plan` of the same job before training is
tests/unit/test_plan_untrained.py's."""

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def tiny_width_job(path: Path, corpus: Path) -> Path:
    """jobs/width.toml cut down: (d, blocks) = (32, 1) and (48, 2) (head_dim 16; skip leaves out (32, 2) and (48, 1)),
    one seed, 2 steps (checkpoints step0, step2)."""
    text = (ROOT / "jobs" / "width.toml").read_text()
    replacements = {
        "hidden_size = [128, 256, 512]": "hidden_size = [32, 48]",
        "n_layers = [4, 8, 12]": "n_layers = [1, 2]",
        "skip = [{hidden_size = 512, n_layers = 8}, {hidden_size = 512, n_layers = 12}]": (
            "skip = [{hidden_size = 32, n_layers = 2}, {hidden_size = 48, n_layers = 1}]"
        ),
        "seed = [0, 1]": "seed = [0]",
        "save_every = 128": "save_every = 2",
        'corpus = "bbc"': f'corpus = "{corpus}"',
        "steps = 896": "steps = 2",
        "batch_size = 16\nseq_len = 32": "batch_size = 4\nseq_len = 32",
        "warmup = 24": "warmup = 1",
        "vocab_size = 1024": "vocab_size = 300",
        "eval_every = 32": "eval_every = 2",
        "eval_sequences = 64": "eval_sequences = 2",
        "analysis_threads = 2": "analysis_threads = 1",
        "n_samples = 160": "n_samples = 40",
        "n_null = 50": "n_null = 20",
        "r = [0, 1, 5, 10]": "r = [0, 1]",
        "chunk_len = 32": "chunk_len = 16",
        "chunks_per_domain = 16": "chunks_per_domain = 2",
        "late_from = 128": "late_from = 2",
        "bootstrap = 2000": "bootstrap = 100",
    }
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)
    return path


def html_count_of_report_writes(stdout: str) -> int:
    """How many times a run announced writing its report.html (once: a later stage must not rewrite it)."""
    return sum(1 for line in stdout.splitlines() if line.startswith("report:") and line.rstrip().endswith("report.html"))


def run_cli(*args, cwd):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), COLUMNS="200")
    return subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def results_pages(*args, cwd: Path):
    """The repository's page builder (tools/results_pages.py), as a shell anywhere runs it."""
    return subprocess.run(
        [sys.executable, "-m", "tools.results_pages", *map(str, args)],
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_width_ladder_trains_sweeps_and_writes_its_page_from_an_empty_directory(hub_cache, ray_address, tmp_path):
    from raygeom.testing import write_labelled_corpus

    corpus = write_labelled_corpus(tmp_path / "texts.jsonl", 200)
    work = tmp_path / "work"  # the checkout: its jobs/ folder, and runs/ and docs/ beside it
    (work / "jobs").mkdir(parents=True)
    job = tiny_width_job(work / "jobs" / "width.toml", corpus)
    elsewhere = tmp_path / "elsewhere"  # the shell's directory: the job's relative paths are not resolved here
    elsewhere.mkdir()
    first = run_cli("run", job, "--address", ray_address, cwd=elsewhere)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "Traceback" not in first.stdout + first.stderr
    store = work / "runs" / "width"  # out = "../runs/width", against the job file's folder
    assert sorted(p.name for p in (store / "checkpoints").iterdir()) == ["d32-l1-seed0", "d48-l2-seed0"]
    for run in ("d32-l1-seed0", "d48-l2-seed0"):
        assert sorted(p.name for p in (store / "checkpoints" / run).glob("step*")) == ["step0", "step2"]
    pga = pq.read_table(store / "results" / "width_pga.parquet").to_pylist()
    ladder = {(r["width"], r["depth"], r["k"]) for r in pga if r["k_per_d"] == 0.25}
    assert ladder == {(32, 1, 8), (48, 2, 12)}  # k/d fixed across widths, depth from each run
    assert all(r["z_lo"] <= r["z"] <= r["z_hi"] for r in pga if r["n_null"] >= 20)
    ranked = pq.read_table(store / "results" / "dispersion_select.parquet").to_pylist()
    for run in ("d32-l1-seed0", "d48-l2-seed0"):  # each run's checkpoints ranked among themselves
        assert sorted(r["rank"] for r in ranked if r["model"] == run) == [1, 2], run
    assert html_count_of_report_writes(first.stdout) == 1, [l for l in first.stdout.splitlines() if "report" in l]
    gap = pq.read_table(store / "results" / "width_gap.parquet").to_pylist()
    assert sorted({(r["width"], r["depth"], r["revision"]) for r in gap}) == [
        (32, 1, "step0"),
        (32, 1, "step2"),
        (48, 2, "step0"),
        (48, 2, "step2"),
    ]
    # the job exports the rows the page cites; the repository's script writes the page from them alone
    page = work / "docs" / "results" / "width.md"
    assert not page.exists() and f"python -m tools.results_pages {page}" in first.stdout
    written = results_pages(page, cwd=elsewhere)
    assert written.returncode == 0, written.stdout + written.stderr
    text = page.read_text()
    for heading in (
        "## Held-out perplexity over training",
        "### 1. A collapse zone",
        "### 2. Does CCR-5/10 restore z",
        "### 3. Does PC1 migrate",
        "### 4. Do spectral metrics stay flat",
        "### 6. Sample-level dispersion",
        "### 7. Does the dispersion gap G",
        "### 8. Does it hold across seeds?",
        "## What this ladder can and cannot show",
    ):
        assert heading in text, heading
    assert "| 48 | 2 | block_01 |" in text and "k = 8, 12" in text and "outside the paper's stated range" in text
    # the page carries its rows, and the same command checks it against them
    rows = work / "docs" / "results" / "width"
    assert {"pga.parquet", "evaluations.parquet", "gap.parquet", "meta.json"} <= {p.name for p in rows.iterdir()}
    rebuilt = results_pages("--check", page, cwd=elsewhere)
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    html = (store / "report.html").read_text()
    assert "Width ladder: Subspace PGA by width" in html

    units = {p: p.stat().st_mtime_ns for p in (store / "results").glob("*/*.parquet")}
    second = run_cli("run", job, "--address", ray_address, cwd=elsewhere)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert second.stdout.count("not retrained") == 2 and "0 to compute" in second.stdout, second.stdout[-3000:]
    assert {p: p.stat().st_mtime_ns for p in (store / "results").glob("*/*.parquet")} == units  # no unit computed again
    assert not any(elsewhere.iterdir())


def test_a_sigterm_while_a_grid_trains_ends_the_run_without_training_the_rest(hub_cache, tmp_path):
    """Issue 41 item 7 at the training stage: the runs of a [train] grid train in a thread pool, whose exit used to
    wait for every queued run, so a SIGTERM trained the whole grid before the run stopped."""
    import signal
    import time

    import psutil

    from raygeom.testing import write_labelled_corpus

    corpus = write_labelled_corpus(tmp_path / "texts.jsonl", 200)
    work = tmp_path / "work"
    (work / "jobs").mkdir(parents=True)
    job = tiny_width_job(work / "jobs" / "width.toml", corpus)
    text = job.read_text()
    for old, new in {"steps = 2\n": "steps = 20000\n", "save_every = 2": "save_every = 10000"}.items():
        text = text.replace(old, new)
    job.write_text(text)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), COLUMNS="200")
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), "run", str(job), "--num-cpus", "1"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 180
    while time.time() < deadline and process.poll() is None and not list((work / "runs").rglob("step0")):
        time.sleep(0.2)  # the first run has saved its initialisation: it is training
    time.sleep(2.0)
    assert process.poll() is None, process.communicate()
    children = psutil.Process(process.pid).children(recursive=True)
    os.killpg(process.pid, signal.SIGTERM)
    began = time.time()
    stdout, stderr = process.communicate(timeout=120)
    # a bound for the loaded CI machine (ray.shutdown's waits); the training itself would take many minutes
    assert time.time() - began < 30 and process.returncode == 143, (time.time() - began, process.returncode, stderr[-2000:])
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines == ["interrupted; finished units are kept, rerun to resume"], stderr[-2000:]
    assert not psutil.wait_procs(children, timeout=30)[1]
    assert not list((work / "runs").rglob("step10000")), "a run kept training after the SIGTERM"
