"""The whole pipeline on tiny offline Pythia models, on the session's local Ray."""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from raygeom.engine import orchestrate
from raygeom.jobs.run import run
from raygeom.jobspec import JobSpec, ModelEntry
from raygeom.params import PGAParams
from raygeom.replica.extract import ExtractionSettings
from raygeom.replica.request import ExtractionRequest
from raygeom.sources.corpus import load_corpus
from raygeom.sources.models import resolve_model
from raygeom.store.tree import COMPLETE_MARKER, Store


def run_pga(store, model, revision, layers, params):
    """PGA of every layer of one extraction through the unit engine (finished layers are read back)."""
    from raygeom.analyses import pga
    from raygeom.engine.units import run_units

    return run_units(store, pga.units(store, model, revision, layers, params))


# Its runs reload the same tiny models: they share loaded replicas (tests/conftest.py warm_replicas).
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("warm_replicas")]
ROOT = Path(__file__).resolve().parents[2]


def tiny_job(out, corpus, **pga):
    return JobSpec(
        name="tiny",
        out=str(out),
        models=(ModelEntry("EleutherAI/pythia-14m", ("step0", "step1000")),),
        corpus=str(corpus),
        n_samples=40,
        extraction=ExtractionSettings(seq_len=32, batch_size=8),
        pga=PGAParams(k=8, n_null=12, null_chunks=3, **pga),
    )


@pytest.fixture(scope="module")
def finished_job(hub_cache, ray_local, warm_replicas, tmp_path_factory):
    from raygeom.testing import varied_text

    root = tmp_path_factory.mktemp("job")
    corpus = root / "corpus.txt"
    # Distinct within 32 tokens and in the last token (the old lines shared their first 32 tokens: 5 distinct rows).
    corpus.write_text("\n".join(f"number {i} {varied_text(i)}" for i in range(80)))
    outputs = run(tiny_job(root / "out", corpus), Console(quiet=True))
    return root, corpus, outputs


def test_results_cover_every_layer_of_every_revision(finished_job):
    _, _, outputs = finished_job
    assert len(outputs.rows["pga"]) == 2 * 5
    assert {(r["revision"], r["layer"]) for r in outputs.rows["pga"]} == {
        (rev, layer) for rev in ("step0", "step1000") for layer in ("embed", "block_00", "block_01", "block_02", "final_norm")
    }
    assert all(np.isfinite(r["z"]) and r["null_std"] > 0 for r in outputs.rows["pga"])
    assert outputs.files["pga"][1].stat().st_size > 10_000
    assert pq.read_table(outputs.files["pga"][0]).num_rows == 10


def test_activation_store_reads_in_pandas_polars_duckdb_and_ray_data(finished_job):
    import duckdb
    import pandas as pd
    import polars as pl
    import pyarrow.dataset as ds
    import ray

    root = finished_job[0] / "out" / "activations"
    layer_dir = Store(root.parent).layer_path("EleutherAI--pythia-14m", "step1000", "block_01").parent
    frame = pd.read_parquet(layer_dir)
    assert len(frame) == 40 and len(frame["vector"].iloc[0]) == 64
    assert pl.read_parquet(layer_dir / "part-0.parquet")["vector"].dtype == pl.Array(pl.Float32, 64)
    count = duckdb.sql(
        f"select count(*) from read_parquet('{root}/**/*.parquet', hive_partitioning=true) "
        "where revision = 'step0' and layer = 'final_norm'"
    ).fetchall()[0][0]
    assert count == 40
    dataset = ds.dataset(root, format="parquet", partitioning="hive")
    assert dataset.to_table(filter=ds.field("layer") == "embed").num_rows == 80
    rows = ray.data.read_parquet(str(layer_dir)).take_all()
    assert len(rows) == 40


def test_stored_layer_matches_a_direct_forward_pass(finished_job, hub_cache):
    from raygeom.replica.extract import extract_batch
    from raygeom.sources.models import load_model

    root, corpus, _ = finished_job
    texts = load_corpus(str(corpus)).sample(40, 0).texts
    model, tokenizer = load_model(resolve_model("EleutherAI/pythia-14m", "step1000"))
    direct = extract_batch(model, tokenizer, texts[:8], ExtractionSettings(seq_len=32, batch_size=8))
    ids, stored = Store(root / "out").read_layer("EleutherAI--pythia-14m", "step1000", "block_02")
    np.testing.assert_array_equal(ids, np.arange(40))
    np.testing.assert_allclose(stored[:8], direct.pooled["block_02"], atol=1e-5)


