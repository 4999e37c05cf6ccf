"""`raygeom export STORE --tensorboard DIR`, run as a user runs it, read back with TensorBoard's own reader."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import raygeom

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "raygeom.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
        check=False,
    )


def read_events(directory: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def test_every_per_layer_metric_reads_back_from_the_event_files(tmp_path):
    store = tmp_path / "store"
    rng = np.random.default_rng(0)
    base = rng.standard_normal((30, 16))
    layers = {
        "block_00": base + 0.1 * rng.standard_normal((30, 16)),
        "block_01.mlp_out": rng.standard_normal((30, 16)),
        "block_01": base + 0.5 * rng.standard_normal((30, 16)),
    }
    raygeom.write_activations(
        store, model="org/tiny", revision="step5", vectors=layers, readout=rng.standard_normal((50, 16)), n_blocks=2
    )
    expected = raygeom.store_pga(store, "org/tiny", "step5", k=4, n_null=8, text_halves=4)
    expected += raygeom.store_pga(store, "org/tiny", "step5", layers="1", k=6, n_null=8, text_halves=0)  # other settings
    work = tmp_path / "cwd"
    work.mkdir()
    board = tmp_path / "board"
    done = run_cli("export", store, "--tensorboard", board, cwd=work)
    assert done.returncode == 0, done.stderr
    assert "2 runs" in done.stdout and "tensorboard --logdir" in done.stdout and "scalars from pga)" in done.stdout
    # text_halves=0 leaves the interval over texts NaN: left out, said once, no TensorBoard warning per value
    assert "NaN or Inf" not in done.stderr and done.stdout.count("NaN or infinite values left out") == 1
    runs = sorted(p.parent for p in board.rglob("events.out.tfevents.*"))
    # a run is named by the settings that tell it from the others of its model and revision, not by a hash
    assert sorted(run.relative_to(board).as_posix() for run in runs) == ["pga/org%2Ftiny@step5/k=4", "pga/org%2Ftiny@step5/k=6"]
    seen, every_tag = 0, set()
    for run in runs:
        events = read_events(run)
        tags = set(events.Tags()["scalars"])
        every_tag |= tags
        assert {"pga/z", "pga/rho_readout", "pga/p_upper"} <= tags
        for row in expected:
            sub = row["layer"].partition(".")[2]
            suffix = f"/{sub}" if sub else ""
            if f"pga/z{suffix}" not in tags:
                continue
            values = {e.step: e.value for e in events.Scalars(f"pga/z{suffix}")}
            spread = {e.step: e.value for e in events.Scalars(f"pga/null_std{suffix}")}
            if spread.get(row["layer_index"]) == pytest.approx(row["null_std"], rel=1e-6):
                assert values[row["layer_index"]] == pytest.approx(row["z"], rel=1e-6)
                seen += 1
    assert seen == len(expected)  # every stored row, at its layer's index, in its own run
    # z's interval (NaN with 8 nulls) is a tag only where some row has a finite one
    assert ("pga/z_lo" in every_tag) == any(np.isfinite(row["z_lo"]) for row in expected)
    events = read_events(next(run for run in runs if "pga/rho_texts_lo" in read_events(run).Tags()["scalars"]))
    assert sorted(e.step for e in events.Scalars("pga/z")) == [1, 2] and [e.step for e in events.Scalars("pga/z/mlp_out")] == [2]


def test_a_store_without_results_or_without_a_format_is_one_line_exit_2(tmp_path):
    work = tmp_path / "cwd"
    work.mkdir()
    (tmp_path / "empty").mkdir()
    for args, message in (
        (["export", tmp_path / "empty", "--tensorboard", tmp_path / "b"], "holds no per-layer results"),
        (["export", tmp_path / "missing", "--tensorboard", tmp_path / "b"], "is not a directory"),
        (["export", tmp_path / "empty"], "choose what to export: --tensorboard DIR"),
    ):
        done = run_cli(*args, cwd=work)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_runs_are_named_by_the_settings_that_vary_never_by_result_columns(tmp_path):
    """Result columns that are not floats (twonn's point count, kNN-LM's grid-edge words, the temperature it chose per
    layer) vary from layer to layer; a run is one (model, revision, settings), whatever its results."""
    from raygeom.store.tree import Store

    store = Store(tmp_path / "store")
    where = [{"model": "m", "revision": "main", "layer": f"block_0{i}", "layer_index": i + 1} for i in range(2)]
    for i, at in enumerate(where):
        twonn = {**at, "discard_fraction": 0.1, "twonn": 5.0 + i, "twonn_points": (113, 200)[i]}
        store.write_result("twonn", f"t{i}", twonn)
        knn = {**at, "k": 64, "chunk_len": 32, "temperature": 2.5 * (i + 1), "lam_edge": ("", "lower")[i]}
        store.write_result("knn", f"k{i}", {**knn, "scale_edge": ("", "lower")[i], "delta": 0.1 * i})
        for k in (4, 6):  # a setting that varies: two runs
            pga = {**at, "k": k, "r": 1, "n_null": 20, "seed": 0, "z": 1.0 + i, "z_half_width": 0.3 + 0.1 * i}
            store.write_result("pga", f"p{k}-{i}", pga)
    work = tmp_path / "cwd"
    work.mkdir()
    board = tmp_path / "board"
    done = run_cli("export", store.root, "--tensorboard", board, cwd=work)
    assert done.returncode == 0, done.stderr
    runs = sorted(p.parent.relative_to(board).as_posix() for p in board.rglob("events.out.tfevents.*"))
    assert runs == ["knn/m@main", "pga/m@main/k=4", "pga/m@main/k=6", "twonn/m@main"]
    events = read_events(board / "pga" / "m@main" / "k=4")
    assert {e.step: e.value for e in events.Scalars("pga/z_half_width")} == pytest.approx({1: 0.3, 2: 0.4})
    assert sorted(e.step for e in read_events(board / "knn" / "m@main").Scalars("knn/temperature")) == [1, 2]
