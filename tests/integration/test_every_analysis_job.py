"""One job file with an [analyses.NAME] section for every registered analysis (built from the registry, so a new
analysis joins it), over two models x two revisions, through `raygeom run` from an empty working directory: one
store, a table per analysis holding every (model, revision), and one report with one section per analysis."""

import json
import os
import re
import subprocess
import sys
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


@pytest.fixture(scope="module")
def every(tmp_path_factory, hub_cache, ray_address):
    from raygeom.testing import write_tiny_pythia

    write_tiny_pythia(hub_cache, SECOND, list(REVISIONS), hidden_size=48, layers=2)
    workdir = tmp_path_factory.mktemp("empty-cwd")
    (workdir / "job.toml").write_text(job_text())
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), COLUMNS="200")
    result = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "run", "job.toml", "--address", ray_address],
        capture_output=True,
        text=True,
        env=env,
        cwd=workdir,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return workdir / "store"


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