def test_a_pga_run_skips_nll_and_a_later_request_adds_it_without_touching_layers(finished_job, hub_cache):
    from raygeom.replica.extract import extract_batch
    from raygeom.sources.models import load_model

    root, corpus, _ = finished_job
    store = Store(root / "out")
    slug = "EleutherAI--pythia-14m"
    samples = store.read_samples(slug, "step1000")
    assert samples.schema.field("nll").type == pa.float64() and np.isnan(samples["nll"].to_numpy()).all()
    before = store.completion(slug, "step1000")
    assert before["nll"] is False
    layer_file = store.layer_path(slug, "step1000", "block_01")
    layer_time = layer_file.stat().st_mtime_ns
    job = tiny_job(root / "out", corpus)
    texts = load_corpus(str(corpus)).sample(40, 0).texts
    request = ExtractionRequest(
        resolve_model("EleutherAI/pythia-14m", "step1000"),
        load_corpus(str(corpus)).sample(40, 0),
        job.extraction,
        job.layers,
        nll=True,
    )
    assert request.key() == before["key"]
    info = orchestrate.extract(store, request)
    assert info["nll"] is True and info["key"] == before["key"] and info["layers"] == before["layers"]
    assert layer_file.stat().st_mtime_ns == layer_time
    after = store.read_samples(slug, "step1000")
    assert after.schema == samples.schema
    model, tokenizer = load_model(resolve_model("EleutherAI/pythia-14m", "step1000"))
    direct = extract_batch(model, tokenizer, texts[:8], ExtractionSettings(seq_len=32, batch_size=8), nll=True)
    np.testing.assert_allclose(after["nll"].to_numpy()[:8], direct.nll, rtol=1e-5)
    assert np.isfinite(after["nll"].to_numpy()).all()
    assert orchestrate.extract(store, request)["nll"] is True  # complete now: nothing recomputed
    assert layer_file.stat().st_mtime_ns == layer_time


def test_null_chunking_through_ray_gives_identical_z(finished_job):
    root = finished_job[0] / "out"
    store = Store(root)
    layers = ["embed", "block_01", "final_norm"]
    results = []
    for chunks in (1, 7, 100):
        params = PGAParams(k=8, n_null=100, seed=5, null_chunks=chunks)
        for path in (root / "results" / "pga").glob("*.parquet"):
            path.unlink()
        results.append(run_pga(store, "EleutherAI--pythia-14m", "step0", layers, params))
    for other in results[1:]:
        assert [r["z"] for r in other] == [r["z"] for r in results[0]]
        assert [r["null_std"] for r in other] == [r["null_std"] for r in results[0]]


def test_rerun_resumes_without_recomputing(finished_job):
    root, corpus, _ = finished_job
    results = root / "out" / "results" / "pga"
    before = {p.name: p.stat().st_mtime_ns for p in results.glob("*.parquet")}
    marker = Store(root / "out").extraction_dir("EleutherAI--pythia-14m", "step0") / COMPLETE_MARKER
    marker_time = marker.stat().st_mtime_ns
    time.sleep(0.01)
    run(tiny_job(root / "out", corpus), Console(quiet=True))
    after = {p.name: p.stat().st_mtime_ns for p in results.glob("*.parquet")}
    assert marker.stat().st_mtime_ns == marker_time
    assert all(after[name] == t for name, t in before.items() if name in after)


def test_truncated_layer_file_is_detected_and_recomputed(finished_job):
    root, corpus, _ = finished_job
    store = Store(root / "out")
    job = tiny_job(root / "out", corpus)
    request = ExtractionRequest(
        resolve_model("EleutherAI/pythia-14m", "step0"), load_corpus(str(corpus)).sample(40, 0), job.extraction, job.layers
    )
    path = store.layer_path("EleutherAI--pythia-14m", "step0", "block_00")
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])
    killed_write = path.parent / f".{path.name}.k1ll3d.tmp"  # what a write killed before its rename leaves
    killed_write.write_bytes(good[:100])
    assert not store.is_complete("EleutherAI--pythia-14m", "step0", request.key())
    orchestrate.extract(store, request)
    assert store.is_complete("EleutherAI--pythia-14m", "step0", request.key())
    assert not killed_write.exists() and not list(path.parent.glob(".*.tmp"))
    _, vectors = store.read_layer("EleutherAI--pythia-14m", "step0", "block_00")
    assert vectors.shape == (40, 64)


