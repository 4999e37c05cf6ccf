"""One `raygeom run` of a job with [analyses.*] over several checkpoints, through the real CLI from an empty
working directory: each (checkpoint, extraction) is extracted once, every analysis writes its table, the report
keeps every series apart (every line trace has strictly increasing x and a setting tuple no other line has), and
a rerun computes nothing. token_dispersion, slices and gap share one chunk extraction per checkpoint."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.figures import decode as _decode
from tests.figures import figures_of

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
REVISIONS = ("step0", "step1000", "step143000")


def run_cli(*args, cwd):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), COLUMNS="200")
    return subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, timeout=600
    )


JOB = """[job]
name = "experiment"
out = "store"
[[models]]
id = "EleutherAI/pythia-14m"
revisions = {revisions}
[corpus]
name = "bbc"
n_samples = 40
[extract]
seq_len = 32
batch_size = 8
layers = "all"
[analyses.pga]
k = 8
r = [0, 1, 5]
n_null = 20
null_chunks = 2
text_halves = 0
[analyses.spectral]
k = 8
[analyses.pc1]
k = 8
[analyses.probe]
[analyses.twonn]
[analyses.sample_dispersion]
[analyses.token_dispersion]
{chunks}
[analyses.slices]
{chunks}
[analyses.gap]
chunk_len = 64
chunks_per_domain = 3
n_boot = 100
"""
CHUNKS = "chunk_len = 64\nchunks_per_domain = 3\ngroup_size = 3\nn_groups = 5\nn_slices = 3\nn_boot = 100"
CHUNK_TABLES = ("dispersion_layers", "dispersion_slices", "dispersion_groups", "dispersion_domains", "dispersion_gap")


@pytest.fixture(scope="module")
def experiment(tmp_path_factory, hub_cache, ray_address):
    workdir = tmp_path_factory.mktemp("empty-cwd")
    (workdir / "job.toml").write_text(JOB.format(revisions=json.dumps(list(REVISIONS)), chunks=CHUNKS))
    first = run_cli("run", "job.toml", "--address", ray_address, cwd=workdir)
    assert first.returncode == 0, first.stdout + first.stderr
    store = workdir / "store"
    written = {
        p: p.stat().st_mtime_ns
        for p in [
            *(store / "results").rglob("*.parquet"),
            *store.rglob("_COMPLETE.json"),
            *(store / "dispersion").rglob("*.parquet"),
        ]
        if p.parent.name != "results"
    }
    second = run_cli("run", "job.toml", "--address", ray_address, cwd=workdir)
    assert second.returncode == 0, second.stdout + second.stderr
    return store, first, second, written


def test_every_analysis_writes_its_table_once_per_unit(experiment):
    store, first, _, _ = experiment
    layers = 5  # embed, 3 blocks, final_norm
    expected = {
        "pga": 3 * 3 * layers,
        "spectral": 3 * layers,
        "pc1": 3 * layers,
        "probe": 3 * layers,
        "twonn": 3 * layers,
        "sample_dispersion": 3 * layers,
    }
    for name, count in expected.items():
        table = pq.read_table(store / "results" / f"{name}.parquet").to_pylist()
        assert len(table) == count, name
        assert len({row["unit_key"] for row in table}) == count, name
        assert {row["revision"] for row in table} == set(REVISIONS), name
    pga = pq.read_table(store / "results" / "pga.parquet").to_pylist()
    assert sorted({row["r"] for row in pga}) == [0, 1, 5]
    pc1 = pq.read_table(store / "results" / "pc1.parquet").to_pylist()
    assert all(row["pc1_readout_share_lo"] <= row["pc1_readout_share"] <= row["pc1_readout_share_hi"] for row in pc1)
    # One extraction per checkpoint, shared by every analysis.
    markers = list((store / "activations").glob("model=*/revision=*/extraction=*/_COMPLETE.json"))
    assert len(markers) == len(REVISIONS)
    assert "TwoNN intrinsic dimension" in first.stdout and "PC1 readout share" in first.stdout
    dispersion = pq.read_table(store / "results" / "sample_dispersion.parquet").to_pylist()
    assert dispersion and all(r["dispersion_lo"] <= r["dispersion"] <= r["dispersion_hi"] for r in dispersion)


def test_token_dispersion_slices_and_gap_share_one_chunk_extraction_per_checkpoint(experiment):
    store, first, _, _ = experiment
    summaries = list((store / "dispersion").glob("model=*/revision=*/summary-*.parquet"))
    assert len(summaries) == len(REVISIONS)  # token_dispersion, slices and gap: one chunk extraction each checkpoint
    layers = pq.read_table(store / "results" / "dispersion_layers.parquet").to_pylist()
    assert len(layers) == len(REVISIONS) * 6 and {r["revision"] for r in layers} == set(REVISIONS)  # 5 layers + attn_last
    for row in layers:
        assert row["token_dispersion_lo"] < row["token_dispersion"] < row["token_dispersion_hi"], row["layer"]
        assert row["sample_dispersion_lo"] < row["sample_dispersion"] < row["sample_dispersion_hi"], row["layer"]
        assert -1 <= row["domain_agreement_token_lo"] <= row["domain_agreement_token"] <= row["domain_agreement_token_hi"] <= 1
    gap = pq.read_table(store / "results" / "dispersion_gap.parquet").to_pylist()
    assert sorted(r["revision"] for r in gap) == sorted(REVISIONS)
    assert all(r["gap_lo"] <= r["gap"] <= r["gap_hi"] and r["layer"] == "final_norm" for r in gap)
    ranked = pq.read_table(store / "results" / "dispersion_select.parquet").to_pylist()
    assert [r["rank"] for r in ranked] == [1, 2, 3] and [r["gap"] for r in ranked] == sorted(
        (r["gap"] for r in gap), reverse=True
    )
    for title in ("Token-level dispersion", "Difficulty slices", "Dispersion gap G"):
        assert title in first.stdout, title


def test_a_rerun_computes_no_unit_and_extracts_nothing(experiment):
    store, _, _, written = experiment
    units = [p for p in written if p.suffix == ".parquet"]
    chunk_files = [p for p in units if p.parent.name.startswith("revision=")]  # the chunk extraction: 4 files each
    assert len(chunk_files) == 3 * 4
    chunk_units = [p for p in units if p.parent.name in CHUNK_TABLES]
    assert len(chunk_units) == 3 * len(CHUNK_TABLES)
    assert len(units) - len(chunk_files) - len(chunk_units) == 3 * 5 * (3 + 5)
    assert len(written) == len(units) + 3  # unit files and one marker per checkpoint
    assert {p: p.stat().st_mtime_ns for p in written} == written  # the rerun read every unit and extraction back


def test_the_report_never_joins_two_settings_in_one_line(experiment):
    store, _, _, _ = experiment
    html = (store / "report.html").read_text()
    figures = figures_of(html)
    assert len(figures) >= 8
    titles = [str(f["layout"].get("title", {}).get("text", "")) for f in figures]
    for wanted in (
        "RankMe over training",
        "PC1 readout share over training",
        "TwoNN dimension (MLE) over training",
        "probe accuracy over training",
        "token dispersion over training",
        "domain slices: Spearman(token dispersion, perplexity) over training",
    ):
        assert any(wanted in t for t in titles), (wanted, titles)
    checked = 0
    for figure, title in zip(figures, titles):
        lines = [
            t
            for t in figure["data"]
            if t.get("type", "scatter") == "scatter" and "lines" in str(t.get("mode", "")) and t.get("fill") != "toself"
        ]
        seen = set()
        for trace in lines:
            x = _decode(trace.get("x"))
            if x is None or x.dtype.kind not in "fiu":
                continue
            assert np.all(np.diff(x) > 0), (title, trace.get("name"))
            setting = (trace.get("name"), json.dumps(trace.get("meta"), sort_keys=True), trace.get("xaxis"), trace.get("yaxis"))
            assert setting not in seen, (title, setting)
            seen.add(setting)
            checked += 1
    assert checked > 20


def test_written_to_a_pipe_progress_is_plain_lines_that_end_at_their_totals(experiment):
    import re

    _, first, _, _ = experiment
    assert not re.search(r"━+ +[\d,]+/[\d,]+", first.stdout) and "\x1b[" not in first.stdout  # no bars, no terminal codes
    last: dict[str, tuple[int, int]] = {}
    clock = 0
    for line in first.stdout.splitlines():
        if line.startswith("progress "):
            found = re.fullmatch(r"progress (\d+):(\d\d):(\d\d)  (.+): ([\d,]+)/([\d,]+)", line)
            assert found, line  # a total is known whenever a stage is shown: no "0/?"
            seconds = int(found[1]) * 3600 + int(found[2]) * 60 + int(found[3])
            assert seconds >= clock, line  # one clock for the whole run: it never runs back
            clock = seconds
            stage, done, total = found[4], int(found[5].replace(",", "")), int(found[6].replace(",", ""))
            assert done <= total, line
            assert stage not in last or last[stage][1] == total, (line, last[stage])  # a stage keeps its total
            last[stage] = (done, total)
    assert "pooled pass, 3 revisions of EleutherAI/pythia-14m" in last and "token_dispersion units" in last, last
    assert sum(stage.startswith("chunks pass") for stage in last) == 3, last  # one chunk stage per revision, not per analysis
    for stage, (done, total) in last.items():  # every stage ends at its total: no "56/2"
        assert done == total, (stage, done, total)
    assert (
        "forward passes: 6 ran; per (model, revision) 2 (pooled: pga r=0, pga r=1, pga r=5, spectral, pc1, probe, twonn, "
        "sample_dispersion; chunks: token_dispersion, slices, gap)" in first.stdout
    )
