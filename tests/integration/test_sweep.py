"""Sweeps end to end on tiny offline Pythia models, on the session's local Ray: the tidy table, plots,
duplicate-weight flags, plan/status from the store, resume and corrupt-unit recovery."""

import dataclasses
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from rich.console import Console
from typer.testing import CliRunner

from raygeom.jobs import plan as sweep
from raygeom.jobspec import load_job

pytestmark = pytest.mark.integration

UNITS = 3 * 5 + 2 * 4  # pythia-14m: 3 revisions x 5 layers; pythia-31m: 2 revisions x 4 layers


def add_sweep_models(cache):
    from raygeom.testing import write_tiny_pythia

    # step1 shares step0's seed, so it serves the same weights (EleutherAI/pythia#83)
    write_tiny_pythia(cache, "EleutherAI/pythia-14m", {"step0": 0, "step1": 0, "step1000": 1})
    write_tiny_pythia(cache, "EleutherAI/pythia-31m", {"step0": 10, "step1000": 11}, hidden_size=32, layers=2)


def write_sweep_job(directory, out, corpus, **sweep_keys):
    from raygeom.testing import write_tiny_job

    sweep = 'sizes = ["14m", "31m"]\nrevisions = ["step0", "step1", "step1000"]\n' + "".join(
        f"{k} = {v}\n" for k, v in sweep_keys.items()
    )
    return write_tiny_job(
        directory / "sweep.toml",
        "tiny-sweep",
        out,
        corpus,
        sweep=sweep,
        models='[[models]]\nid = "EleutherAI/pythia-31m"\nrevisions = ["step0", "step1000"]\n',
    )


def write_corpus(path):
    from raygeom.testing import varied_text

    # Distinct within 32 tokens and in the last token (the old lines shared their first 32 tokens: 5 distinct rows).
    path.write_text("\n".join(f"number {i} {varied_text(i)}" for i in range(60)))
    return path


METRICS = ("rho_readout", "null_mean", "null_std", "z", "fingerprint", "unit_key", "relative_depth", "n", "d")
_FIRST_RUN: dict = {}


def tidy(path):
    return sorted(
        ({k: r[k] for k in ("model", "revision", "layer", *METRICS)} for r in pq.read_table(path).to_pylist()),
        key=lambda r: (r["model"], r["revision"], r["layer"]),
    )


def first_run(hub_cache, tmp_path_factory):
    """One uninterrupted sweep per session: these tests inspect it, the fault tests compare against it."""
    if not _FIRST_RUN:
        from raygeom.jobs.run import run

        add_sweep_models(hub_cache)
        root = tmp_path_factory.mktemp("sweep")
        job_file = write_sweep_job(root, root / "out", write_corpus(root / "corpus.txt"))
        outputs = run(load_job(job_file), Console(quiet=True))
        _FIRST_RUN.update(root=root, job_file=job_file, outputs=outputs, reference=tidy(outputs.files["pga"][0]))
    return _FIRST_RUN


@pytest.fixture(scope="module")
def swept(hub_cache, ray_local, tmp_path_factory):
    run = first_run(hub_cache, tmp_path_factory)
    return run["root"], run["job_file"], run["outputs"]


def invoke(*args):
    from raygeom.cli.root import app

    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return result


def test_sweep_fills_the_pga_table_once_per_unit(swept):
    _, _, outputs = swept
    assert len(outputs.over_revisions["pga"].rows) == UNITS and outputs.computed_units == UNITS
    assert outputs.files["pga"][0].name == "pga.parquet" and outputs.revisions.name == "revisions.parquet"
    table = pq.read_table(outputs.files["pga"][0]).to_pylist()
    assert len({(r["model"], r["revision"], r["layer"]) for r in table}) == UNITS == len(table)
    assert {r["step"] for r in table} == {0, 1, 1000}
    assert {r["size"] for r in pq.read_table(outputs.revisions).to_pylist()} == {"14m", "31m"}
    assert all(np.isfinite(r["z"]) for r in table)
    assert [r["layer"] for r in table if r["model"] == "EleutherAI--pythia-31m" and r["step"] == 0] == [
        "embed",
        "block_00",
        "block_01",
        "final_norm",
    ]


