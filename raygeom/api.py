"""The Python API for notebooks: the CLI's analysis, in process, on objects you already hold.

    import raygeom
    result = raygeom.subspace_pga(H, W_U, k=100)              # arrays you have
    layers = raygeom.layer_activations(model, tokenizer, texts)  # an HF model you have
    table = raygeom.pga_by_layer(model, tokenizer, texts, k=100)

No Ray is started here; use the CLI (or raygeom.engine.orchestrate) to fan work out.
"""

from __future__ import annotations

import numpy as np

from raygeom.sources import model_surgery
from raygeom.errors import InputError
from raygeom.replica.extract import ExtractionSettings, extract_batch
from raygeom.numerics import pga


def layer_activations(model, tokenizer, texts: list[str], settings: ExtractionSettings | None = None,
                      layers: list[str] | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Pooled hidden states of every layer (name -> N x d) and per-text mean NLL."""
    settings = settings or ExtractionSettings()
    batches = [extract_batch(model, tokenizer, texts[i:i + settings.batch_size], settings, layers)
               for i in range(0, len(texts), settings.batch_size)]
    names = list(batches[0].pooled)
    return {n: np.concatenate([b.pooled[n] for b in batches]) for n in names}, np.concatenate([b.nll for b in batches])


def unembedding_matrix(model) -> np.ndarray:
    """``W_U`` (V x d) of an HF causal LM; the input embedding when the model ties them."""
    return model_surgery.unembedding(model).detach().float().cpu().numpy()


def pga_by_layer(model, tokenizer, texts: list[str], *, k: int = 100, r: int = 1, n_null: int = 100, seed: int = 0,
                 settings: ExtractionSettings | None = None) -> list[dict]:
    """Subspace PGA of every layer of ``model`` on ``texts``: one dict per layer, in depth order."""
    activations, _ = layer_activations(model, tokenizer, texts, settings)
    basis, _ = pga.readout_basis(unembedding_matrix(model), k)
    rows = []
    for index, (name, h) in enumerate(activations.items()):
        try:
            result = pga.subspace_pga(h, readout=basis, k=k, r=r, n_null=n_null, seed=seed).to_dict()
        except InputError as error:  # one degenerate layer (e.g. every text ends in the same token) is not fatal
            result = {"rho_readout": np.nan, "null_mean": np.nan, "null_std": np.nan, "z": np.nan, "note": str(error)}
        rows.append({"layer": name, "layer_index": index, **result})
    return rows
