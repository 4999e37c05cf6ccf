"""Dispersion suite through Ray on tiny offline Pythia models: per-chunk tables, group protocol, slices, gap, select."""

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from raygeom.analyses import dispersion as dp
from raygeom.numerics.dispersion import dispersion, dispersion_gap
from raygeom.replica.tokens import domain_token_ids, make_chunks, token_features
from raygeom.report import dispersion_plots
from raygeom.sources.corpus import load_corpus
from raygeom.sources.models import load_model, resolve_model
from raygeom.store.tree import Store

# Its runs reload the same tiny models: they share loaded replicas (tests/conftest.py warm_replicas).
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("warm_replicas")]
SETTINGS = dp.DispersionSettings(chunk_len=32, chunks_per_domain=6, batch_size=4, layers="all", domain_tokens="digits", seed=3)
ANALYSIS = dp.AnalysisSettings(group_size=3, n_groups=5, n_slices=3, gap_layer="final_norm")


@pytest.fixture(scope="module")
def labelled_corpus(tmp_path_factory):
    from raygeom.testing import TINY_TEXT

    sentences = [s for s in TINY_TEXT.split(" . ") if s]
    path = tmp_path_factory.mktemp("corpus") / "topics.jsonl"
    with path.open("w") as handle:
        for i in range(45):
            text = f"{sentences[i % 5]} {i} {sentences[(2 * i + 1) % 6]} {3 * i} {sentences[(i + 2) % 5]}"
            handle.write(json.dumps({"text": text, "label": ["markets", "politics", "sport"][i % 3]}) + "\n")
    return load_corpus(str(path))


@pytest.fixture(scope="module")
def finished(hub_cache, ray_local, warm_replicas, labelled_corpus, tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("dispersion"))
    specs = [resolve_model("EleutherAI/pythia-14m", "step1000"), resolve_model("EleutherAI/pythia-14m", "step0")]
    result = dp.run_dispersion(store, specs, labelled_corpus, SETTINGS, ANALYSIS)
    return store, specs, result


def analyse_unit(unit: dict, analysis, seed: int) -> list[dict]:
    """The layers rows of one extraction in this process, one layer at a time, through the engine's pure steps."""
    chunks = unit["chunks"].to_pandas()
    rows = []
    for row in unit["layers"].to_pylist():
        part = chunks[chunks["layer"] == row["layer"]].sort_values("chunk_id")
        pooled, gap = unit["pooled"][row["layer"]], dp.gap_parts_of(unit["gap"], row["layer"])
        rows.append(dp.analyse_layer(row, part, pooled, gap, analysis, seed)[0])
    return rows


def test_tables_cover_every_layer_and_the_attention_sub_layer(finished):
    store, specs, result = finished
    layers = ["embed", "block_00", "block_01", "block_02", "final_norm", "attn_last"]
    assert [r["layer"] for r in result["layers"]] == layers * 2
    for row in result["layers"]:
        assert row["n_chunks"] == 18 and row["n_groups"] == 5
        assert 0 < row["token_dispersion"] < 2 and 0 < row["sample_dispersion"] < 2
        assert -1 <= row["group_spearman"] <= 1 and -1 <= row["domain_agreement_sample"] <= 1
        assert np.isfinite(row["gap"])
    assert {s["slicing"] for s in result["slices"]} == {"domain", "kmeans"}
    assert {d["domain"] for d in result["domains"]} == {"markets", "politics", "sport"}
    for name in ("layers", "slices", "groups", "domains"):
        assert pq.read_table(store.root / "results" / f"dispersion_{name}.parquet").num_rows == len(result[name])