def test_duplicate_weights_are_flagged_and_distinct_ones_are_not(swept):
    _, _, outputs = swept
    table = pq.read_table(outputs.revisions).to_pylist()
    assert len(table) == 5  # one row per (model, revision)
    flags = {(r["repo"], r["revision"]): r["weights_flag"] for r in table}
    assert flags[("EleutherAI/pythia-14m", "step0")] == "same weights as step1"
    assert flags[("EleutherAI/pythia-14m", "step1")] == "same weights as step0"
    assert flags[("EleutherAI/pythia-14m", "step1000")] is None
    assert flags[("EleutherAI/pythia-31m", "step0")] is None
    assert [f[:2] for f in outputs.flagged] == [("EleutherAI/pythia-14m", "step0"), ("EleutherAI/pythia-14m", "step1")]
    notes = {r["known_bad_note"] for r in table if r["revision"] == "step1"}
    assert notes == {"EleutherAI/pythia#83: step0 and step1 serve the same weights"}


def test_plots_and_collapse_table(swept):
    root, _, outputs = swept
    names = sorted(p.name for p in outputs.over_revisions["pga"].plots)
    assert names == [
        "heatmap_EleutherAI--pythia-14m.png",
        "heatmap_EleutherAI--pythia-31m.png",
        "z_vs_depth_step0.png",
        "z_vs_depth_step1.png",
        "z_vs_depth_step1000.png",
    ]
    assert all(p.stat().st_size > 10_000 for p in outputs.over_revisions["pga"].plots)
    zones = pq.read_table(outputs.over_revisions["pga"].collapse).to_pylist()
    assert len(zones) == 5 and {"collapsed", "zone_layers", "early_max_z"} <= set(zones[0])


def test_status_and_plan_read_the_store(swept):
    _, job_file, _ = swept
    status = invoke("status", str(job_file))
    assert status.exit_code == 0, status.output
    assert f"units: {UNITS}/{UNITS} done (100.0%)" in status.output
    assert "weights flag EleutherAI/pythia-14m@step1: same weights as step0" in status.output
    assert "#83" in status.output
    plan = invoke("plan", str(job_file))
    assert plan.exit_code == 0, plan.output
    assert f"{UNITS} units; {UNITS} done, 0 to compute" in plan.output
    assert "measured: 5 extractions (cpu)" in plan.output and "estimate for what is missing" in plan.output


def test_plan_of_a_fresh_store_estimates_from_measured_units(swept, tmp_path):
    root, job_file, _ = swept
    fresh = invoke("plan", str(job_file), "--out", str(tmp_path / "fresh"))
    assert fresh.exit_code == 0 and f"0 done, {UNITS} to compute" in fresh.output
    assert "(config)" in fresh.output and "no measured units" in fresh.output
    plan = sweep.build_plan(load_job(job_file))
    cost = sweep.estimate(plan)
    assert cost.measured_extractions == 5 and cost.measured_units == UNITS
    pga = cost.analyses["pga"]
    assert cost.extract_rate > 0 and pga.rate > 0 and pga.remaining_seconds == 0 and pga.measured == UNITS


def test_rerun_recomputes_nothing(swept):
    from raygeom.jobs.run import run

    root, job_file, _ = swept
    files = sorted((root / "out" / "results" / "pga").glob("*.parquet")) + sorted(
        (root / "out" / "activations").rglob("_COMPLETE.json")
    )
    before = {p: p.stat().st_mtime_ns for p in files}
    console = Console(record=True, width=200)
    outputs = run(load_job(job_file), console)
    assert outputs.computed_units == 0 and len(outputs.over_revisions["pga"].rows) == UNITS
    assert {p: p.stat().st_mtime_ns for p in files} == before
    printed = console.export_text()
    assert "Subspace PGA over the sweep" in printed and "max z ± 95%" in printed  # a sweep prints its z table


