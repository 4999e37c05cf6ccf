"""raygeom as a library: one documented public surface, torch or numpy of any dtype everywhere, one --layers rule,
and activations captured with your own hooks written into a store that the analyses and the report read."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import raygeom
from raygeom.errors import InputError

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
WORDS = ["shares", "goal", "film", "chips", "report", "week", "minister", "phones"]
TEXTS = [f"the market rose {i} times as investors bought {i * 7 % 13} {WORDS[i % 8]} and {WORDS[(i * 3) % 8]}" for i in range(24)]


@pytest.fixture(scope="module")
def pythia(hub_cache):
    return raygeom.load_model("EleutherAI/pythia-14m", revision="step143000")


def test_every_public_name_is_documented_and_listed():
    assert sorted(raygeom.__all__) == sorted(set(raygeom.__all__))
    for name in raygeom.__all__:
        value = getattr(raygeom, name)
        assert (value.__doc__ or "").strip(), f"raygeom.{name} has no docstring"
        assert name in dir(raygeom)
    for name in ("load_model", "readout_basis", "write_activations", "select_layers", "PGAResult", "store_pga", "store_analysis"):
        assert name in raygeom.__all__
    for field in ("z_se", "z_lo", "z_hi", "p_upper", "p_lower", "rho_texts_lo", "margin_texts_hi"):
        assert field in raygeom.PGAResult.__doc__


def test_the_quickstart_imports_and_uses_only_public_names():
    notebook = json.loads((ROOT / "docs" / "quickstart.ipynb").read_text())
    code = "\n".join("".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code")
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("raygeom"), f"quickstart imports from {node.module}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert not alias.name.startswith("raygeom."), f"quickstart imports {alias.name}"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "raygeom":
            assert node.attr in raygeom.__all__, f"quickstart uses raygeom.{node.attr}, which is not public"
    assert "raygeom.write_activations" in code or "raygeom.select_layers" in code


def test_layer_activations_parses_layers_like_the_cli(pythia):
    model, tokenizer = pythia
    settings = raygeom.ExtractionSettings(seq_len=32, batch_size=8)
    activations, _ = raygeom.layer_activations(model, tokenizer, TEXTS[:6], settings, layers="embed,1,-1", nll=False)
    assert list(activations) == ["embed", "block_01", "block_02"]
    listed, _ = raygeom.layer_activations(model, tokenizer, TEXTS[:6], settings, layers=["final_norm", "0"], nll=False)
    assert list(listed) == ["block_00", "final_norm"]
    inside, _ = raygeom.layer_activations(model, tokenizer, TEXTS[:6], settings, layers="1.resid_mid,1.mlp_out,1", nll=False)
    np.testing.assert_allclose(inside["block_01.resid_mid"] + inside["block_01.mlp_out"], inside["block_01"], atol=1e-4)
    with pytest.raises(raygeom.RaygeomError, match="layer '7' not found"):
        raygeom.layer_activations(model, tokenizer, TEXTS[:6], settings, layers="embed,7")


def same(a, b) -> bool:
    """Two results equal field by field, NaN equal to NaN."""
    a, b = a.to_dict(), b.to_dict()
    return a.keys() == b.keys() and all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)


def test_torch_inputs_of_any_dtype_with_grad_give_the_numpy_numbers(pythia):
    model, tokenizer = pythia
    activations, _ = raygeom.layer_activations(
        model, tokenizer, TEXTS, raygeom.ExtractionSettings(seq_len=32), layers="1", nll=False
    )
    h = activations["block_01"]
    w_u = model.get_output_embeddings().weight  # a Parameter: requires_grad
    assert w_u.requires_grad
    reference = raygeom.subspace_pga(h, w_u.detach().numpy(), k=6, n_null=20, seed=1, text_halves=4)
    from_torch = raygeom.subspace_pga(torch.from_numpy(h).requires_grad_(), w_u, k=6, n_null=20, seed=1, text_halves=4)
    assert same(from_torch, reference)
    # bf16 (as a GPU run stores it): the same vectors rounded to bf16, the same numbers as those rounded vectors in fp32.
    h_bf16 = torch.from_numpy(h).bfloat16()
    rounded = raygeom.subspace_pga(h_bf16.float().numpy(), w_u.detach().bfloat16().float().numpy(), k=6, n_null=20, seed=1)
    assert same(raygeom.subspace_pga(h_bf16, w_u.bfloat16(), k=6, n_null=20, seed=1), rounded)
    basis, values = raygeom.readout_basis(w_u.half(), 6)
    assert basis.shape == (64, 6) and values.dtype == np.float64
    assert raygeom.dispersion(h_bf16) == pytest.approx(raygeom.dispersion(h_bf16.float().numpy()))
    # the intervals the CLI stores, and the interval over texts
    row = reference.to_dict()
    for column in (
        "z_se",
        "z_lo",
        "z_hi",
        "p_upper",
        "p_lower",
        "rho_texts_lo",
        "rho_texts_hi",
        "margin_texts_lo",
        "margin_texts_hi",
    ):
        assert np.isfinite(row[column]), column
    assert row["rho_texts_lo"] < row["rho_readout"] < row["rho_texts_hi"] and row["n_half_samples"] == 4
    assert np.isnan(raygeom.subspace_pga(h, w_u, k=6, n_null=20, text_halves=0).rho_texts_lo)
    with pytest.raises(InputError, match="must hold real numbers"):
        raygeom.subspace_pga(torch.ones(24, 64, dtype=torch.bool), w_u, k=6)
    with pytest.raises(InputError, match="must hold real numbers"):
        raygeom.subspace_pga(np.ones((24, 64), dtype=complex), w_u, k=6)


def hook_capture(model, tokenizer, texts, block_index):
    """What an interpretability user does: a forward hook on one block, the last token of each text, one text at a time."""
    captured = []

    def hook(module, args, output):
        captured.append((output[0] if isinstance(output, tuple) else output)[0, -1].detach().clone())

    handle = model.gpt_neox.layers[block_index].register_forward_hook(hook)
    try:
        with torch.no_grad():
            for text in texts:
                ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=32)
                model(**ids)
    finally:
        handle.remove()
    return torch.stack(captured)


def test_hook_captured_vectors_written_to_a_store_give_raygeoms_pga_and_a_report(pythia, tmp_path):
    from raygeom.replica.replica import Replica
    from raygeom.replica.request import ExtractionRequest
    from raygeom.sources.corpus import Corpus
    from raygeom.sources.models import resolve_model

    model, tokenizer = pythia
    # raygeom's own extraction of the same texts (the replica the CLI's actors run), and its PGA
    spec = resolve_model("EleutherAI/pythia-14m", "step143000")
    settings = raygeom.ExtractionSettings(seq_len=32, batch_size=8)
    request = ExtractionRequest(spec, Corpus("tiny", TEXTS, None), settings, "1,2")
    own = tmp_path / "own"
    Replica(spec).write_extraction(str(own), request.key(), TEXTS, None, "tiny", settings, ["block_01", "block_02"], 256, False)
    expected = raygeom.store_pga(own, spec.slug, "step143000", k=6, n_null=20, seed=3, text_halves=4)

    # the same texts captured with a plain forward hook, one text at a time, handed over with requires_grad
    mine = tmp_path / "mine"
    for index in (1, 2):
        vectors = hook_capture(model, tokenizer, TEXTS, index)
        info = raygeom.write_activations(
            mine,
            model="pythia-14m-hooked",
            revision="step143000",
            layer=f"block_{index:02d}",
            vectors=vectors.requires_grad_(),
            texts=TEXTS,
            readout=model.get_output_embeddings().weight,
            n_blocks=3,
            source="torch forward hook on gpt_neox.layers",
        )
    assert info["layers"] == ["block_01", "block_02"] and info["source"] == "torch forward hook on gpt_neox.layers"
    assert info["n_samples"] == len(TEXTS) and info["step"] == 143000
    got = raygeom.store_pga(mine, "pythia-14m-hooked", "step143000", k=6, n_null=20, seed=3, text_halves=4)
    assert [r["layer"] for r in got] == [r["layer"] for r in expected] == ["block_01", "block_02"]
    assert all(r["source"] == "torch forward hook on gpt_neox.layers" for r in got) and "source" not in expected[0]
    for ours, theirs in zip(got, expected, strict=True):
        assert ours["relative_depth"] == theirs["relative_depth"] and ours["layer_index"] == theirs["layer_index"]
        for column in ("rho_readout", "null_mean", "null_std", "z", "z_lo", "z_hi", "rho_texts_lo", "rho_texts_hi"):
            assert ours[column] == pytest.approx(theirs[column], abs=1e-4), column
    # stored as the CLI stores rows: read back, not recomputed
    assert len(list((mine / "results" / "pga").glob("*.parquet"))) == 2
    assert raygeom.store_pga(mine, "pythia-14m-hooked", "step143000", k=6, n_null=20, seed=3, text_halves=4) == got

    # rewriting a layer with other vectors changes the key: the old rows are not read back as the new vectors'
    raygeom.write_activations(
        mine, model="pythia-14m-hooked", revision="step143000", layer="block_02", vectors=torch.randn(len(TEXTS), 64)
    )
    again = raygeom.store_pga(mine, "pythia-14m-hooked", "step143000", layers="block_02", k=6, n_null=20, seed=3, text_halves=4)
    assert again[0]["z"] != got[1]["z"]
    with pytest.raises(raygeom.RaygeomError, match="raygeom's own extraction"):
        raygeom.write_activations(
            own, model=spec.slug, revision="step143000", layer="block_00", vectors=np.ones((24, 64)), readout=np.ones((10, 64))
        )
    with pytest.raises(InputError, match="needs readout=W_U"):
        raygeom.write_activations(tmp_path / "other", model="m", layer="block_00", vectors=np.ones((4, 8)))
    with pytest.raises(InputError, match="23 texts for 24 vectors"):
        raygeom.write_activations(
            mine, model="pythia-14m-hooked", revision="step143000", layer="block_00", vectors=np.ones((24, 64)), texts=TEXTS[:23]
        )

    # raygeom report renders that store, run as a user runs it, from an empty working directory
    work = tmp_path / "cwd"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "raygeom.cli", "report", str(mine)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    html = (mine / "report.html").read_text()
    assert "pythia-14m-hooked" in html and "torch forward hook" not in done.stderr
    from raygeom.report.html import extraction_section

    settings_table = extraction_section(mine).tables[-1]
    assert "<th>source</th>" in settings_table and "torch forward hook on gpt_neox.layers" in settings_table


def test_every_registered_analysis_runs_on_hook_captured_vectors(pythia, tmp_path):
    from raygeom.analyses.registry import analyses

    model, tokenizer = pythia
    for index in (1, 2):
        raygeom.write_activations(
            tmp_path,
            model="pythia-14m-hooked",
            revision="step143000",
            layer=f"block_{index:02d}",
            vectors=hook_capture(model, tokenizer, TEXTS, index),
            texts=TEXTS,
            labels=["business" if i % 2 else "sport" for i in range(len(TEXTS))],
            readout=model.get_output_embeddings().weight,
            n_blocks=3,
        )
    small = {"k": 6, "n_null": 20, "text_halves": 4}  # d = 64 and 24 texts: the defaults (k = 100) do not fit
    for name, spec in analyses().items():
        if spec.extraction != "pooled":  # made from the model (token chunks, kNN features, aligned texts): refused
            with pytest.raises(raygeom.RaygeomError, match="reads an extraction of its own"):
                raygeom.store_analysis(tmp_path, "pythia-14m-hooked", "step143000", name)
            continue
        params = {key: value for key, value in small.items() if key in {f.name for f in spec.Params.declared()}}
        rows = raygeom.store_analysis(tmp_path, "pythia-14m-hooked", "step143000", name, **params)
        assert sorted({r["layer"] for r in rows}) == ["block_01", "block_02"], name
        assert not any(r.get("note") for r in rows), (name, [r.get("note") for r in rows])
        assert rows[0]["relative_depth"] == pytest.approx(2 / 4), name
        assert (tmp_path / "results" / name).is_dir(), name
    with pytest.raises(raygeom.RaygeomError, match="unknown key"):
        raygeom.store_analysis(tmp_path, "pythia-14m-hooked", "step143000", "twonn", k=6)
