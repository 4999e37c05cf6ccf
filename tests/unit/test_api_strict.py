"""The API is as strict as the CLI (issue 46 item 3): each case the issue found, and what it must get.

Expected outcomes are stated here from the definitions, not read back from the code: a readout of rank below k,
a zero vector under a cosine, an empty selection and a value outside a flag's declared range are refused with one
RaygeomError line naming the argument; nothing else escapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.spatial.distance import pdist

import raygeom
from raygeom.errors import RaygeomError

NAMES = ["embed", "block_00", "block_01", "block_02", "final_norm"]
RNG = np.random.default_rng(46)
H = RNG.standard_normal((40, 16))
FULL = RNG.standard_normal((50, 16))


def low_rank(rank: int, rows: int = 50, d: int = 16) -> np.ndarray:
    rng = np.random.default_rng(rank)
    return rng.standard_normal((rows, rank)) @ rng.standard_normal((rank, d)) if rank else np.zeros((rows, d))


def tiny_model():
    from raygeom.testing import tiny_llama

    return tiny_llama(64, seed=0, hidden_size=16, layers=1)


def refused(call, *words: str) -> str:
    with pytest.raises(RaygeomError) as caught:
        call()
    text = str(caught.value)
    assert text.strip() and "\n" not in text, text
    for word in words:
        assert word in text, f"{word!r} not in {text!r}"
    return text


# (call, words the one line must hold)
CASES = {
    # a readout of rank below k: W_U all zeros, rank 1, 1 and 5 rows (k = 10)
    "W_U all zeros": (lambda: raygeom.subspace_pga(H, np.zeros((50, 16)), k=10), ("W_U", "rank 0", "k = 10")),
    "W_U of rank 1": (lambda: raygeom.subspace_pga(H, low_rank(1), k=10), ("W_U", "rank 1", "k = 10")),
    "W_U of 1 row": (lambda: raygeom.subspace_pga(H, FULL[:1], k=10), ("W_U", "rank 1", "k = 10")),
    "W_U of 5 rows": (lambda: raygeom.subspace_pga(H, FULL[:5], k=10), ("W_U", "rank 5", "k = 10")),
    "readout_basis of a rank-3 W_U, k = 4": (lambda: raygeom.readout_basis(low_rank(3), 4), ("W_U", "rank 3", "k = 4")),
    "a readout basis with a zero column": (
        lambda: raygeom.subspace_pga(H, readout=np.eye(16)[:, :10] * (np.arange(10) > 0), k=10),
        ("readout", "rank 9"),
    ),
    "a readout basis narrower than k": (lambda: raygeom.subspace_pga(H, readout=np.eye(16)[:, :6], k=10), ("readout", "k' >= k")),
    "both W_U and a readout": (lambda: raygeom.subspace_pga(H, FULL, readout=np.eye(16)[:, :10], k=10), ("not both",)),
    # zero vectors where a cosine is taken
    "dispersion of zeros": (lambda: raygeom.dispersion(np.zeros((5, 4))), ("H row 0", "zero vector")),
    "dispersion with one zero row": (lambda: raygeom.dispersion(np.vstack([np.ones((4, 4)), np.zeros((1, 4))])), ("H row 4",)),
    # no value where an array belongs
    "as_array(None)": (lambda: raygeom.as_array(None), ("array", "None")),
    "as_array([1, None])": (lambda: raygeom.as_array([1.0, None], name="x"), ("x", "non-numbers")),
    "as_array with a string dtype": (lambda: raygeom.as_array([1.0], dtype="U3"), ("dtype",)),
    # empty or mistyped selections
    "select_layers(names, '')": (lambda: raygeom.select_layers(NAMES, ""), ("layers", "not empty")),
    "select_layers(names, '  ')": (lambda: raygeom.select_layers(NAMES, "  "), ("layers", "not empty")),
    "select_layers(names, [])": (lambda: raygeom.select_layers(NAMES, []), ("layers", "non-empty list")),
    "select_layers(names, 5)": (lambda: raygeom.select_layers(NAMES, 5), ("layers", "int")),
    "select_layers(names, None)": (lambda: raygeom.select_layers(NAMES, None), ("layers",)),
    "select_layers(None, 'all')": (lambda: raygeom.select_layers(None, "all"), ("all_layers",)),
    "select_layers(names, [True])": (lambda: raygeom.select_layers(NAMES, [True]), ("layers[0]",)),
    "select_layers(names, [5])": (lambda: raygeom.select_layers(NAMES, [5]), ("layer '5' not found",)),
    # not a model
    "unembedding_matrix(None)": (lambda: raygeom.unembedding_matrix(None), ("model", "NoneType")),
    "layer_names(None)": (lambda: raygeom.layer_names(None), ("model", "NoneType")),
    "layer_activations(None, ...)": (lambda: raygeom.layer_activations(None, None, ["a text"]), ("model",)),
    "layer_activations(model, tokenizer=False)": (
        lambda: raygeom.layer_activations(tiny_model(), False, ["a text"]),
        ("tokenizer", "bool"),
    ),
    "pga_by_layer(None, ...)": (lambda: raygeom.pga_by_layer(None, None, ["a text"]), ("model",)),
    # load_texts: the declarations of --corpus, --n-samples and --sample-seed
    "load_texts(n=40.9)": (lambda: raygeom.load_texts("bbc", n=40.9), ("n must be an integer", "40.9")),
    "load_texts(seed=-1)": (lambda: raygeom.load_texts("bbc", n=10, seed=-1), ("seed must be an integer >= 0", "-1")),
    "load_texts(seed=2**32)": (lambda: raygeom.load_texts("bbc", n=10, seed=2**32), ("seed", "4,294,967,295")),
    "load_texts(None)": (lambda: raygeom.load_texts(None), ("source",)),
    "load_texts(n=True)": (lambda: raygeom.load_texts("bbc", n=True), ("n must be an integer",)),
    # names of models and stores
    "load_builtin(None)": (lambda: raygeom.load_builtin(None), ("name",)),
    "load_builtin(5)": (lambda: raygeom.load_builtin(5), ("name",)),
    'load_builtin("0\\n")': (lambda: raygeom.load_builtin("0\n"), ("name must be one line",)),
    "load_model('')": (lambda: raygeom.load_model(""), ("name",)),
    "readout_basis(None, 3)": (lambda: raygeom.readout_basis(None, 3), ("W_U", "None")),
    "readout_basis(W_U, 2.5)": (lambda: raygeom.readout_basis(FULL, 2.5), ("k must be an integer", "2.5")),
    "store_pga(None, 'm')": (lambda: raygeom.store_pga(None, "m"), ("store", "path")),
    "store_pga(a name too long)": (lambda: raygeom.store_pga("x" * 300, "m"), ("store", "not a usable path")),
    "store_analysis(analysis=5)": (lambda: raygeom.store_analysis("nowhere", "m", "main", 5), ("analysis",)),
    "write_report(None)": (lambda: raygeom.write_report(None), ("store_root", "path")),
    "write_report(overlay='a')": (lambda: raygeom.write_report("nowhere", overlay="a"), ("overlay",)),
    # the rest of subspace_pga's arguments
    "subspace_pga(k=10.5)": (lambda: raygeom.subspace_pga(H, FULL, k=10.5), ("k must be an integer", "10.5")),
    "subspace_pga(seed=-1)": (lambda: raygeom.subspace_pga(H, FULL, k=5, seed=-1), ("seed", "-1")),
    "subspace_pga(k=d)": (lambda: raygeom.subspace_pga(H, FULL, k=16), ("k", "16")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_case_is_refused_in_one_line_naming_its_argument(case):
    call, words = CASES[case]
    refused(call, *words)


def test_write_activations_refuses_texts_that_are_not_strings_and_a_zero_readout(tmp_path):
    vectors = RNG.standard_normal((40, 8))
    readout = RNG.standard_normal((30, 8))
    refused(
        lambda: raygeom.write_activations(
            tmp_path / "a", model="m", layer="embed", vectors=vectors, texts=list(range(40)), readout=readout
        ),
        "texts[0]",
    )
    refused(
        lambda: raygeom.write_activations(tmp_path / "b", model="m", layer="embed", vectors=vectors, readout=np.zeros((30, 8))),
        "readout",
        "rank 0",
    )
    assert not (tmp_path / "b").exists()


def test_the_store_refuses_a_readout_of_rank_below_k_as_the_api_does(tmp_path):
    """A W_U of rank 3 is stored (a later analysis may ask for k <= 3), but PGA with k = 5 on it is refused, by the
    same rule and the same words as raygeom.subspace_pga."""
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((30, 12))
    raygeom.write_activations(tmp_path / "s", model="m", layer="embed", vectors=vectors, readout=low_rank(3, 40, 12))
    refused(lambda: raygeom.store_pga(tmp_path / "s", "m", k=5, n_null=10, text_halves=0), "readout", "rank 3", "k = 5")
    refused(lambda: raygeom.subspace_pga(vectors, low_rank(3, 40, 12), k=5, n_null=10), "W_U", "rank 3", "k = 5")


def test_what_is_allowed_still_works():
    """The controls: a readout of rank exactly k, nonzero rows, real selections and counts."""
    result = raygeom.subspace_pga(H, low_rank(10), k=10, n_null=20, text_halves=0)
    assert math.isfinite(result.z) and result.k == 10
    assert math.isfinite(raygeom.subspace_pga(H, readout=raygeom.readout_basis(FULL, 10)[0], k=8, n_null=20, text_halves=0).z)
    rows = RNG.standard_normal((7, 5))
    assert raygeom.dispersion(rows) == pytest.approx(pdist(rows, "cosine").mean(), abs=1e-12)
    assert raygeom.select_layers(NAMES, "all") == NAMES
    assert raygeom.select_layers(NAMES, ["embed", "-1"]) == ["embed", "block_02"]
    assert raygeom.select_layers(NAMES, [0, "final_norm"]) == ["block_00", "final_norm"]
    assert raygeom.as_array([[1, 2]], np.float32).dtype == np.float32
