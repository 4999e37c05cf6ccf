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