def test_a_corrupt_unit_is_detected_and_only_it_is_recomputed(swept):
    from raygeom.jobs.run import run

    root, job_file, _ = swept
    job = load_job(job_file)
    plan = sweep.build_plan(job)
    revision = next(r for r in plan.revisions if r.spec.revision == "step1000" and r.spec.source.endswith("14m"))
    path = plan.store.result_path("pga", revision.analysis_units["pga"]["block_01"])
    good = pq.read_table(path).to_pylist()[0]
    path.write_bytes(path.read_bytes()[:40])
    assert sweep.build_plan(job).n_done == UNITS - 1
    outputs = run(job, Console(quiet=True))
    assert outputs.computed_units == 1
    again = pq.read_table(path).to_pylist()[0]
    assert again["z"] == good["z"] and again["null_std"] == good["null_std"]


def test_dropped_activations_do_not_force_recomputation(swept):
    from raygeom.jobs.run import run

    root, job_file, _ = swept
    job = load_job(job_file)
    plan = sweep.build_plan(job)
    plan.store.drop_activations("EleutherAI--pythia-31m", "step0")
    assert not list((root / "out" / "activations" / "model=EleutherAI--pythia-31m" / "revision=step0").rglob("layer=*"))
    assert sweep.build_plan(job).n_done == UNITS
    assert run(job, Console(quiet=True)).computed_units == 0


def test_a_revision_that_cannot_be_loaded_fails_alone_with_one_line(swept):
    root, job_file, _ = swept
    broken = root / "missing.toml"
    broken.write_text(
        job_file.read_text().replace(
            'revisions = ["step0", "step1", "step1000"]', 'revisions = ["step0", "step1", "step1000", "step2000"]'
        )
    )
    result = invoke("run", str(broken))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "1 of 6 revisions failed, the others are stored" in result.output
    assert "at revision 'step2000'" in result.output
    assert sweep.build_plan(load_job(broken)).n_done == UNITS


def test_sweep_replicas_and_the_laptop_replica_extract_the_same_activations(swept, tmp_path):
    from raygeom.engine import orchestrate
    from raygeom.replica.request import ExtractionRequest
    from raygeom.sources.corpus import load_corpus
    from raygeom.sources.models import resolve_model
    from raygeom.store.tree import Store

    root, job_file, _ = swept
    job = load_job(job_file)
    laptop = Store(tmp_path / "laptop")
    request = ExtractionRequest(
        resolve_model("EleutherAI/pythia-31m", "step1000"),
        load_corpus(job.corpus).sample(job.n_samples, job.sample_seed),
        job.extraction,
    )
    info = orchestrate.extract(laptop, request)
    swept_info = Store(root / "out").completion("EleutherAI--pythia-31m", "step1000")
    assert info["key"] == swept_info["key"] and info["fingerprint"] == swept_info["fingerprint"]
    # The lone laptop replica runs torch on every CPU, the sweep's on one each: float32 sums may differ in the last bits.
    for layer in info["layers"]:
        np.testing.assert_allclose(
            laptop.read_layer("EleutherAI--pythia-31m", "step1000", layer)[1],
            Store(root / "out").read_layer("EleutherAI--pythia-31m", "step1000", layer)[1],
            rtol=1e-5,
            atol=1e-6,
        )


def test_bad_sweep_jobs_fail_with_one_line(tmp_path):
    job_file = write_sweep_job(tmp_path, tmp_path / "out", tmp_path / "corpus.txt")
    job_file.write_text(job_file.read_text().replace('revisions = ["step0", "step1", "step1000"]', 'revisions = "every:0"'))
    for command in ("plan", "status", "run"):
        result = invoke(command, str(job_file))
        assert result.exit_code == 2, result.output
        assert "every:N must be a positive integer" in result.output and "Traceback" not in result.output
    job_file.write_text(job_file.read_text().replace('revisions = "every:0"', 'revisions = "log"\ngpus = 3'))
    result = invoke("plan", str(job_file))
    assert result.exit_code == 2 and "unknown key(s) in [sweep]: gpus" in result.output
    assert not (tmp_path / "out").exists()


