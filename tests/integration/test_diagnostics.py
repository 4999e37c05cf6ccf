"""Per-layer diagnostics through Ray: planted geometry with known answers, then tiny Pythia end to end and the CLI."""

import hashlib
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy import stats
from typer.testing import CliRunner

from raygeom.analyses import diagnostics
from raygeom.errors import RaygeomError
from raygeom.numerics import layer_geometry, pga, probe, spectral
from raygeom.replica.extract import ExtractionSettings
from raygeom.replica.request import ExtractionRequest
from raygeom.sources.corpus import load_corpus
from raygeom.sources.models import resolve_model
from raygeom.store.tree import Store

pytestmark = pytest.mark.integration

N, D, K = 120, 32, 4
LAYERS = ["embed", "block_00", "block_01", "final_norm"]


def planted_store(root, seed=0):
    """One fake extraction whose layers plant known answers.

    embed: PC1 inside the readout subspace, labels separable.
    block_00: PC1 orthogonal to it, labels separable.
    block_01: isotropic noise (labels carry nothing).
    final_norm: PC1 in a random direction.
    """
    rng = np.random.default_rng(seed)
    q = np.linalg.qr(rng.standard_normal((D, D)))[0]
    readout, dark = q[:, :K], q[:, K:]
    labels = np.array(["a", "b", "c"])[np.arange(N) % 3]
    codes = np.arange(N) % 3
    noise = lambda: 0.3 * rng.standard_normal((N, D))  # noqa: E731
    class_means = 3.0 * rng.standard_normal((3, D))
    spike = 20.0 * rng.standard_normal((N, 1))
    layers = {
        "embed": noise() + class_means[codes] + spike * readout[:, 0],
        "block_00": noise() + class_means[codes] + spike * dark[:, 3],
        "block_01": rng.standard_normal((N, D)),
        "final_norm": noise() + spike * (rng.standard_normal(D) / np.sqrt(D)) * 3,
    }
    store = Store(root)
    for index, name in enumerate(LAYERS):
        store.write_layer("planted", "main", name, index, np.arange(N), layers[name], key="planted-1")
    store.write_readout("planted", "main", q[:, :8], np.linspace(8, 1, 8))
    nll = 2.0 + rng.uniform(size=N)
    store.write_samples(
        "planted",
        "main",
        {
            "sample_id": np.arange(N, dtype=np.int32),
            "nll": nll,
            "n_tokens": np.full(N, 10, dtype=np.int32),
            "label": list(labels),
            "text_sha1": [hashlib.sha1(str(i).encode()).hexdigest() for i in range(N)],
        },
        key="planted-1",
    )
    store.mark_complete(
        "planted",
        "main",
        {"key": "planted-1", "layers": LAYERS, "all_layers": LAYERS, "n_samples": N, "fingerprint": "f", "d": D},
    )
    return store, layers, readout, labels, nll


@pytest.fixture(scope="module")
def planted(ray_local, tmp_path_factory):
    store, layers, readout, labels, nll = planted_store(tmp_path_factory.mktemp("planted"))
    params = diagnostics.DiagnosticsParams(k=K, ccr_ranks=(0, 1, 5), n_null=6, null_chunks=2, seed=3)
    result = diagnostics.run_diagnostics(store, "planted", "main", LAYERS, params)
    return store, layers, readout, labels, nll, params, result


def test_planted_pc1_share_and_probes_come_back(planted):
    *_, result = planted
    rows = {r["layer"]: r for r in result["layers"]}
    assert rows["embed"]["pc1_readout_share"] > 0.95
    assert rows["block_00"]["pc1_readout_share"] < 0.02
    assert all(r["pc1_readout_chance"] == pytest.approx(K / D) for r in rows.values())
    assert rows["embed"]["pc1_variance_fraction"] > 0.5
    assert rows["embed"]["probe_accuracy"] == 1.0 and rows["block_00"]["probe_accuracy"] == 1.0
    assert rows["block_01"]["probe_accuracy"] < 0.6  # 3 balanced classes: chance is 1/3
    assert rows["block_01"]["rankme"] > 0.8 * D and rows["block_01"]["isotropy"] > rows["embed"]["isotropy"]


