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
from raygeom.jobs.pipeline import run_job
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
    outputs = run_job(job(root / "store", corpus), Console(quiet=True))
    reference = numbers(outputs.rows)
    assert sum(1 for r in outputs.rows if not r["note"]) >= 2, outputs.rows  # real numbers to protect
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
            outputs = run_job(job(work, corpus), Console(quiet=True))
        except RaygeomError as error:
            assert "\n" not in str(error), where
            outcomes["refused"] += 1
            continue
        assert numbers(outputs.rows) == reference, where
        assert numbers(pq.read_table(outputs.table).to_pylist()) == reference, where
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
    outputs = run_job(job(work, corpus), Console(quiet=True))
    warnings = [line for line in capfd.readouterr().err.splitlines() if "copied or moved" in line]
    assert len(warnings) == 1 and layer_b in warnings[0] and "recomputing" in warnings[0], warnings
    assert numbers(outputs.rows) == reference
    table = pq.read_table(outputs.table).to_pylist()
    assert numbers(table) == reference
    assert sorted(r["layer"] for r in table) == sorted(r["layer"] for r in outputs.rows)  # each layer exactly once
    assert pq.read_table(b)["layer"].to_pylist() == [layer_b] and pq.read_table(b)["unit_key"][0].as_py() == b.stem