def test_the_full_pythia_job_is_every_size_by_154_revisions(monkeypatch):
    from raygeom.sources import revisions as pythia

    job = load_job(os.path.join(os.path.dirname(__file__), "..", "..", "jobs", "pythia-sweep.toml"))
    assert [m.source for m in job.models] == [f"EleutherAI/pythia-{s}" for s in pythia.PYTHIA_SIZES]
    assert all(m.revisions == pythia.PYTHIA_REVISIONS for m in job.models)
    monkeypatch.setattr(sweep, "cached_config", lambda spec: None)  # layers from the sizes table, not the tiny cache
    plan = sweep.build_plan(job, fingerprint="not-run")
    assert len(plan.revisions) == 10 * 154
    assert plan.n_units == 154 * sum(s.n_blocks + 2 for s in pythia.PYTHIA_SIZES.values()) == 32_956
    gpu_seconds, cpu = sweep.reference_estimate(plan)
    # 2 x 24.6e9 parameters x 2000 x 128 tokens x 154 revisions at 124.8 TFLOPS, plus loading 2 bytes/parameter at 2 GB/s
    assert gpu_seconds / 3600 == pytest.approx((2 * 24.5876e9 * 256_000 / 124.8e12 + 24.5876e9 * 2 / 2e9) * 154 / 3600, rel=1e-3)
    from raygeom.analyses.pga_budget import REFERENCE_PGA_UNIT_SECONDS as rates

    per_revision = sum(
        (s.n_blocks + 2) * np.interp(s.d, sorted(rates), [rates[w] for w in sorted(rates)]) for s in pythia.PYTHIA_SIZES.values()
    )
    assert cpu == {"pga": pytest.approx(154 * per_revision, rel=1e-9)}
    assert job.sweep.gpu_memory_gib == 80 and job.n_samples == 2000


def test_deduped_variants_are_an_option(tmp_path):
    job_file = write_sweep_job(tmp_path, tmp_path / "out", write_corpus(tmp_path / "corpus.txt"), deduped="true")
    assert [m.source for m in load_job(job_file).models] == [
        "EleutherAI/pythia-31m",
        "EleutherAI/pythia-14m",
        "EleutherAI/pythia-14m-deduped",
        "EleutherAI/pythia-31m-deduped",
    ]
    job_file.write_text(job_file.read_text().replace("deduped = true", 'deduped = "only"'))
    assert [m.source for m in load_job(job_file).models] == [
        "EleutherAI/pythia-31m",
        "EleutherAI/pythia-14m-deduped",
        "EleutherAI/pythia-31m-deduped",
    ]


def test_plan_counts_the_layers_of_a_built_in_model_before_it_is_ever_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYGEOM_CACHE", str(tmp_path / "empty-cache"))  # no dequantised copy to read a config from
    job = load_job(os.path.join(os.path.dirname(__file__), "..", "..", "jobs", "laptop.toml"))
    plan = sweep.build_plan(dataclasses.replace(job, out=str(tmp_path / "out")), fingerprint="not-run")
    (revision,) = plan.revisions
    assert revision.layers == ["embed", *(f"block_{i:02d}" for i in range(30)), "final_norm"]  # SmolLM2-135M: 30 blocks
    assert plan.n_units == 32 and not revision.analysis_done["pga"]


