"""kNN-LM through the unit engine and the knn/train commands' outputs, on tiny offline models."""

import json
import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from raygeom.analyses import knn
from raygeom.jobs import train as train_job
from raygeom.sources.corpus import load_corpus
from raygeom.sources.models import resolve_model
from raygeom.store.tree import Store, atomic_write_table
from tests.report_checks import box_table

pytestmark = pytest.mark.integration
PROVENANCE = (
    "model",
    "revision",
    "step",
    "corpus",
    "corpus_fingerprint",
    "chunk_len",
    "k",
    "settings",
    "seed",
    "raygeom_version",
)


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    from raygeom.testing import TINY_TEXT

    sentences = [s for s in TINY_TEXT.split(" . ") if s]
    rng = np.random.default_rng(5)
    path = tmp_path_factory.mktemp("knn-engine") / "text.txt"
    path.write_text("\n".join(" . ".join(sentences[j] for j in rng.permutation(len(sentences))) + f" {i}" for i in range(40)))
    return path


def invoke(*args):
    from raygeom.cli.root import app

    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    return result.output


def test_layers_are_engine_units_with_intervals_provenance_and_a_stable_table(hub_cache, ray_local, text, tmp_path):
    spec = resolve_model("EleutherAI/pythia-14m", "step1000")
    corpus = load_corpus(str(text))
    settings = knn.KnnSettings(
        chunk_len=48,
        train_chunks=6,
        test_chunks=4,
        k=8,
        lams="0.25,0.5,0.75",
        batch_size=4,
        seed=1,
        bootstrap_block=8,
        n_boot=500,
    )
    store = Store(tmp_path / "store")
    # The held-out chunks are in the datastore: every layer beats the base LM, and the interval says so.
    result = knn.run_knn(store, spec, corpus, settings, test_corpus=corpus)
    rows = result["layers"]
    assert len(list((store.root / "results" / "knn").glob("*.parquet"))) == len(rows) == 6
    assert len(list((store.root / "results" / "knn_tokens").glob("*.parquet"))) == 6
    for row in rows:
        assert row["delta"] == pytest.approx(row["knn_perplexity"] - row["base_perplexity"])
        assert row["delta_lo"] <= row["delta"] <= row["delta_hi"] < 0, row["layer"]
        assert row["bootstrap_units"] == 2 * math.ceil(47 / 8)  # 2 evaluation chunks of 47 predicted tokens, blocks of 8
        assert all(row.get(name) is not None for name in PROVENANCE), row
        assert row["step"] == 1000 and json.loads(row["settings"])["lams"] == "0.25,0.5,0.75"
    tokens = store.read_results("knn_tokens", [rows[0]["unit_key"]]).to_pydict()
    assert np.exp(-np.mean(tokens["mixed_logprob"])) == pytest.approx(rows[0]["knn_perplexity"], rel=1e-12)
    versus = result["best_vs_runner_up"]
    assert versus["best_layer"] == min(rows, key=lambda r: r["knn_perplexity"])["layer"] and versus["runner_up"] is not None
    assert versus["lo"] <= versus["difference"] <= versus["hi"] <= 0 or versus["separated"] is False
    # The stable table holds every stored unit: a second job (another k) adds its rows beside the first's.
    mtimes = {p: p.stat().st_mtime_ns for p in (store.root / "results" / "knn").glob("*.parquet")}
    again = knn.run_knn(store, spec, corpus, settings, test_corpus=corpus)
    assert [r["knn_perplexity"] for r in again["layers"]] == [r["knn_perplexity"] for r in rows]
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes  # read back, not recomputed
    other = knn.run_knn(store, spec, corpus, knn.KnnSettings(**{**settings.__dict__, "k": 4}), test_corpus=corpus)
    table = pq.read_table(other["table"]).to_pylist()
    assert other["table"] == store.root / "results" / "knn.parquet"
    assert sorted(r["k"] for r in table) == [4] * 6 + [8] * 6


def test_knn_command_prints_the_intervals_and_writes_its_report(hub_cache, ray_local, text, tmp_path):
    report = tmp_path / "docs"
    output = invoke(
        "knn",
        "-m",
        "EleutherAI/pythia-14m",
        "-r",
        "step1000",
        "-c",
        text,
        "--chunk-len",
        48,
        "--train-chunks",
        6,
        "--test-chunks",
        4,
        "--k",
        8,
        "--lam",
        "0.01,0.02",
        "--bootstrap-block",
        8,
        "--n-boot",
        200,
        "-o",
        tmp_path / "store",
        "--report",
        report,
    )
    assert "ppl difference [95% CI]" in output and "runner-up" in output and "target-among-neighbours" in output
    assert "lambda sits at the upper edge of its grid (0.01,0.02)" in " ".join(output.split())
    # the chosen lam is marked in its layer's row where it sits at an edge, beside the temperature scale chosen
    header, body = box_table(output)  # the box table every command prints, its wrapped cells joined
    assert len(body) == 6 and {"T scale", "lam"} <= set(header)
    assert all(cells[header.index("lam")] == "0.02 (upper edge)" for cells in body), body
    # 2 x ceil(47 / 8) = 12 blocks: intervals; the Spearman over 6 layers gives its permutation p instead of one
    assert "12 blocks)" in output and "no interval below" not in output
    assert "permutation p = " in output and "too few points for an interval" in output
    # each progress count stays within its total and ends on it: the chunks forwarded (6 + 4) have their own bar
    counts = re.findall(r"^progress \S+\s+(.+): (\d+)/(\d+)$", output, flags=re.M)
    assert counts and all(int(done) <= int(total) for _, done, total in counts), counts
    last = {label: (int(done), int(total)) for label, done, total in counts}
    model = "EleutherAI/pythia-14m@step1000"
    assert last[f"knn pass, {model}"] == (10, 10) and last[f"knn_lm units, {model}"] == (6, 6), last
    rows = list(csv_rows(report / "knn.csv"))
    assert len(rows) == 6 and {"layer", "knn_perplexity", "delta_lo", "delta_hi", "lam", "corpus_fingerprint"} <= set(rows[0])
    assert [p.stat().st_size > 5_000 for p in report.glob("knn_*.png")] == [True]
    assert (tmp_path / "store" / "results" / "knn.parquet").is_file()