def test_local_ray_traffic_stays_on_loopback(ray_local):
    import ray

    assert ray.util.get_node_ip_address() == "127.0.0.1"
    pids = {str(os.getpid())}
    sockets = subprocess.run(["ss", "-tnpH"], capture_output=True, text=True).stdout.splitlines()
    peers = [line.split()[4] for line in sockets if any(f"pid={p}," in line for p in pids)]
    assert peers, "the driver should hold connections to the local Ray"
    assert all(peer.startswith(("127.0.0.1:", "[::1]:", "[::ffff:127.0.0.1]:")) for peer in peers), peers


def test_a_local_ray_leaves_its_agent_port_to_the_os_and_runs_no_monitor_or_dashboard(ray_local):
    """Ray's fixed agent port (52365) is held by any other Ray on the machine (the other test worker's), and the agent
    then retries for 3.5 s before the node starts; raygeom's local Ray takes any free port, and its agent serves it.
    Its driver takes no worker output (log_to_driver=False), so the node runs no log monitor to forward it; nor an
    autoscaler monitor (nothing to scale), nor the usage-stats-only dashboard that include_dashboard=False leaves."""
    import psutil
    import ray

    port = ray.nodes()[0]["DashboardAgentListenPort"]
    assert port > 0 and port != 52365, port
    session = ray._private.worker.global_worker.node.get_session_dir_path()
    ours = [c for c in map(_cmdline, psutil.process_iter()) if any(session in part for part in c)]
    assert any("gcs_server" in " ".join(c) for c in ours), ours  # the node's processes are found by its session dir
    assert not [c for c in ours if "log_monitor.py" in " ".join(c)], ours
    assert not [c for c in ours if "autoscaler/_private/monitor.py" in " ".join(c)], ours
    assert not [c for c in ours if "dashboard/dashboard.py" in " ".join(c)], ours
    assert ray._private.worker.global_worker.node.webui_url is None
    assert any("raylet" in " ".join(c) for c in ours) and ray.cluster_resources().get("CPU") == 2  # the node itself serves


def _cmdline(process) -> list[str]:
    try:
        return process.cmdline()
    except Exception:  # gone, or not ours to read
        return []


def test_a_unit_task_runs_on_one_thread_in_a_worker_without_a_runtime_env(ray_local):
    """A unit task asks for one CPU: torch and every BLAS/OpenMP pool of its worker run one thread, even in a worker
    that Ray started for a task of two CPUs (OMP_NUM_THREADS=2), as one that ran a training task is, and whether torch
    was imported before the task or during it. Setting this up imports no torch: a task that never uses it (the nulls)
    leaves its worker without it. The job has no runtime environment, so Ray starts its workers directly, not through
    a second Python (setup_worker.py)."""
    import ray

    from raygeom.engine.units import _remote_call

    def run(options: dict, fn):
        """The engine's unit task: its value (the task returns the seconds it took beside it)."""
        value, seconds = _remote_call.options(**options).remote(fn)
        assert ray.get(seconds) >= 0.0
        return ray.get(value)

    def threads_in_this_task() -> tuple[int, list[int], dict, int]:  # defined here: pickled by value, not by module
        import os

        import torch
        from threadpoolctl import threadpool_info

        return (
            torch.get_num_threads(),
            sorted({pool["num_threads"] for pool in threadpool_info()}),
            dict(ray.get_runtime_context().runtime_env),
            os.getpid(),
        )

    def two_torch_threads() -> tuple[int, int]:  # what a training task leaves in its worker
        import os

        import torch

        torch.set_num_threads(2)
        return torch.get_num_threads(), os.getpid()

    def torch_imported() -> tuple[bool, int]:
        import os
        import sys

        return "torch" in sys.modules, os.getpid()

    def fresh_worker(name: str) -> dict:  # a runtime env of its own: a worker no earlier task has used
        return {"num_cpus": 2, "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "2", "RAYGEOM_TEST_WORKER": name}}}

    torch_threads, pool_threads, _, _ = run(fresh_worker("import-in-task"), threads_in_this_task)
    assert torch_threads == 1 and pool_threads == [1], (torch_threads, pool_threads)
    # One worker (the one idle worker of its runtime env, two CPUs of two) runs a unit task, a training task, then a
    # unit task. Ray may still replace an idle worker between tasks: then the sequence is tried again in a new one.
    for attempt in range(3):
        trained = fresh_worker(f"unit-train-unit-{attempt}")
        imported, worker = run(trained, torch_imported)
        assert imported is False
        raised, raised_in = ray.get(ray.remote(two_torch_threads).options(**trained).remote())
        torch_threads, pool_threads, _, checked_in = run(trained, threads_in_this_task)
        one_worker = raised_in == worker == checked_in
        if one_worker:
            break
    assert one_worker, "three tries never ran the three tasks in one worker"
    assert raised == 2 and torch_threads == 1 and pool_threads == [1], (raised, torch_threads, pool_threads)
    assert run({}, threads_in_this_task)[2] == {}


def test_a_degenerate_layer_is_recorded_with_its_reason_and_the_job_finishes(hub_cache, ray_local, tmp_path):
    corpus = tmp_path / "same-ending.txt"
    corpus.write_text("\n".join(f"the market rose {i} times as investors bought shares" for i in range(30)))
    job = JobSpec(
        name="same-ending",
        out=str(tmp_path / "out"),
        models=(ModelEntry("EleutherAI/pythia-14m", ("step0",)),),
        corpus=str(corpus),
        n_samples=20,
        extraction=ExtractionSettings(seq_len=32, batch_size=10),
        pga=PGAParams(k=8, n_null=6, null_chunks=2),
    )
    rows = {r["layer"]: r for r in run(job, Console(quiet=True)).rows["pga"]}
    assert np.isnan(rows["embed"]["z"]) and "same vector" in rows["embed"]["note"]
    assert all(np.isfinite(rows[name]["z"]) and rows[name]["note"] == "" for name in rows if name != "embed")
    table = pq.read_table(tmp_path / "out" / "results" / "pga.parquet")
    assert table.num_rows == 5 and "note" in table.column_names


def run_cli(*args, cwd):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), COLUMNS="200")
    return subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, timeout=600
    )


