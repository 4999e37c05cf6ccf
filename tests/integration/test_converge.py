"""Cross-model convergence through Ray: planted stores with known answers, then tiny Pythia models through the CLI."""

import hashlib
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from raygeom.analyses import converge
from raygeom.errors import RaygeomError
from raygeom.numerics.convergence import convergence
from raygeom.store.tree import Store

pytestmark = pytest.mark.integration

N, D_A, D_B, K = 60, 16, 24, 4
LAYERS_A = ["embed", "block_00", "block_01", "final_norm"]
LAYERS_B = ["embed", "block_00", "block_01", "block_02", "final_norm"]


def sha(i):
    return hashlib.sha1(f"text {i}".encode()).hexdigest()


def write_model(store, name, layers, by_text, texts, basis, all_layers=None):
    """Store a fake extraction whose sample i holds the vector of text ``texts[i]``."""
    ids = np.arange(len(texts))
    for index, layer in enumerate(layers):
        store.write_layer(name, "main", layer, index, ids, by_text[layer][texts], key=f"{name}-key")
    store.write_readout(name, "main", basis, np.linspace(5, 1, basis.shape[1]))
    store.write_samples(
        name,
        "main",
        {
            "sample_id": ids.astype(np.int32),
            "nll": np.ones(len(texts)),
            "n_tokens": np.ones(len(texts), dtype=np.int32),
            "text_sha1": [sha(t) for t in texts],
        },
        key=f"{name}-key",
    )
    store.mark_complete(
        name,
        "main",
        {
            "key": f"{name}-key",
            "layers": layers,
            "all_layers": all_layers or layers,
            "n_samples": len(texts),
            "fingerprint": name,
            "d": basis.shape[0],
        },
    )


@pytest.fixture(scope="module")
def planted(ray_local, tmp_path_factory):
    """Model B is an isometric image of model A (d 16 -> 24) at matching depths, extra layers in between,
    and it saw the texts in a different order, plus 5 texts A never saw."""
    rng = np.random.default_rng(0)
    store = Store(tmp_path_factory.mktemp("converge"))
    by_text_a = {layer: rng.standard_normal((N + 5, D_A)) @ rng.standard_normal((D_A, D_A)) for layer in LAYERS_A}
    embedding = np.linalg.qr(rng.standard_normal((D_B, D_A)))[0].T  # D_A x D_B, orthonormal rows
    by_text_b = {
        "embed": by_text_a["embed"] @ embedding,
        "block_00": by_text_a["block_00"] @ embedding,
        "block_01": rng.standard_normal((N + 5, D_B)),
        "block_02": by_text_a["block_01"] @ embedding,
        "final_norm": by_text_a["final_norm"] @ embedding,
    }
    basis_a = np.linalg.qr(rng.standard_normal((D_A, 6)))[0]
    write_model(store, "a", LAYERS_A, by_text_a, np.arange(N), basis_a)
    write_model(store, "b", LAYERS_B, by_text_b, rng.permutation(N + 5), embedding.T @ basis_a)
    # 20 nulls: the fewest that carry an interval for z (uncertainty.Z_MIN_NULL)
    params = converge.ConvergeParams(k=K, r=1, n_null=20, null_chunks=3, seed=2)
    rows = converge.run_converge(store, [("a", "main"), ("b", "main")], params)
    return store, by_text_a, by_text_b, basis_a, embedding, params, rows


def cell(rows, layer_a, layer_b):
    return next(r for r in rows if r["layer_a"] == layer_a and r["layer_b"] == layer_b)


def test_isometric_copy_converges_to_one_at_matching_layers(planted):
    *_, rows = planted
    assert len(rows) == len(LAYERS_A) * len(LAYERS_B)
    assert {r["n"] for r in rows} == {N}  # aligned by text: B's 5 extra texts are dropped
    for layer_a, layer_b in [
        ("embed", "embed"),
        ("block_00", "block_00"),
        ("block_01", "block_02"),
        ("final_norm", "final_norm"),
    ]:
        assert cell(rows, layer_a, layer_b)["rho_full"] == pytest.approx(1.0, abs=1e-6)
        assert cell(rows, layer_a, layer_b)["rho_readout"] == pytest.approx(1.0, abs=1e-6)
        assert cell(rows, layer_a, layer_b)["null_mean"] < 0.99
    assert all(abs(r["rho_full"]) < 0.5 for r in rows if r["layer_b"] == "block_01")  # unrelated noise layer


def test_cells_equal_the_pairwise_numerics_on_text_aligned_rows(planted):
    store, by_text_a, by_text_b, basis_a, embedding, params, rows = planted
    got = cell(rows, "block_00", "block_01")
    # The store keeps float32 vectors.
    h_a, h_b = by_text_a["block_00"][:N].astype(np.float32), by_text_b["block_01"][:N].astype(np.float32)
    expected = convergence(h_a, h_b, basis_a, embedding.T @ basis_a, K, r=1, n_null=20, seed=2)
    for name in ("rho_full", "rho_readout", "null_mean", "null_std", "z"):
        assert got[name] == pytest.approx(expected[name], rel=1e-9, abs=1e-12), name