def csv_rows(path):
    import csv

    with open(path, newline="") as handle:
        yield from csv.DictReader(handle)


def test_train_command_prints_the_paired_test_and_writes_its_report(ray_local, tmp_path, monkeypatch):
    # Training itself is tested in test_train.py; here run_training returns planted runs, so the command's
    # summary, tables and report are checked against scipy's paired t-test.
    from scipy.stats import ttest_rel

    history = tmp_path / "history.parquet"
    atomic_write_table(
        pa.Table.from_pylist(
            [{"step": s, "lm_loss": 5.0 - s / 10, "dispersion": 0.5, "heldout_perplexity": 100.0 - s} for s in (1, 2, 3)]
        ),
        history,
    )
    ppl = {(0.0, 0): 103.27, (0.0, 1): 102.61, (0.0, 2): 102.85, (0.1, 0): 101.77, (0.1, 1): 101.67, (0.1, 2): 101.10}

    def fake_run(store, settings, plan=None):
        row = {
            "key": f"k{settings.lam}-{settings.seed}",
            "unit_key": f"k{settings.lam}-{settings.seed}",
            "lam": settings.lam,
            "seed": settings.seed,
            "steps": settings.steps,
            "workers": 1,
            "push_layer": "final_norm",
            "over": "tokens",
            "final_train_loss": 4.6,
            "heldout_perplexity": ppl[(settings.lam, settings.seed)],
            "heldout_dispersion": 0.87,
            "n_train_sequences": 10,
            "n_heldout_sequences": 2,
            "wall_s": 1.0,
            "history": str(history),
            **train_job.provenance_columns(settings, "f" * 20),
        }
        store.write_result("train_runs", row["key"], row)
        return row

    monkeypatch.setattr(train_job, "run_training", fake_run)
    report = tmp_path / "docs"
    output = invoke(
        "train", "--lam", 0, "--lam", 0.1, "--seeds", "0,1,2", "--steps", 4, "-o", tmp_path / "store", "--report", report
    )
    t = ttest_rel([101.77, 101.67, 101.10], [103.27, 102.61, 102.85])
    assert f"{t.statistic:+.2f}" in output and f"{t.pvalue:.3g}" in output and "3/0" in output
    summary = list(csv_rows(report / "train_summary.csv"))
    assert [float(r["lam"]) for r in summary] == [0.0, 0.1]
    assert float(summary[1]["paired_t"]) == pytest.approx(t.statistic, rel=1e-4)
    assert float(summary[1]["paired_p"]) == pytest.approx(t.pvalue, rel=1e-4)
    runs = list(csv_rows(report / "train_runs.csv"))
    assert len(runs) == 6 and runs[0]["corpus_fingerprint"] == "f" * 20 and runs[0]["model"].startswith("gpt-neox")
    assert (report / "push_away_training.png").stat().st_size > 5_000
    stored = pq.read_table(tmp_path / "store" / "results" / "train_runs.parquet").to_pylist()
    assert len(stored) == 6 and all(r["settings"] and r["raygeom_version"] for r in stored)


@pytest.mark.parametrize(
    "args, message",
    [
        (["knn", "--bootstrap-block", "0"], "--bootstrap-block must be an integer >= 1"),
        (["knn", "--n-boot", "10"], "--n-boot must be an integer >= 100"),
        # known from the settings before any work: the defaults' datastore holds 40 x 511 keys, and whole chunks of
        # the default 8 held-out chunks leave 4 evaluation blocks
        (["knn", "--k", "65536"], "k 65536 is more than the 20440 keys the datastore holds"),
        (["knn", "--bootstrap-block", "512"], "into 4 block(s); a 95 % interval needs at least 10"),
        (["train", "--report", "{file}"], "report directory"),
    ],
)
def test_bad_interval_and_report_options_fail_with_one_line(tmp_path, args, message):
    import os
    import subprocess
    import sys

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    args = [a.replace("{file}", str(blocker / "sub")) for a in args]
    done = subprocess.run(
        [sys.executable, "-m", "raygeom.cli", *args, "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "setting, message",
    [
        ("bootstrap_block = 512", "job.toml: [analyses.knn_lm] bootstrap_block 512 cuts the evaluation half (4 of test_chunks 8"),
        ("k = 20441", "job.toml: [analyses.knn_lm] k 20441 is more than the 20440 keys the datastore holds (train_chunks 40"),
    ],
)
def test_a_job_file_whose_knn_settings_cannot_be_met_is_refused_in_its_own_words(tmp_path, setting, message):
    import os
    import subprocess
    import sys

    job = tmp_path / "job.toml"
    job.write_text(
        f'[job]\nname = "k"\nout = "{tmp_path / "out"}"\n[[models]]\nid = "smollm2"\n[corpus]\nname = "bbc"\n'
        f"[analyses.knn_lm]\n{setting}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "raygeom.cli", "run", "job.toml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