def test_every_unit_equals_the_numerics_on_the_stored_layer(planted):
    store, layers, readout, labels, nll, params, result = planted
    basis = store.read_readout("planted", "main")[0][:, :K]
    for row in result["spectral"]:
        _, h = store.read_layer("planted", "main", row["layer"])
        expected = spectral.spectral_summary(h, basis)
        for name in ("rankme", "alpha_req", "condition_number", "isotropy", "pc1_readout_share"):
            assert row[name] == pytest.approx(expected[name], rel=1e-9), name
    for row in result["probe"]:
        _, h = store.read_layer("planted", "main", row["layer"])
        assert row["accuracy"] == probe.linear_probe_accuracy(h, labels, seed=params.seed)["accuracy"]
    for row in result["pga"]:
        _, h = store.read_layer("planted", "main", row["layer"])
        expected = pga.subspace_pga(h, readout=basis, k=K, r=row["r"], n_null=6, seed=3)
        assert row["z"] == pytest.approx(expected.z, rel=1e-9)
    assert sorted({(r["layer"], r["r"]) for r in result["pga"]}) == sorted((l, r) for l in LAYERS for r in (0, 1, 5))


def test_loss_sits_beside_per_sample_geometry(planted):
    store, layers, readout, labels, nll, params, result = planted
    samples = diagnostics.read_sample_rows(store, "planted", "main", LAYERS, K, params.sample_ccr)
    assert len(samples) == N * len(LAYERS)
    basis = store.read_readout("planted", "main")[0][:, :K]
    for layer in LAYERS:
        mine = sorted((r for r in samples if r["layer"] == layer), key=lambda r: r["sample_id"])
        np.testing.assert_allclose([r["nll"] for r in mine], nll)
        _, h = store.read_layer("planted", "main", layer)
        share = layer_geometry.per_sample_readout_share(h, basis, params.sample_ccr)
        np.testing.assert_allclose([r["readout_share"] for r in mine], share, rtol=1e-9)
        summary = next(r for r in result["sample_geometry"] if r["layer"] == layer)
        rho = stats.spearmanr(nll, share)[0]
        assert summary["loss_share_spearman"] == pytest.approx(rho)
        # Fisher's z with the Bonett-Wright variance (1 + rho^2/2) / (N - 3), computed here from its definition
        half = 1.959963984540054 * np.sqrt((1 + rho * rho / 2) / (N - 3))
        assert summary["loss_share_spearman_lo"] == pytest.approx(np.tanh(np.arctanh(rho) - half))
        assert summary["loss_share_spearman_hi"] == pytest.approx(np.tanh(np.arctanh(rho) + half))


def test_rerun_reads_every_unit_back(planted):
    store, *_, params, result = planted
    results = store.root / "results"
    before = {p: p.stat().st_mtime_ns for p in results.rglob("*.parquet")}
    again = diagnostics.run_diagnostics(store, "planted", "main", LAYERS, params)
    assert {p: p.stat().st_mtime_ns for p in results.rglob("*.parquet")} == before
    # NaN (an interval below 20 nulls) is not equal to itself: compare the rows' text
    assert repr(again["layers"]) == repr(result["layers"])


def test_bad_requests_fail_with_one_clear_message(planted, tmp_path):
    store, *_ = planted
    with pytest.raises(RaygeomError, match="0 < k < d"):
        diagnostics.run_spectral(store, "planted", "main", LAYERS, D)
    with pytest.raises(RaygeomError, match=r"below min\(N, d\)"):
        diagnostics.run_restoration(store, "planted", "main", LAYERS, diagnostics.DiagnosticsParams(k=K, ccr_ranks=(0, 40)))
    with pytest.raises(RaygeomError, match="no complete extraction"):
        diagnostics.run_probes(Store(tmp_path), "planted", "main", LAYERS)
    with pytest.raises(RaygeomError, match="CCR ranks"):
        diagnostics.DiagnosticsParams(ccr_ranks=(-1,))


