"""One road for every analysis: a job whose analyses read a pooled extraction, chunks, kNN-LM features and aligned
texts makes the fewest forward passes (plan lists them with what each serves; run counts those that ran, and the
store holds exactly that many extractions), and its log, written to a pipe, has one progress: done <= total, a total
per stage that never changes, one clock that never runs back, and a line at least every 30 s of wall time."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
REVISIONS = ("step0", "step143000")
CHUNKS = "chunk_len = 64\nchunks_per_domain = 3"
JOB = f"""[job]
name = "one-road"
out = "store"
[[models]]
id = "EleutherAI/pythia-14m"
revisions = ["step0", "step143000"]
[corpus]
name = "bbc"
n_samples = 30
[extract]
seq_len = 32
batch_size = 8
layers = "all"
[analyses.pga]
k = 4
n_null = 20
null_chunks = 2
text_halves = 0
[analyses.twonn]
[analyses.convergence]
k = 4
n_null = 20
null_chunks = 2
text_halves = 0
[analyses.token_dispersion]
{CHUNKS}
group_size = 3
n_groups = 5
n_slices = 3
n_boot = 100
[analyses.gap]
{CHUNKS}
n_boot = 100
[analyses.knn_lm]
chunk_len = 64
train_chunks = 4
test_chunks = 4
k = 4
n_boot = 100
"""
PASSES = "3 (pooled: pga, twonn, convergence; chunks: token_dispersion, gap; knn: knn_lm)"  # convergence reads the pooled pass
PROGRESS = re.compile(r"progress (\d+):(\d\d):(\d\d)  (.+): ([\d,]+)/([\d,]+)")


def env():
    return dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), COLUMNS="200")


def timed_run(workdir: Path, ray_address: str) -> list[tuple[float, str]]:
    """`raygeom run` written to a pipe: each stdout line with the wall time it arrived at."""
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), "run", "job.toml", "--address", ray_address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=workdir,
    )
    lines = [(time.monotonic(), line.rstrip("\n")) for line in process.stdout]
    error = process.stderr.read()
    assert process.wait(timeout=600) == 0, "\n".join(line for _, line in lines)[-4000:] + error[-4000:]
    return lines


def stored_extractions(store: Path) -> dict[str, int]:
    """Counted from the store's own files, not through raygeom's pass planner."""
    return {
        "pooled": len(list((store / "activations").glob("model=*/revision=*/extraction=*/_COMPLETE.json"))),
        "chunks": len(list((store / "dispersion").glob("model=*/revision=*/summary-*.parquet"))),
        "knn": len(list((store / "knn").glob("model=*/revision=*/*/_COMPLETE.json"))),
    }


@pytest.fixture(scope="module")
def road(tmp_path_factory, hub_cache, ray_address):
    workdir = tmp_path_factory.mktemp("empty-cwd")
    (workdir / "job.toml").write_text(JOB)
    plan = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "plan", "job.toml"], capture_output=True, text=True, env=env(), cwd=workdir
    )
    first = timed_run(workdir, ray_address)
    counts = stored_extractions(workdir / "store")
    again = timed_run(workdir, ray_address)
    return plan, first, counts, again


def test_plan_lists_the_passes_each_serves_and_why(road):
    plan, _, _, _ = road
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "Forward passes: 3 per (model, revision)" in plan.stdout
    rows = {line.split("│")[1].strip(): line for line in plan.stdout.splitlines() if line.count("│") >= 5}
    assert "texts aligned across models" in rows["pooled"] and "convergence" in rows["pooled"], rows
    assert "token_dispersion" in rows["chunks"] and "gap" in rows["chunks"], rows
    assert "next-token targets" in rows["knn"], rows  # the third pass named with its reason
    for row in ("pooled", "chunks", "knn"):
        assert re.search(r"│\s+0 │\s+2 │$", rows[row]), rows[row]  # none stored, 2 (model, revision) pairs to run


def test_the_passes_run_counts_are_what_the_store_holds(road):
    _, first, counts, again = road
    assert counts == {"pooled": 2, "chunks": 2, "knn": 2}  # one of each per (model, revision); convergence shares pooled
    said = [line for _, line in first if line.startswith("forward passes:")]
    assert said == [f"forward passes: 6 ran; per (model, revision) {PASSES}"]
    assert [line for _, line in again if line.startswith("forward passes:")] == [
        f"forward passes: 0 ran, 6 read back from the store; per (model, revision) {PASSES}"
    ]


def test_the_piped_log_has_one_progress_with_fixed_totals_one_clock_and_no_long_silence(road):
    _, first, _, _ = road
    totals: dict[str, int] = {}
    last: dict[str, int] = {}
    clock = -1
    progress = [(at, PROGRESS.fullmatch(line), line) for at, line in first if line.startswith("progress ")]
    assert progress and all(found for _, found, _ in progress), [line for _, found, line in progress if not found]
    for _, found, line in progress:
        seconds = int(found[1]) * 3600 + int(found[2]) * 60 + int(found[3])
        assert seconds >= clock, line
        clock = seconds
        stage, done, total = found[4], int(found[5].replace(",", "")), int(found[6].replace(",", ""))
        assert done <= total, line
        assert totals.setdefault(stage, total) == total, (line, totals[stage])
        last[stage] = done
    assert all(last[stage] == totals[stage] for stage in totals), (last, totals)
    assert "pooled pass, 2 revisions of EleutherAI/pythia-14m" in totals, totals
    # From the first progress line to the pass count, no 30 s of wall time without a line (1 s of slack: the
    # heartbeat looks once a second).
    start = next(i for i, (_, line) in enumerate(first) if line.startswith("progress "))
    end = next(i for i, (_, line) in enumerate(first) if line.startswith("forward passes:"))
    gaps = [later - earlier for (earlier, _), (later, _) in zip(first[start:end], first[start + 1 : end + 1])]
    assert max(gaps) <= 31.5, max(gaps)
