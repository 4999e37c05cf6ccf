"""Property: flip one random byte of one random file of a finished store, rerun, and the run either recomputes
to the identical numbers or stops with one line (RaygeomError). Never a changed number.

One tiny store is built once; each flip works on a fresh copy. RAYGEOM_FLIPS (default 50) sets the count;
the seed is fixed so a failure names a reproducible (file, offset, bit).

About 20 of the 50 flips damage an extraction, whose rerun extracts again. The runs share one loaded replica
(tests/conftest.py warm_replicas): its describe, run_batches and write_extraction run for every rerun as before, but
its process (torch and transformers imported, about 7 s) is started once instead of once a rerun.
"""

import math
import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from raygeom.errors import RaygeomError
from raygeom.jobs.run import run
from raygeom.jobspec import JobSpec, ModelEntry
from raygeom.params import PGAParams
from raygeom.replica.extract import ExtractionSettings

pytestmark = pytest.mark.integration
FLIPS = int(os.environ.get("RAYGEOM_FLIPS", "50"))
NUMBERS = ("rho_readout", "null_mean", "null_std", "z")


def job(out, corpus) -> JobSpec:
    # embed is degenerate here (every text ends in '.'): it is reported each run and never stored.
    return JobSpec(
        name="flips",
        out=str(out),
        models=(ModelEntry("EleutherAI/pythia-14m", ("step1000",)),),
        corpus=str(corpus),
        n_samples=16,
        layers="embed,0,final_norm",
        extraction=ExtractionSettings(seq_len=16, batch_size=16),
        pga=PGAParams(k=8, n_null=4, null_chunks=1),
    )


def numbers(rows) -> dict:
    def same(value):
        return "nan" if isinstance(value, float) and math.isnan(value) else value

    return {(r["model"], r["revision"], r["layer"]): tuple(same(r[name]) for name in NUMBERS) + (r["n"], r["k"]) for r in rows}


@pytest.fixture(scope="module")
def pristine(hub_cache, warm_replicas, tmp_path_factory):
    from raygeom.testing import varied_text

    root = tmp_path_factory.mktemp("flips")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(f"item {i} {varied_text(i)} ." for i in range(30)) + "\n")
    outputs = run(job(root / "store", corpus), Console(quiet=True))
    reference = numbers(outputs.rows["pga"])
    assert sum(1 for r in outputs.rows["pga"] if not r["note"]) >= 2, outputs.rows["pga"]  # real numbers to protect
    return root / "store", corpus, reference


def test_random_byte_flips_never_change_a_number(pristine, warm_replicas, tmp_path):
    store, corpus, reference = pristine
    files = sorted(p.relative_to(store) for p in store.rglob("*") if p.is_file() and p.stat().st_size > 0)
    rng = np.random.default_rng(20261130)
    outcomes = {"recomputed": 0, "refused": 0}
    work = tmp_path / "work"
    for flip in range(FLIPS):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(store, work)
        target = work / files[int(rng.integers(len(files)))]
        data = bytearray(target.read_bytes())
        offset, bit = int(rng.integers(len(data))), int(rng.integers(8))
        data[offset] ^= 1 << bit
        target.write_bytes(bytes(data))
        where = f"flip {flip}: {target.relative_to(work)} byte {offset} bit {bit}"
        try:
            outputs = run(job(work, corpus), Console(quiet=True))
        except RaygeomError as error:
            assert "\n" not in str(error), where
            outcomes["refused"] += 1
            continue
        assert numbers(outputs.rows["pga"]) == reference, where
        assert numbers(pq.read_table(outputs.files["pga"][0]).to_pylist()) == reference, where
        stored = [row for path in (work / "results" / "pga").glob("*.parquet") for row in pq.read_table(path).to_pylist()]
        assert all(numbers([row]).items() <= reference.items() for row in stored), where
        assert not any(isinstance(row["z"], float) and math.isnan(row["z"]) for row in stored), where
        outcomes["recomputed"] += 1
    assert sum(outcomes.values()) == FLIPS
    print(f"{FLIPS} flips: {outcomes}; replicas started: {warm_replicas.started}")