def test_one_store_keeps_an_extraction_per_setting_and_gc_frees_what_no_unit_needs(hub_cache, ray_address, tiny_corpus, tmp_path):
    """`raygeom pga --pool last`, then `--pool mean`, then `--pool last` on the default store of an empty working
    directory: the third run makes no forward pass, both extractions stay readable (the README's duckdb glob tells
    them apart), then `raygeom gc` frees the layers of the one whose units are all stored, and a rerun of it still
    computes nothing."""
    import duckdb

    workdir = tmp_path / "empty"
    workdir.mkdir()
    slug = "EleutherAI--pythia-14m"
    args = [
        "pga",
        "--model",
        "EleutherAI/pythia-14m",
        "--revision",
        "step1000",
        "--corpus",
        tiny_corpus,
        "--n-samples",
        40,
        "--seq-len",
        16,
        "--batch-size",
        8,
        "--layers",
        "embed,block_00,block_01",
        "--k",
        8,
        "--n-null",
        12,
        "--null-chunks",
        2,
        "--address",
        ray_address,
    ]

    def pga(pool: str):
        result = run_cli(*args, "--pool", pool, cwd=workdir)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    assert "forward passes: 1 ran; per (model, revision) 1 (pooled: pga)" in pga("last")
    out = workdir / "runs" / "default"
    store = Store(out)
    (last,) = [e.marker for e in store.extractions()]
    written = {
        p: p.stat().st_mtime_ns
        for p in [
            *store.extraction_dir(slug, "step1000", last["key"]).rglob("*"),
            store.samples_path(slug, "step1000", last["key"]),
            *(out / "results" / "pga").glob("*.parquet"),
        ]
        if p.is_file()
    }
    assert "forward passes: 1 ran; per (model, revision) 1 (pooled: pga)" in pga("mean")
    third = pga("last")
    assert "forward passes: 0 ran, 1 read back from the store; per (model, revision) 1 (pooled: pga)" in third
    assert {p: p.stat().st_mtime_ns for p in written} == written  # no layer, marker, samples or unit written again

    markers = {e.marker["settings"]["pool"]: e.marker for e in store.extractions()}
    assert sorted(markers) == ["last", "mean"] and markers["last"]["key"] != markers["mean"]["key"]
    assert all(store.is_complete(slug, "step1000", m["key"]) for m in markers.values())
    vectors = {pool: store.read_layer(slug, "step1000", "block_01", key=m["key"])[1] for pool, m in markers.items()}
    assert vectors["last"].shape == vectors["mean"].shape == (40, 64) and not np.allclose(vectors["last"], vectors["mean"])
    counts = duckdb.sql(
        f"select extraction, layer, count(*) from read_parquet('{out}/activations/**/*.parquet', "
        "hive_partitioning=true) group by all order by all"
    ).fetchall()
    assert counts == sorted((m["key"], layer, 40) for m in markers.values() for layer in ("block_00", "block_01", "embed"))
    table = pq.read_table(out / "results" / "pga.parquet").to_pylist()
    assert sorted((r["pool"], r["layer"]) for r in table) == sorted(
        (pool, layer) for pool in ("last", "mean") for layer in ("embed", "block_00", "block_01")
    )  # both PGA tables
    from raygeom.report.html import extraction_section

    settings = extraction_section(out).tables[-1]  # the report's settings table: one row per extraction
    assert settings.count("<tr>") == 3 and all(m["key"] in settings for m in markers.values())

    # A unit of the mean-pooled extraction is lost: its layers are still needed, the last-pooled ones are not.
    lost = next(p for p in (out / "results" / "pga").glob("*.parquet") if pq.read_table(p)["pool"][0].as_py() == "mean")
    lost.unlink()
    listed = run_cli("gc", "runs/default", "--dry-run", cwd=workdir)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "would free 3 layer files" in listed.stdout and "1 of its 3 planned units not stored" in listed.stdout
    assert store.is_complete(slug, "step1000", markers["last"]["key"])  # a dry run deletes nothing
    size = sum(p.stat().st_size for p in written if p.parent.name.startswith("layer="))  # with their sidecars
    freed = run_cli("gc", "runs/default", cwd=workdir)
    assert freed.returncode == 0, freed.stdout + freed.stderr
    assert f"freed 3 layer files, {size:,} bytes, of 1 extraction; kept 1" in freed.stdout, freed.stdout
    assert store.is_freed(slug, "step1000", markers["last"]["key"])
    assert store.is_complete(slug, "step1000", markers["mean"]["key"])
    # the lost unit's row in results/pga.parquet has no unit file: damage, which a run of the mean pooling recomputes
    checked = run_cli("verify", "runs/default", cwd=workdir)
    damaged = [line for line in checked.stderr.splitlines() if line.strip()]
    assert checked.returncode == 1 and len(damaged) == 1 and f"{lost.name} is gone" in damaged[0], checked.stderr
    again = pga("last")  # every unit stored: the freed layers are not needed, so nothing is extracted
    assert "forward passes: 0 ran, 1 read back from the store" in again
    assert not list(store.extraction_dir(slug, "step1000", markers["last"]["key"]).glob("layer=*"))


