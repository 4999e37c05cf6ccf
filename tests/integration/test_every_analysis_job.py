"""One job file with an [analyses.NAME] section for every registered analysis (built from the registry, so a new
analysis joins it), over two models x two revisions, through `raygeom plan` and `raygeom run` from an empty working
directory: one store, a table per analysis holding every (model, revision), and one report with one section per
analysis. One road: the analyses share the fewest forward passes (plan lists them with what each serves and why;
run counts those that ran, and the store holds exactly that many extractions), and the run's log, written to a
pipe, has one progress: done <= total, a total per stage that never changes, one clock that never runs back, and a
line at least every 30 s of wall time."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from raygeom.analyses import registry

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SECOND = "raygeom-tests/second-neox"
REVISIONS = ("step0", "step143000")
CHUNKS = {"chunk_len": 64, "chunks_per_domain": 3, "n_boot": 100}
# Small settings where an analysis's defaults would take minutes on 2 cores; every other analysis runs at its defaults.
SMALL = {
    "pga": {"k": 8, "r": [0, 1], "n_null": 20, "null_chunks": 2, "text_halves": 0},
    "spectral": {"k": 8},
    "pc1": {"k": 8},
    "convergence": {"k": 8, "n_null": 20, "null_chunks": 2, "text_halves": 0},
    "diagnostics": {"k": 8, "ccr_ranks": "0,1", "n_null": 20, "null_chunks": 2},
    "token_dispersion": {**CHUNKS, "group_size": 3, "n_groups": 5, "n_slices": 3},
    "slices": {**CHUNKS, "group_size": 3, "n_groups": 5, "n_slices": 3},
    "gap": CHUNKS,
    # bootstrap_block 16: 3 evaluation chunks x 4 blocks, at least the 10 an interval needs
    "knn_lm": {"chunk_len": 64, "train_chunks": 6, "test_chunks": 6, "k": 8, "n_boot": 100, "bootstrap_block": 16},
}


def toml_value(value) -> str:
    return json.dumps(value)


def job_text() -> str:
    lines = [
        '[job]\nname = "every"\nout = "store"',
        f"[[models]]\nid = 'EleutherAI/pythia-14m'\nrevisions = {json.dumps(list(REVISIONS))}",
        f"[[models]]\nid = '{SECOND}'\nrevisions = {json.dumps(list(REVISIONS))}",
        '[corpus]\nname = "bbc"\nn_samples = 40',
        '[extract]\nseq_len = 32\nbatch_size = 8\nlayers = "all"',
    ]
    for name in sorted(registry.analyses()):
        settings = "".join(f"\n{key} = {toml_value(value)}" for key, value in SMALL.get(name, {}).items())
        lines.append(f"[analyses.{name}]{settings}")
    return "\n".join(lines) + "\n"


PROGRESS = re.compile(r"progress (\d+):(\d\d):(\d\d)  (.+): ([\d,]+)/([\d,]+)")


def stored_extractions(store: Path) -> dict[str, int]:
    """Counted from the store's own files, not through raygeom's pass planner."""
    return {
        "pooled": len(list((store / "activations").glob("model=*/revision=*/extraction=*/_COMPLETE.json"))),
        "chunks": len(list((store / "dispersion").glob("model=*/revision=*/summary-*.parquet"))),
        "knn": len(list((store / "knn").glob("model=*/revision=*/*/_COMPLETE.json"))),
    }


@pytest.fixture(scope="module")
def job(tmp_path_factory, hub_cache, ray_address):
    """(working directory, plan's output, the run's stdout lines each with the wall time it arrived at)."""
    from raygeom.testing import write_tiny_pythia

    write_tiny_pythia(hub_cache, SECOND, list(REVISIONS), hidden_size=48, layers=2)
    workdir = tmp_path_factory.mktemp("empty-cwd")
    (workdir / "job.toml").write_text(job_text())
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), COLUMNS="200")
    plan = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "plan", "job.toml"], capture_output=True, text=True, env=env, cwd=workdir
    )
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), "run", "job.toml", "--address", ray_address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=workdir,
    )
    lines = [(time.monotonic(), line.rstrip("\n")) for line in process.stdout]
    error = process.stderr.read()
    assert process.wait(timeout=900) == 0, "\n".join(line for _, line in lines)[-4000:] + error[-4000:]
    return workdir, plan, lines


@pytest.fixture(scope="module")
def every(job):
    return job[0] / "store"


def test_plan_lists_the_passes_each_serves_and_why(job):
    _, plan, _ = job
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "forward passes: 3 per (model, revision), 12 in all; 0 stored, 12 to run" in plan.stdout
    rows = {line.split()[0]: line for line in plan.stdout.splitlines() if re.match(r"  \w+ \(0 of 4 stored\): ", line)}
    assert list(rows) == ["pooled", "chunks", "knn"], plan.stdout
    assert "texts every model reads whole" in rows["pooled"], rows
    assert "convergence" in rows["pooled"] and "diagnostics" in rows["pooled"], rows  # no extraction of their own
    assert all(name in rows["chunks"] for name in ("gap", "slices", "token_dispersion")), rows
    assert "next-token targets" in rows["knn"], rows  # the third pass named with its reason


def test_the_passes_run_counts_are_what_the_store_holds(job):
    workdir, _, lines = job
    # one of each per (model, revision): convergence and diagnostics read the pooled pass, the chunk analyses share one
    assert stored_extractions(workdir / "store") == {"pooled": 4, "chunks": 4, "knn": 4}
    said = [line for _, line in lines if line.startswith("forward passes:")]
    assert len(said) == 1 and said[0].startswith("forward passes: 12 ran; per (model, revision) 3 (pooled: "), said


def test_the_piped_log_has_one_progress_with_fixed_totals_one_clock_and_no_long_silence(job):
    _, _, lines = job
    totals: dict[str, int] = {}
    last: dict[str, int] = {}
    clock = -1
    progress = [(found, line) for _, line in lines if line.startswith("progress ") for found in [PROGRESS.fullmatch(line)]]
    assert progress and all(found for found, _ in progress), [line for found, line in progress if not found]
    for found, line in progress:
        seconds = int(found[1]) * 3600 + int(found[2]) * 60 + int(found[3])
        assert seconds >= clock, line
        clock = seconds
        stage, done, total = found[4], int(found[5].replace(",", "")), int(found[6].replace(",", ""))
        assert done <= total, line
        assert totals.setdefault(stage, total) == total, (line, totals[stage])
        last[stage] = done
    assert all(last[stage] == totals[stage] for stage in totals), (last, totals)
    assert "pooled pass, 4 (model, revision) pairs of 2 models" in totals, totals
    assert sum(stage.startswith("chunks pass") for stage in totals) == 4, totals  # once per (model, revision)
    # From the first progress line to the pass count, no 30 s of wall time without a line (1.5 s of slack: the
    # heartbeat looks once a second).
    start = next(i for i, (_, line) in enumerate(lines) if line.startswith("progress "))
    end = next(i for i, (_, line) in enumerate(lines) if line.startswith("forward passes:"))
    gaps = [later - earlier for (earlier, _), (later, _) in zip(lines[start:end], lines[start + 1 : end + 1])]
    assert max(gaps) <= 31.5, max(gaps)


def test_every_registered_analysis_stores_rows_of_every_model_and_revision(every):
    for name, analysis in sorted(registry.analyses().items()):
        rows = pq.read_table(every / "results" / f"{analysis.results_dir}.parquet").to_pylist()
        assert rows, name
        if analysis.extraction == "aligned":  # a comparison of models: rows per pair of (model, revision)s
            pairs = {(r["model_a"], r["model_b"]) for r in rows}
            assert any(a != b for a, b in pairs), (name, pairs)
            continue
        seen = {(r["model"].replace("/", "--").split("--")[-1], r["revision"]) for r in rows}
        expected = {(m, rev) for m in ("pythia-14m", SECOND.split("/")[-1]) for rev in REVISIONS}
        assert expected <= seen, (name, expected - seen)


def test_one_report_holds_one_section_per_registered_analysis(every):
    text = (every / "report.html").read_text()
    anchors = re.findall(r"<section id='([^']+)'>", text)
    for name in registry.analyses():
        assert anchors.count(name) == 1, (name, anchors)


def test_the_report_has_no_rough_edges_and_lists_every_extraction_kind(every):
    from raygeom.analyses.results_table import asked
    from tests.report_checks import assert_no_rough_edges, extraction_kinds, title_of

    page, figures = assert_no_rough_edges(every)
    assert extraction_kinds(page) == {kind for kind, n in stored_extractions(every).items() if n}
    groups = [f for f in figures if "perplexity groups" in title_of(f)]
    assert len(groups) == 2  # a model's layers by depth on one scale (alike_series: no two share a colour)
    assert asked(every) == set(registry.analyses())


def test_the_piped_log_prints_its_tables_in_one_box_style_that_fits_120_columns(job):
    from raygeom.cli.consoles import TABLE_WIDTH

    lines = [line for _, line in job[2]]
    assert not [line for line in lines if line.startswith("|")]  # no Markdown table (select, knn, converge had them)
    drawn = [line for line in lines if line[:1] in "┏┃┡│└"]
    assert drawn and max(map(len, drawn)) <= TABLE_WIDTH, max(drawn, key=len)


def test_the_engine_times_every_unit_and_plan_prices_every_analysis_from_them(job):
    """Every unit's rows carry the CPU-seconds the engine measured where its steps ran, whatever the analysis; plan
    then scales each analysis's missing units from its own stored ones (issue 45: the cost model was PGA's alone)."""
    workdir, _, _ = job
    untimed = {}
    for name, analysis in sorted(registry.analyses().items()):
        rows = pq.read_table(workdir / "store" / "results" / f"{analysis.results_dir}.parquet").to_pylist()
        seconds = [row.get("cpu_seconds") for row in rows if not row.get("note")]
        if not seconds or not all(s is not None and s > 0 for s in seconds):
            untimed[name] = seconds[:3]
    assert not untimed, untimed
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), COLUMNS="200")
    again = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "plan", "job.toml"], capture_output=True, text=True, env=env, cwd=workdir
    )
    assert again.returncode == 0, again.stdout + again.stderr
    priced = set(re.findall(r"^  (\w+) \d\.\d{3}e[+-]\d+ CPU-s per .+ \(\d+ units?\)$", again.stdout, re.M))
    every = registry.analyses()  # analyses that store one unit's rows together (token_dispersion, slices): priced once
    assert priced <= set(every) and {every[n].results_dir for n in priced} == {a.results_dir for a in every.values()}
    assert re.search(r"analyses 0\.0 s of CPU time \(", again.stdout), again.stdout  # nothing missing, each named
    assert re.search(r"\d+ done, 0 to compute", again.stdout), again.stdout  # diagnostics too: a rerun computes nothing