def test_a_unit_file_copied_over_another_units_name_is_recomputed(pristine, tmp_path, capfd):
    """`cp results/pga/<A>.parquet results/pga/<B>.parquet` with its sidecar: bytes and checksum agree, only the rows'
    unit_key says they are A's. The rerun recomputes B (one warning line) and the table has each layer once."""
    from raygeom.store.tree import checksum_path

    store, corpus, reference = pristine
    work = tmp_path / "work"
    shutil.copytree(store, work)
    units = {pq.read_table(p)["layer"][0].as_py(): p for p in (work / "results" / "pga").glob("*.parquet")}
    assert len(units) >= 2, units
    (_, a), (layer_b, b) = sorted(units.items())[:2]
    shutil.copyfile(a, b)
    shutil.copyfile(checksum_path(a), checksum_path(b))
    capfd.readouterr()
    outputs = run(job(work, corpus), Console(quiet=True))
    warnings = [line for line in capfd.readouterr().err.splitlines() if "copied or moved" in line]
    assert len(warnings) == 1 and layer_b in warnings[0] and "recomputing" in warnings[0], warnings
    assert numbers(outputs.rows["pga"]) == reference
    table = pq.read_table(outputs.files["pga"][0]).to_pylist()
    assert numbers(table) == reference
    assert sorted(r["layer"] for r in table) == sorted(r["layer"] for r in outputs.rows["pga"])  # each layer exactly once
    assert pq.read_table(b)["layer"].to_pylist() == [layer_b] and pq.read_table(b)["unit_key"][0].as_py() == b.stem


def _cli(*args, cwd):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(root), COLUMNS="250")
    return subprocess.run(
        [sys.executable, str(root / "cli.py"), *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


def _damage(work, what: str) -> str:
    """Damage the copy of the pristine store as the issue's cases do; returns the damaged file's path."""
    from raygeom.store.tree import Store

    store = Store(work)
    ((slug, revision),) = {(e.model, e.revision) for e in store.extractions()}
    if what == "a deleted layer file":
        target = store.layer_path(slug, revision, "final_norm")
        target.unlink()
    elif what == "a flipped byte in the samples":
        target = store.samples_path(slug, revision)
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x10
        target.write_bytes(bytes(data))
    else:  # a deleted unit file, its sidecar kept
        target = next(
            p
            for p in sorted((work / "results" / "pga").glob("*.parquet"))
            if pq.read_table(p)["layer"][0].as_py() == "final_norm"
        )
        target.unlink()
    return str(target.relative_to(work))


@pytest.fixture(scope="module")
def every_unit_stored(pristine, warm_replicas, tmp_path_factory):
    """A store whose every unit is stored (no degenerate embed, whose missing unit made every rerun check the
    extraction anyway): its rerun has nothing to compute unless something is damaged."""
    from dataclasses import replace

    _, corpus, reference = pristine
    root = tmp_path_factory.mktemp("scored") / "store"
    outputs = run(replace(job(root, corpus), layers=SCORED), Console(quiet=True))
    assert all(not row["note"] for row in outputs.rows["pga"]) and len(outputs.rows["pga"]) == 2, outputs.rows["pga"]
    return root, corpus, numbers(outputs.rows["pga"])


SCORED = "0,final_norm"


@pytest.mark.parametrize("what", ["a deleted layer file", "a flipped byte in the samples", "a deleted unit file"])
def test_a_rerun_repairs_everything_verify_reports(every_unit_stored, ray_address, tmp_path, what):
    """Issue 46 item 5: after a listed layer file of an extraction was deleted, a rerun exited 0 saying `1 read back
    from the store`, repaired nothing, and `verify` still reported the damage; `verify` passed a results table row
    whose unit file was deleted (its sidecar kept). Through the CLI: verify names the damage in one line, the rerun
    repairs it (the extraction made again, or the unit computed again) to the identical numbers, and verify passes."""
    store, corpus, reference = every_unit_stored
    work = tmp_path / "work"
    shutil.copytree(store, work)
    units = sorted(p.name for p in (work / "results" / "pga").glob("*.parquet"))
    damaged = _damage(work, what)
    found = _cli("verify", work, cwd=tmp_path)
    lines = [line for line in found.stderr.splitlines() if line.strip()]
    assert found.returncode == 1 and len(lines) == 1 and damaged in lines[0], (found.returncode, found.stderr)
    flags = ["--model", "EleutherAI/pythia-14m", "--revision", "step1000", "--corpus", corpus, "--n-samples", 16]
    flags += ["--layers", SCORED, "--seq-len", 16, "--batch-size", 16, "--k", 8, "--n-null", 4]
    rerun = _cli("pga", *flags, "--null-chunks", 1, "--out", work, "--address", ray_address, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    if what == "a deleted unit file":
        assert "forward passes: 0 ran, 1 read back from the store" in rerun.stdout, rerun.stdout
    else:
        assert "forward passes: 1 ran;" in rerun.stdout, rerun.stdout  # the damaged pass made again, counted
        assert "extracting it again" in rerun.stderr, rerun.stderr
    assert (work / damaged).is_file()
    assert sorted(p.name for p in (work / "results" / "pga").glob("*.parquet")) == units  # the same units, no others
    assert numbers(pq.read_table(work / "results" / "pga.parquet").to_pylist()) == reference
    again = _cli("verify", work, cwd=tmp_path)
    assert again.returncode == 0 and " 0 damaged" in again.stdout, again.stdout + again.stderr