def test_n_null_auto_adds_blocks_until_the_half_width_target_and_chunking_changes_nothing(finished_job):
    root = finished_job[0] / "out"
    store = Store(root)
    layers = ["block_01", "final_norm"]
    runs = []
    for chunks in (1, 3, 7):
        # z_rel_width=0: the absolute target alone (test_null_rule.py covers the relative one)
        params = PGAParams(
            k=8, n_null=100, n_null_auto=True, z_half_width=0.15, z_rel_width=0.0, n_null_cap=400, null_chunks=chunks, seed=1
        )
        for path in (root / "results" / "pga").glob("*.parquet"):
            path.unlink()
        runs.append(run_pga(store, "EleutherAI--pythia-14m", "step1000", layers, params))
    for row in runs[0]:
        assert row["n_null"] % 100 == 0 and 100 <= row["n_null"] <= 400
        assert row["z_half_width"] <= 0.15 or row["n_null"] == 400
        assert row["z_lo"] < row["z"] < row["z_hi"] and 0 < row["p_upper"] <= 1
        assert row["rho_texts_lo"] < row["rho_readout"] < row["rho_texts_hi"] and row["n_half_samples"] == 10
        assert row["margin_texts_lo"] < row["rho_readout"] - row["null_mean"] < row["margin_texts_hi"]
    assert max(row["n_null"] for row in runs[0]) > 100  # the target took more than the first block
    for other in runs[1:]:
        assert [(r["n_null"], r["z"], r["z_lo"], r["z_hi"]) for r in other] == [
            (r["n_null"], r["z"], r["z_lo"], r["z_hi"]) for r in runs[0]
        ]
