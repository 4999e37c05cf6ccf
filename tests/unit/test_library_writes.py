"""The library path writes what the CLI writes: vectors written from Python carry the step the caller gives (none is
invented), and store_pga / store_analysis leave the CLI's tables (results/<analysis>.parquet, every row the store
holds) and plots beside their unit files."""

import numpy as np
import pyarrow.parquet as pq
import pytest

import raygeom
from raygeom.errors import InputError


def write(root, revision="main", **kwargs):
    rng = np.random.default_rng(0)
    return raygeom.write_activations(
        root,
        model="smollm2-hook",
        revision=revision,
        n_blocks=2,
        vectors={"block_00": rng.normal(size=(16, 8)), "block_01": rng.normal(size=(16, 8))},
        readout=rng.normal(size=(30, 8)),
        labels=["a", "b"] * 8,
        **kwargs,
    )


def test_imported_vectors_carry_the_step_the_caller_gives_else_none(tmp_path):
    assert write(tmp_path / "main")["step"] is None  # not Pythia's 143000 for "main" of another model
    rows = raygeom.store_pga(tmp_path / "main", "smollm2-hook", "main", k=3, n_null=10, text_halves=0)
    assert [r["step"] for r in rows] == [None, None]
    assert write(tmp_path / "given", step=5000)["step"] == 5000
    again = raygeom.write_activations(
        tmp_path / "given", model="smollm2-hook", revision="main", layer="block_01", vectors=np.ones((16, 8)) + np.eye(16, 8)
    )
    assert again["step"] == 5000  # a later write of more layers keeps it
    spectral = raygeom.store_analysis(tmp_path / "given", "smollm2-hook", "main", "spectral", k=3)
    assert {r["step"] for r in spectral} == {5000}
    assert write(tmp_path / "spelled", revision="step300")["step"] == 300  # a revision that names its step
    for bad in ("10", -1, True, 2.5):
        with pytest.raises(InputError, match="step must be"):
            write(tmp_path / "bad", step=bad)


def test_store_pga_and_store_analysis_write_the_clis_tables_and_plots(tmp_path):
    write(tmp_path)
    first = raygeom.store_pga(tmp_path, "smollm2-hook", "main", k=3, r=1, n_null=10, text_halves=0)
    second = raygeom.store_pga(tmp_path, "smollm2-hook", "main", k=3, r=0, n_null=10, text_halves=0)
    table = pq.read_table(tmp_path / "results" / "pga.parquet").to_pylist()
    assert sorted((r["r"], r["layer"]) for r in table) == [(0, "block_00"), (0, "block_01"), (1, "block_00"), (1, "block_01")]
    assert {r["unit_key"] for r in table} == {r["unit_key"] for r in first + second}
    assert (tmp_path / "plots" / "pga_z_vs_depth.png").stat().st_size > 1000
    probes = raygeom.store_analysis(tmp_path, "smollm2-hook", "main", "probe")
    assert pq.read_table(tmp_path / "results" / "probe.parquet").num_rows == len(probes) == 2
    assert (tmp_path / "plots" / "probe_accuracy_vs_depth.png").is_file()
    # read back, not recomputed: the same rows, the same table
    back = raygeom.store_pga(tmp_path, "smollm2-hook", "main", k=3, r=0, n_null=10, text_halves=0)
    assert [(r["unit_key"], r["z"]) for r in back] == [(r["unit_key"], r["z"]) for r in second]
    assert pq.read_table(tmp_path / "results" / "pga.parquet").num_rows == 4


def test_the_librarys_table_has_the_clis_types_whatever_its_values(tmp_path):
    """Vectors written without a step or extraction settings: the columns stay the CLI's types (a null step is an int64
    column, not a column of nulls), `source` is a string column, and a boolean with nulls reads in pandas as `boolean`."""
    import pandas as pd
    import pyarrow as pa

    write(tmp_path)
    raygeom.store_pga(tmp_path, "smollm2-hook", "main", k=3, n_null=10, text_halves=0)
    schema = pq.read_schema(tmp_path / "results" / "pga.parquet")
    expected = {
        "model": pa.string(),
        "step": pa.int64(),
        "layer_index": pa.int64(),
        "d": pa.int64(),
        "n": pa.int64(),
        "seq_len": pa.int64(),
        "pool": pa.string(),
        "skip_first": pa.bool_(),
        "max_words": pa.int64(),
        "source": pa.string(),
        "k": pa.int64(),
        "k_per_d": pa.float64(),
        "r": pa.int64(),
        "n_null": pa.int64(),
        "seed": pa.int64(),
        "z": pa.float64(),
        "z_half_width": pa.float64(),
        "note": pa.string(),
        "cpu_seconds": pa.float64(),
    }
    assert {name: schema.field(name).type for name in expected} == expected
    frame = pd.read_parquet(tmp_path / "results" / "pga.parquet")
    assert str(frame["skip_first"].dtype) == "boolean" and frame["skip_first"].isna().all()
    assert not [c for c in frame.columns if frame[c].dtype == object]


def _tree(root):
    return sorted(str(path.relative_to(root)) for path in root.rglob("*")) if root.exists() else None


@pytest.mark.parametrize("field", ["texts", "labels"])
def test_a_lone_surrogate_is_refused_before_anything_is_written(tmp_path, field):
    """Issue 46 item 4: a lone surrogate (JSON's \\ud800) in texts wrote the layers and the readout, then raised a raw
    UnicodeEncodeError, leaving activations/, readout/ and .lock behind."""
    values = [f"text {i}" for i in range(16)] if field == "texts" else ["a", "b"] * 8
    values[5] = "broken \ud800"
    with pytest.raises(InputError, match=rf"{field}\[5\] holds a lone surrogate U\+D800"):
        raygeom.write_activations(
            tmp_path / "store", model="m", layer="block_00", vectors=np.eye(16, 8), readout=np.eye(30, 8), **{field: values}
        )
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("where", ["new", "existing"])
def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch, where):
    """Issue 46 item 4: a write that fails after it started writing (here: the disk fills while the per-sample table
    is written) leaves the store as it was: a new store goes entirely (activations/, readout/, .lock), an existing
    one keeps only what it held before."""
    import errno

    from raygeom.store import tree

    root = tmp_path / "a" / "store"
    if where == "existing":
        write(root)
        tree.unlock_store(root)
    before = _tree(root)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tree.Store, "write_samples", full)
    with pytest.raises(OSError):
        raygeom.write_activations(
            root,
            model="other",
            layer="block_00",
            vectors=np.eye(16, 8),
            readout=np.eye(30, 8),
            texts=[f"t{i}" for i in range(16)],
        )
    assert _tree(root) == before
    assert (tmp_path / "a").exists() == (where == "existing")
    if where == "existing":
        assert raygeom.write_activations(root, model="smollm2-hook", layer="block_01", vectors=np.eye(16, 8) * 2)["layers"]