@pytest.fixture
def labelled_corpus(tmp_path):
    from raygeom.testing import varied_text

    topics = ["markets", "politics", "sport", "film", "tech"]
    path = tmp_path / "labelled.jsonl"
    path.write_text("\n".join(json.dumps({"text": f"number {i} {varied_text(i)}", "label": topics[i % 5]}) for i in range(60)))
    return path


def test_tiny_pythia_diagnostics_through_the_cli(hub_cache, ray_local, labelled_corpus, tmp_path):
    from raygeom.cli.root import app

    out, report = tmp_path / "out", tmp_path / "report"
    result = CliRunner().invoke(
        app,
        [
            "diagnose",
            "-m",
            "EleutherAI/pythia-14m",
            "-r",
            "step1000",
            "-c",
            str(labelled_corpus),
            "-n",
            "40",
            "--seq-len",
            "32",
            "--k",
            "8",
            "--ccr-ranks",
            "0,1,5,10",
            "--n-null",
            "8",
            "--null-chunks",
            "2",
            "--out",
            str(out),
            "--report",
            str(report),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = pq.read_table(out / "results" / "diagnostics_layers.parquet").to_pylist()
    assert [r["layer"] for r in rows] == ["embed", "block_00", "block_01", "block_02", "final_norm"]
    for row in rows:
        assert all(np.isfinite(row[f"z_ccr{r}"]) for r in (0, 1, 5, 10))
        assert 0.0 <= row["probe_accuracy"] <= 1.0 and row["pc1_readout_chance"] == pytest.approx(8 / 64)
    # The CLI's extraction is the pipeline's: same stored layer as a direct extraction request would key.
    corpus = load_corpus(str(labelled_corpus)).sample(40, 0)
    request = ExtractionRequest(resolve_model("EleutherAI/pythia-14m", "step1000"), corpus, ExtractionSettings(seq_len=32), "all")
    assert Store(out).is_complete("EleutherAI--pythia-14m", "step1000", request.key())
    for name in (
        "diagnostics_EleutherAI--pythia-14m@step1000.png",
        "ccr_restoration.png",
        "diagnostics.md",
        "diagnostics_layers.parquet",
    ):
        assert (report / name).stat().st_size > 1000, name
    assert (out / "results" / "diagnostics_samples.parquet").stat().st_size > 1000
    assert "z CCR-10" in (report / "diagnostics.md").read_text()
    # `probe` on the same store reuses the extraction and the probe units diagnose wrote.
    probed = CliRunner().invoke(
        app,
        [
            "probe",
            "-m",
            "EleutherAI/pythia-14m",
            "-r",
            "step1000",
            "-c",
            str(labelled_corpus),
            "-n",
            "40",
            "--seq-len",
            "32",
            "--out",
            str(out),
        ],
    )
    assert probed.exit_code == 0, probed.output
    accuracies = {r["layer"]: r["accuracy"] for r in pq.read_table(out / "results" / "probe.parquet").to_pylist()}
    assert accuracies == {r["layer"]: r["probe_accuracy"] for r in rows}
    assert (out / "plots" / "probe_accuracy_vs_depth.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ccr-ranks", "1,x"], "--ccr-ranks must be comma-separated integers"),
        (["--k", "0"], "--k must be an integer >= 1"),
    ],
)
def test_cli_bad_input_is_one_line_and_writes_nothing(hub_cache, labelled_corpus, tmp_path, args, message):
    from raygeom.cli.root import app

    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["diagnose", "-m", "EleutherAI/pythia-14m", "-c", str(labelled_corpus), "-n", "20", "--out", str(out), *args]
    )
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not (out / "results").exists()


def test_probe_needs_labels(hub_cache, tmp_path):
    from raygeom.cli.root import app

    corpus = tmp_path / "plain.txt"
    corpus.write_text("\n".join(f"line {i} of text" for i in range(30)))
    result = CliRunner().invoke(
        app, ["probe", "-m", "EleutherAI/pythia-14m", "-c", str(corpus), "-n", "20", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2 and "no labels" in result.output