def test_ray_results_equal_an_in_process_computation(finished, labelled_corpus):
    store, specs, result = finished
    spec = specs[0]
    unit = dp.read_unit_at(str(store.root), spec.slug, spec.revision, dp.unit_key(spec, labelled_corpus, SETTINGS))
    model, tokenizer = load_model(spec)
    chunks, domains = make_chunks(tokenizer, labelled_corpus.texts, labelled_corpus.labels, 32, 6, seed=3)
    features, next_tokens, logprob = token_features(model, torch.from_numpy(chunks), ["final_norm", "block_01"])
    table = unit["chunks"].to_pandas()
    final = table[table["layer"] == "final_norm"].sort_values("chunk_id")
    assert final["domain"].tolist() == domains
    np.testing.assert_allclose(final["nll"].to_numpy(), -logprob.reshape(18, 31).mean(1), atol=1e-5)
    per_chunk = features["final_norm"].reshape(18, 31, -1)
    last_position = (
        model(input_ids=torch.from_numpy(chunks), output_hidden_states=True).hidden_states[-1][:, -1:].detach().numpy()
    )
    full = np.concatenate([per_chunk, last_position], axis=1)
    expected = [dispersion(c) for c in full]
    np.testing.assert_allclose(final["token_dispersion"].to_numpy(), expected, atol=1e-6)
    np.testing.assert_allclose(unit["pooled"]["final_norm"], full[:, 1:].mean(1), atol=1e-5)
    row = next(
        r for r in result["layers"] if r["model"] == spec.name and r["revision"] == "step1000" and r["layer"] == "final_norm"
    )
    assert row["sample_dispersion"] == pytest.approx(dispersion(full[:, 1:].mean(1)), abs=1e-6)
    assert row["perplexity"] == pytest.approx(float(np.exp(-logprob.mean())), rel=1e-5)
    gap = dispersion_gap(features["final_norm"], next_tokens, domain_token_ids(tokenizer))
    assert row["gap"] == pytest.approx(gap.gap, abs=1e-9)


def test_rerun_reads_the_store_and_select_ranks_by_gap(finished, labelled_corpus):
    store, specs, result = finished
    again = dp.extract_unit(store, specs[0], labelled_corpus, SETTINGS)
    assert again["cached"]
    ranked = dp.rank_by_gap(store, specs, labelled_corpus, SETTINGS, "final_norm")
    assert [r["rank"] for r in ranked] == [1, 2]
    assert ranked[0]["gap"] >= ranked[1]["gap"]
    by_revision = {r["revision"]: r["gap"] for r in ranked}
    expected = {r["revision"]: r["gap"] for r in result["layers"] if r["layer"] == "final_norm"}
    assert by_revision == pytest.approx(expected)
    assert pq.read_table(store.root / "results" / "dispersion_select.parquet").num_rows == 2


def test_plots_are_written(finished, tmp_path):
    _, _, result = finished
    name = result["layers"][0]["model"]
    paths = [
        dispersion_plots.plot_groups(
            result["groups"], result["layers"], name, ["block_01", "final_norm", "attn_last"], tmp_path / "g.png"
        ),
        dispersion_plots.plot_layer_profile(result["layers"], tmp_path / "p.png"),
        dispersion_plots.plot_models(result["domains"], tmp_path / "m.png"),
    ]
    assert all(p.stat().st_size > 5_000 for p in paths)


