"""`raygeom status` reads the store, not the models (issue 48 §5: it took 38-64 s on a loaded machine). Planning a
job that compares models cuts its texts where every tokenizer reads them whole, which loads every tokenizer (tens of
seconds for a built-in GGUF's): the cut is kept ($RAYGEOM_CACHE/aligned), so a later status loads none; and the
corpus, asked for once per analysis and check, is read once per process."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from raygeom.analyses import extraction
from raygeom.cli.root import app
from raygeom.sources import corpus as corpus_module
from raygeom.sources import models


@pytest.fixture
def job(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYGEOM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    texts = tmp_path / "texts.jsonl"
    words = "the market rose as investors bought shares in technology firms".split()
    texts.write_text(
        "".join(json.dumps({"text": " ".join(words[i % 7 :] * 4) + f" {i}", "label": f"t{i % 3}"}) + "\n" for i in range(40))
    )
    path = tmp_path / "job.toml"
    path.write_text(
        "[job]\nout = 'store'\n"
        "[[models]]\nid = 'EleutherAI/pythia-14m'\n[[models]]\nid = 'EleutherAI/pythia-31m'\n"
        f"[corpus]\nname = '{texts}'\nn_samples = 30\n[extract]\nseq_len = 8\n"
        "[analyses.pga]\nk = 8\n[analyses.convergence]\n[analyses.probe]\n"
    )
    return path


def test_status_reads_the_cut_back_and_the_corpus_once(job, monkeypatch):
    from raygeom.sources.tiny_pythia import tiny_tokenizer

    tokenizer, loads = tiny_tokenizer(), []
    monkeypatch.setattr(models, "load_tokenizer", lambda spec, *a, **k: loads.append(spec.source) or tokenizer)
    first = CliRunner().invoke(app, ["status", str(job)], env={"COLUMNS": "200"})
    assert first.exit_code == 0, first.output
    assert sorted(loads) == ["EleutherAI/pythia-14m", "EleutherAI/pythia-31m"]  # the first plan finds the cut
    assert len(list((job.parent / "cache" / "aligned").glob("*.json"))) == 1

    # A new process: nothing in memory. No tokenizer loads; the corpus file is read once.
    extraction._ALIGNED.clear()
    corpus_module._LOADED.clear()

    def no_tokenizer(spec, *args, **kwargs):
        raise AssertionError(f"status loaded the tokenizer of {spec.source}")

    reads = []
    original = corpus_module._from_file
    monkeypatch.setattr(models, "load_tokenizer", no_tokenizer)
    monkeypatch.setattr(corpus_module, "_from_file", lambda path: reads.append(path) or original(path))
    started = time.perf_counter()
    again = CliRunner().invoke(app, ["status", str(job)], env={"COLUMNS": "200"})
    took = time.perf_counter() - started
    assert again.exit_code == 0, again.output
    assert again.output == first.output
    assert len(reads) == 1
    assert took < 20, f"status took {took:.1f} s"  # generous: about 1 s here, alone


def test_a_changed_corpus_file_is_read_again(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("one\ntwo\nthree\n")
    assert corpus_module.load_corpus(str(path)).texts == ["one", "two", "three"]
    path.write_text("one\ntwo\nthree\nfour\n")
    assert corpus_module.load_corpus(str(path)).texts == ["one", "two", "three", "four"]
    loaded = corpus_module.load_corpus(str(path))
    loaded.texts.append("mine")  # each caller gets its own lists
    assert corpus_module.load_corpus(str(path)).texts == ["one", "two", "three", "four"]


HEAVY = ("pandas", "scipy", "torch", "transformers", "ray", "matplotlib")
STATUS_IN_A_FRESH_PROCESS = """
import json, sys
import pyarrow as pa
from raygeom.store.tree import Store, read_table
store = Store(sys.argv[2])
table = read_table(next((store.root / "results" / "pga").glob("*.parquet")))
assert table.column("z").to_pylist() == [1.0], table
sys.argv = ["raygeom", "status", sys.argv[1]]
from raygeom.cli.root import main
try:
    main()
except SystemExit as done:
    code = done.code
print(json.dumps([code, sorted(name for name in HEAVY if name in sys.modules)]))
"""


def test_status_and_a_store_read_import_nothing_heavy(tmp_path):
    """Issue 48: `raygeom status` under 2 s on a loaded machine. pq.read_table goes through pyarrow.dataset, which
    imports pandas (0.5 s of every status here); the store reads a file with ParquetFile instead, and status imports
    none of the heavy libraries."""
    import os
    import subprocess
    import sys

    texts = tmp_path / "texts.txt"
    texts.write_text("".join(f"text number {i} about markets\n" for i in range(30)))
    job = tmp_path / "job.toml"
    job.write_text(
        f"[job]\nout = 'store'\n[[models]]\nid = 'EleutherAI/pythia-14m'\n[corpus]\nname = '{texts}'\nn_samples = 20\n[pga]\nk = 8\n"
    )
    from raygeom.store.tree import Store

    Store(tmp_path / "read").write_result("pga", "k0", [{"model": "m", "z": 1.0}])  # (pa.Table.from_pylist imports pandas)
    script = f"HEAVY = {HEAVY!r}\n" + STATUS_IN_A_FRESH_PROCESS
    done = subprocess.run(
        [sys.executable, "-c", script, str(job), str(tmp_path / "read")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")},
    )
    code, heavy = json.loads(done.stdout.strip().splitlines()[-1])
    assert code == 0 and heavy == [], (code, heavy, done.stderr[-2000:])
