"""`raygeom diagnose --job FILE` end to end on the offline tiny Pythia: the job names the model, its revision, the
corpus, the sample, the extraction and the store, and the run extracts and scores exactly that."""

import json

import numpy as np
import pyarrow.parquet as pq
from typer.testing import CliRunner


def test_diagnose_runs_a_job_file_end_to_end(hub_cache, ray_local, tmp_path):
    from raygeom.cli.root import app
    from raygeom.replica.request import ExtractionRequest
    from raygeom.replica.settings import ExtractionSettings
    from raygeom.sources.corpus import load_corpus
    from raygeom.sources.models import resolve_model
    from raygeom.store.tree import Store
    from raygeom.testing import varied_text

    topics = ["markets", "politics", "sport", "film", "tech"]
    corpus = tmp_path / "labelled.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": f"number {i} {varied_text(i)}", "label": topics[i % 5]}) for i in range(60)))
    out = tmp_path / "job-store"
    job = tmp_path / "job.toml"
    job.write_text(
        f"[job]\nout = '{out}'\n[[models]]\nid = 'EleutherAI/pythia-14m'\nrevisions = ['step1000']\n"
        f"[corpus]\nname = '{corpus}'\nn_samples = 40\nseed = 1\n[extract]\nseq_len = 32\nlayers = 'embed,1,final_norm'\n"
    )
    result = CliRunner().invoke(
        app, ["diagnose", "--job", str(job), "--k", "8", "--ccr-ranks", "0,1", "--n-null", "8", "--null-chunks", "2"]
    )
    assert result.exit_code == 0, result.output
    rows = pq.read_table(out / "results" / "diagnostics_layers.parquet").to_pylist()
    assert [r["layer"] for r in rows] == ["embed", "block_01", "final_norm"]
    assert {(r["model"], r["revision"], r["n"]) for r in rows} == {("EleutherAI--pythia-14m", "step1000", 40)}
    assert all(np.isfinite(r["z_ccr0"]) and np.isfinite(r["z_ccr1"]) and 0.0 <= r["probe_accuracy"] <= 1.0 for r in rows)
    # The job's sample (40 texts, seed 1) and extraction (seq_len 32) are what was extracted into the job's store.
    sample = load_corpus(str(corpus)).sample(40, 1)
    request = ExtractionRequest(
        resolve_model("EleutherAI/pythia-14m", "step1000"), sample, ExtractionSettings(seq_len=32), "embed,1,final_norm"
    )
    assert Store(out).is_complete("EleutherAI--pythia-14m", "step1000", request.key())
