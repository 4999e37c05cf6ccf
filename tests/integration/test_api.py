"""The notebook API gives the same numbers as the pure functions on the same arrays."""

import numpy as np
import pytest

import raygeom
from raygeom.sources.models import load_model, resolve_model
from tests import reference

pytestmark = pytest.mark.integration


def test_pga_by_layer_matches_the_scipy_reference_on_the_same_activations(hub_cache):
    model, tokenizer = load_model(resolve_model("EleutherAI/pythia-14m", "step143000"))
    words = ["shares", "goal", "film", "chips", "report", "week"]
    texts = [f"the market rose {i} times as investors bought {i * 7 % 13} {words[i % 6]}" for i in range(30)]
    rows = raygeom.pga_by_layer(model, tokenizer, texts, k=6, n_null=15, seed=2)
    assert [r["layer"] for r in rows] == ["embed", "block_00", "block_01", "block_02", "final_norm"]
    activations, nll = raygeom.layer_activations(model, tokenizer, texts)
    assert nll.shape == (30,) and np.isfinite(nll).all()
    w_u = raygeom.unembedding_matrix(model)
    for row in rows:
        if row.get("note"):  # the texts end in 6 distinct words: the embedding has rank 5, below k + 2, as the CLI says
            assert row["layer"] == "embed" and "not scored: rank" in row["note"] and np.isnan(row["z"]), row
            continue
        expected = reference.pga(activations[row["layer"]], w_u, k=6, r=1, n_null=15, seed=2)
        assert abs(row["z"] - expected["z"]) <= 0.05
        assert row["rho_readout"] == pytest.approx(expected["rho_readout"], abs=2e-4)


def test_a_layer_where_every_text_has_the_same_vector_is_reported_not_fatal(hub_cache):
    model, tokenizer = load_model(resolve_model("EleutherAI/pythia-14m", "step0"))
    texts = [f"the market rose {i} times and closed at {i * 7 % 13} ." for i in range(12)]
    rows = {r["layer"]: r for r in raygeom.pga_by_layer(model, tokenizer, texts, k=6, n_null=5)}
    assert np.isnan(rows["embed"]["z"]) and "same vector" in rows["embed"]["note"]
    assert np.isfinite(rows["final_norm"]["z"])