def test_bad_input_fails_with_one_line_and_no_output(tmp_path, hub_cache):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "raygeom.cli", "dispersion", "--chunk-len", "1", "-o", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--chunk-len must be an integer >= 2" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_intervals_bits_per_byte_and_provenance_in_every_row(finished, labelled_corpus):
    store, specs, result = finished
    unit = dp.read_unit_at(str(store.root), specs[0].slug, specs[0].revision, dp.unit_key(specs[0], labelled_corpus, SETTINGS))
    chunks = unit["chunks"].to_pandas()
    final = chunks[chunks["layer"] == "final_norm"]
    _, tokenizer = load_model(specs[0])
    ids, _ = make_chunks(tokenizer, labelled_corpus.texts, labelled_corpus.labels, 32, 6, seed=3)
    by_hand = [len(tokenizer.decode(row[1:].tolist()).encode("utf-8")) for row in ids]
    assert final.sort_values("chunk_id")["n_bytes"].tolist() == by_hand
    bpb = float((final["nll"] * final["n_predicted"]).sum() / np.log(2) / final["n_bytes"].sum())
    for row in result["layers"]:
        for name in ("group_spearman", "group_pearson", "chunk_spearman", "chunk_pearson", "gap"):
            if name == "group_spearman" and row["n_groups"] < 10:  # too few groups for an honest interval: exact p instead
                assert np.isnan(row[f"{name}_lo"]) and np.isnan(row[f"{name}_hi"]), row["layer"]
                assert row[f"{name}_note"] and 0 < row[f"{name}_p_perm"] <= 1, row["layer"]
                continue
            assert row[f"{name}_lo"] <= row[name] + 1e-9 and row[name] - 1e-9 <= row[f"{name}_hi"], (row["layer"], name)
        assert row["gap_n_domain"] + row["gap_n_generic"] == 18 * 31
        assert row["gap_warning"]  # 18 tiny chunks hold far fewer than 200 digit positions
        for name in (
            "model",
            "revision",
            "step",
            "corpus",
            "corpus_fingerprint",
            "chunk_len",
            "group_size",
            "n_boot",
            "seed",
            "domain_tokens",
            "raygeom_version",
            "unit_key",
            "key",
        ):
            assert row[name] is not None, name
    first = [r for r in result["layers"] if r["revision"] == specs[0].revision]
    assert first[0]["bits_per_byte"] == pytest.approx(bpb, rel=1e-9)
    assert {r["step"] for r in result["layers"]} == {1000, 0}
    for table in ("slices", "groups", "domains"):
        assert all(r["unit_key"] and r["corpus_fingerprint"] and r["raygeom_version"] for r in result[table])


def _nan_as_none(rows: list[dict]) -> list[dict]:
    return [{k: None if isinstance(v, float) and v != v else v for k, v in row.items()} for row in rows]


def test_analysis_units_resume_and_tables_accumulate_every_job(finished, labelled_corpus):
    store, specs, result = finished
    again = dp.run_dispersion(store, specs[:1], labelled_corpus, SETTINGS, ANALYSIS)
    # read back, not recomputed (NaN, e.g. an interval over too few groups, compared as equal to itself)
    assert _nan_as_none(again["layers"]) == _nan_as_none([r for r in result["layers"] if r["revision"] == specs[0].revision])
    other = dp.AnalysisSettings(group_size=2, n_groups=5, n_slices=3, gap_layer="final_norm", n_boot=50)
    third = dp.run_dispersion(store, specs[:1], labelled_corpus, SETTINGS, other)
    combined = pq.read_table(store.root / "results" / "dispersion_layers.parquet").to_pylist()
    assert len(combined) == len(result["layers"]) + len(third["layers"])
    assert {r["group_size"] for r in combined} == {3, 2}
    # The same seed gives the same numbers in process (one layer at a time) as through the engine's units.
    unit = dp.read_unit_at(str(store.root), specs[0].slug, specs[0].revision, dp.unit_key(specs[0], labelled_corpus, SETTINGS))
    local = analyse_unit(unit, ANALYSIS, SETTINGS.seed)
    engine = [r for r in result["layers"] if r["revision"] == specs[0].revision]
    for mine, theirs in zip(local, engine):
        for name in ("group_spearman_lo", "chunk_pearson_hi", "domain_agreement_token_lo", "gap_se", "gap_hi"):
            assert mine[name] == pytest.approx(theirs[name], nan_ok=True)