def test_a_run_of_the_same_models_writes_the_tables_the_sweep_writes(swept, tmp_path):
    """A sweep is a run over revisions: the same results/<analysis>.parquet names, columns, types and model names (its
    extra tables: the collapse zones and the revisions' flags). The run reads the sweep's units back from a copy of
    its store, so the rows are the same rows."""
    import shutil

    from raygeom.jobs.run import run
    from raygeom.testing import TINY_JOB_SETTINGS

    root, _, outputs = swept
    copy = tmp_path / "run"
    shutil.copytree(root / "out", copy)
    for path in (copy / "results").glob("*.parquet*"):  # the sweep's tables (and their checksums), not its units
        path.unlink()
    models = "".join(
        f'[[models]]\nid = "EleutherAI/pythia-{size}"\nrevisions = {revisions}\n'
        for size, revisions in (("14m", '["step0", "step1", "step1000"]'), ("31m", '["step0", "step1000"]'))
    )
    job_file = tmp_path / "run.toml"
    job_file.write_text(
        f'[job]\nname = "tiny-run"\nout = "{copy}"\n{models}' + TINY_JOB_SETTINGS.format(corpus=root / "corpus.txt")
    )
    ran_job = run(load_job(job_file), Console(quiet=True))
    assert ran_job.files["pga"][0] == copy / "results" / "pga.parquet"
    swept_tables = sorted(p.name for p in (root / "out" / "results").glob("*.parquet"))
    assert sorted(p.name for p in (copy / "results").glob("*.parquet")) == ["pga.parquet"]
    assert swept_tables == ["collapse.parquet", "pga.parquet", "revisions.parquet"]
    ran, swept_schema = pq.read_schema(ran_job.files["pga"][0]), pq.read_schema(outputs.files["pga"][0])
    assert ran == swept_schema and ran.metadata == swept_schema.metadata
    # the columns the sweep's table used to leave out
    assert {"z_half_width", "note", "n_half_samples", "cpu_seconds", "source"} <= set(ran.names)
    assert "repo" not in ran.names and "weights_flag" not in ran.names  # the revisions table's, not a PGA row's
    rows, swept_rows = pq.read_table(ran_job.files["pga"][0]).to_pylist(), pq.read_table(outputs.files["pga"][0]).to_pylist()
    assert {r["model"] for r in rows} == {r["model"] for r in swept_rows} == {"EleutherAI--pythia-14m", "EleutherAI--pythia-31m"}
    assert [(r["unit_key"], r["z"], r["step"]) for r in rows] == [(r["unit_key"], r["z"], r["step"]) for r in swept_rows]
    assert {r["model"] for r in pq.read_table(outputs.revisions).to_pylist()} == {r["model"] for r in rows}


def test_the_librarys_table_is_the_clis_and_concatenates_with_it_in_pandas(swept, tmp_path):
    """Vectors of the sweep's store written with raygeom.write_activations and scored with raygeom.store_pga: the
    library's results/pga.parquet has the CLI's columns and types, `source` included, and pandas concatenates the
    two without an object column (a boolean with nulls included)."""
    import pandas as pd

    import raygeom
    from raygeom.store.tree import Store

    root, _, outputs = swept
    cli = Store(root / "out")
    info = cli.completion("EleutherAI--pythia-14m", "step1000")
    vectors = {layer: cli.read_layer("EleutherAI--pythia-14m", "step1000", layer)[1] for layer in info["layers"]}
    readout = np.random.default_rng(0).normal(size=(50, info["d"]))
    blocks = sum(1 for name in info["all_layers"] if name.startswith("block_"))
    library = tmp_path / "library"
    raygeom.write_activations(
        library, model="EleutherAI/pythia-14m", revision="step1000", vectors=vectors, readout=readout, n_blocks=blocks
    )
    raygeom.store_pga(library, "EleutherAI/pythia-14m", "step1000", k=8, n_null=12)
    mine = library / "results" / "pga.parquet"
    assert pq.read_schema(mine) == pq.read_schema(outputs.files["pga"][0])
    frame = pd.concat([pd.read_parquet(outputs.files["pga"][0]), pd.read_parquet(mine)], ignore_index=True)
    assert [c for c in frame.columns if frame[c].dtype == object] == []
    assert str(frame["skip_first"].dtype) == "boolean" and str(frame["step"].dtype) == "int64"
    assert frame["step"].tolist()[-len(vectors) :] == [1000] * len(vectors)
    sources = (
        pq.read_table(mine).column("source").to_pylist() + pq.read_table(outputs.files["pga"][0]).column("source").to_pylist()
    )
    assert sources == ["write_activations"] * len(vectors) + [None] * UNITS