def test_result_does_not_depend_on_null_chunks(planted):
    store, *_, params, rows = planted
    shutil.rmtree(store.root / "results" / "converge")
    again = converge.run_converge(
        store, [("a", "main"), ("b", "main")], converge.ConvergeParams(k=K, r=1, n_null=20, null_chunks=8, seed=2)
    )
    assert [r["z"] for r in again] == [r["z"] for r in rows]
    assert [r["null_std"] for r in again] == [r["null_std"] for r in rows]
    for name in ("z_se", "z_lo", "z_hi", "p_upper", "p_lower"):  # the interval does not depend on the split either
        assert [r[name] for r in again] == [r[name] for r in rows]
    assert all(r["z_lo"] < r["z"] < r["z_hi"] for r in rows if np.isfinite(r["z"]))
    for name in ("rho_texts_lo", "excess_texts_hi", "margin_texts_lo", "rho_full_texts_hi"):
        np.testing.assert_array_equal([r[name] for r in again], [r[name] for r in rows])  # NaN: no interval in both
    assert all(r["n_half_samples"] == 10 for r in rows)
    # a correlation's interval lies inside [-1, 1] around it; none (NaN) where its spread over texts is 0 or it sits on 1
    assert all(np.isnan(r["rho_texts_hi"]) for r in rows if not np.isfinite(r["rho_texts_lo"]))
    scored = [r for r in rows if np.isfinite(r["rho_texts_lo"])]
    assert scored and all(-1 < r["rho_texts_lo"] <= r["rho_readout"] <= r["rho_texts_hi"] < 1 for r in scored)


def test_depths_restrict_the_grid_and_bad_requests_fail_clearly(planted, tmp_path):
    store, *_ = planted
    rows = converge.run_converge(
        store, [("a", "main"), ("b", "main")], converge.ConvergeParams(k=K, n_null=4, null_chunks=2, depths=2)
    )
    assert {(r["layer_a"], r["layer_b"]) for r in rows} == {
        (a, b) for a in ("embed", "final_norm") for b in ("embed", "final_norm")
    }
    with pytest.raises(RaygeomError, match="at least two models"):
        converge.run_converge(store, [("a", "main")], converge.ConvergeParams(k=K))
    with pytest.raises(RaygeomError, match="0 < k < d"):
        converge.run_converge(store, [("a", "main"), ("b", "main")], converge.ConvergeParams(k=D_A))
    stranger = Store(tmp_path)
    write_model(stranger, "a", ["embed"], {"embed": np.ones((5, D_A)) + np.eye(5, D_A)}, np.arange(5), np.eye(D_A)[:, :6])
    write_model(
        stranger, "c", ["embed"], {"embed": np.ones((105, D_A)) + np.eye(105, D_A)}, np.arange(100, 105), np.eye(D_A)[:, :6]
    )
    with pytest.raises(RaygeomError, match="share only 0 texts"):
        converge.run_converge(stranger, [("a", "main"), ("c", "main")], converge.ConvergeParams(k=K))


def test_tiny_pythia_models_of_different_width_through_the_cli(hub_cache, ray_local, tiny_corpus, tmp_path):
    from raygeom.cli.root import app
    from raygeom.testing import write_tiny_pythia

    # A repo id no other test writes, so its width cannot depend on which test ran first.
    write_tiny_pythia(hub_cache, "raygeom-tests/narrow-neox", ["step0"], hidden_size=48, layers=2)
    out, report = tmp_path / "out", tmp_path / "report"
    result = CliRunner().invoke(
        app,
        [
            "converge",
            "-m",
            "EleutherAI/pythia-14m@step1000",
            "-m",
            "raygeom-tests/narrow-neox@step0",
            "-c",
            str(tiny_corpus),
            "-n",
            "30",
            "--max-words",
            "12",
            "--seq-len",
            "32",
            "--k",
            "8",
            "--n-null",
            "6",
            "--null-chunks",
            "2",
            "--out",
            str(out),
            "--report",
            str(report),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = pq.read_table(out / "results" / "converge.parquet").to_pylist()
    assert len(rows) == 5 * 4 and {r["n"] for r in rows} == {30}
    assert {(r["d_a"], r["d_b"]) for r in rows} == {(64, 48)}
    assert all(np.isfinite(r["z"]) and -1 <= r["rho_full"] <= 1 for r in rows)
    heatmap = "converge_EleutherAI--pythia-14m@step1000_vs_raygeom-tests--narrow-neox@step0.png"
    assert (report / heatmap).stat().st_size > 20_000
    markdown = (report / "converge.md").read_text()
    assert "Layers matched by relative depth" in markdown and "z ± 95% half-width" in markdown
    assert all(1 / 7 <= r["p_upper"] <= 1 and 1 / 7 <= r["p_lower"] <= 1 for r in rows)  # (1 + count) / (1 + 6 nulls)


def test_cli_needs_two_models(hub_cache, tiny_corpus, tmp_path):
    from raygeom.cli.root import app

    result = CliRunner().invoke(
        app, ["converge", "-m", "EleutherAI/pythia-14m", "-c", str(tiny_corpus), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2 and "at least two models" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()