def test_cli_dispersion_and_select_write_tables_plots_and_the_report(hub_cache, ray_address, labelled_corpus, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out, report, corpus = tmp_path / "store", tmp_path / "report", tmp_path / "topics.jsonl"
    pairs = zip(labelled_corpus.texts, labelled_corpus.labels)
    corpus.write_text("".join(json.dumps({"text": text, "label": label}) + "\n" for text, label in pairs))
    common = [
        "-m",
        "EleutherAI/pythia-14m",
        "-r",
        "step1000",
        "-c",
        str(corpus),
        "--chunk-len",
        "32",
        "--chunks-per-domain",
        "6",
        "--n-boot",
        "100",
        "--address",
        ray_address,
        "-o",
        str(out),
        "--report",
        str(report),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "raygeom.cli", "dispersion", *common, "--group-size", "3", "--n-groups", "5", "--n-slices", "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # the generated command of token_dispersion and slices: each one's declared table, one forward pass
    for title in ("Token-level dispersion", "Difficulty slices", "over groups [95 %]", "kmeans slices: Spearman(sample"):
        assert title in done.stdout, title
    for name in ("layers", "slices", "groups", "domains"):
        assert (out / "results" / f"dispersion_{name}.parquet").is_file()
        assert (report / f"{name}.csv").read_text().count("\n") > 1  # as docs/results/dispersion.md cites them
    assert (report / "layer_profile.png").is_file() and (report / "models_dispersion_vs_perplexity.png").is_file()
    done = subprocess.run(
        [sys.executable, "-m", "raygeom.cli", "select", *common], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warning:" in done.stdout and "domain positions" in done.stdout
    assert (out / "plots" / "select_gap.png").stat().st_size > 5_000
    assert (report / "select.csv").is_file() and (out / "results" / "dispersion_select.parquet").is_file()


def test_a_dispersion_job_and_a_pga_job_share_one_store_and_match_separate_runs(finished, labelled_corpus, tmp_path):
    """One store, both jobs (one replica class, one engine): each table equals the same job run alone, and a
    rerun of both reuses every extraction and unit."""
    from rich.console import Console

    from raygeom.jobs.run import run
    from raygeom.jobspec import JobSpec, ModelEntry
    from raygeom.params import PGAParams
    from raygeom.replica.extract import ExtractionSettings

    alone_store, specs, alone = finished
    corpus_file = tmp_path / "texts.txt"
    corpus_file.write_text("\n".join(labelled_corpus.texts) + "\n")

    def pga_job(out):
        return JobSpec(
            name="shared",
            out=str(out),
            models=(ModelEntry("EleutherAI/pythia-14m", ("step1000",)),),
            corpus=str(corpus_file),
            n_samples=30,
            layers="embed,1,final_norm",
            extraction=ExtractionSettings(seq_len=32, batch_size=8, pool="mean"),  # the last tokens: 6 values
            pga=PGAParams(k=8, n_null=20, null_chunks=2),
        )

    key = ("model", "revision", "layer", "rho_readout", "z", "z_lo", "z_hi")
    pga_alone = sorted(tuple(r[k] for k in key) for r in run(pga_job(tmp_path / "pga_alone"), Console(quiet=True)).rows["pga"])
    shared = Store(tmp_path / "shared")
    both_pga = run(pga_job(shared.root), Console(quiet=True)).rows["pga"]
    both = dp.run_dispersion(shared, specs, labelled_corpus, SETTINGS, ANALYSIS)
    assert sorted(tuple(r[k] for k in key) for r in both_pga) == pga_alone
    numbers = ("model", "revision", "layer", "token_dispersion", "sample_dispersion", "perplexity", "gap", "group_spearman")
    assert [tuple(r[k] for k in numbers) for r in both["layers"]] == [tuple(r[k] for k in numbers) for r in alone["layers"]]
    files = sorted(p for p in shared.root.rglob("*.parquet") if "results" in p.parts and p.parent.name != "results")
    before = {p: p.stat().st_mtime_ns for p in files}
    again_pga = run(pga_job(shared.root), Console(quiet=True)).rows["pga"]
    again = dp.run_dispersion(shared, specs, labelled_corpus, SETTINGS, ANALYSIS)
    assert sorted(tuple(r[k] for k in key) for r in again_pga) == pga_alone
    assert [tuple(r[k] for k in numbers) for r in again["layers"]] == [tuple(r[k] for k in numbers) for r in alone["layers"]]
    assert {p: p.stat().st_mtime_ns for p in files} == before  # every unit read back, none recomputed
