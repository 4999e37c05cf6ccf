"""The Python API for notebooks: the CLI's analysis, in process, on objects you already hold.

    import raygeom
    model, tokenizer = raygeom.load_builtin("smollm2")        # the CLI's loader, offline
    texts, labels = raygeom.load_texts("bbc", n=40)           # the CLI's corpora
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


def load_model(name: str = "smollm2", revision: str | None = None, device: str = "cpu"):
    """``(model, tokenizer)`` of anything ``--model`` takes (built-in name, HF hub id, model directory, .gguf
    file), loaded exactly as the CLI loads it; a GGUF is dequantised once and cached (see the README)."""
    from raygeom.sources.models import load_model as load, resolve_model

    return load(resolve_model(name, revision), device=device)


def load_builtin(name: str = "smollm2", device: str = "cpu"):
    """``(model, tokenizer)`` of a built-in offline model: ``smollm2`` (SmolLM2-135M) or ``gemma3-270m``."""
    from raygeom.sources.models import BUILTIN_MODELS, resolve_model

    spec = resolve_model(name) if "/" not in name and not name.endswith(".gguf") else None
    if spec is None or spec.kind != "builtin":
        raise InputError(f"'{name}' is not a built-in model; built in: {', '.join(sorted(BUILTIN_MODELS))} "
                         "(raygeom.load_model takes hub ids, directories and .gguf files)")
    return load_model(spec.source, device=device)


def load_texts(source: str = "bbc", n: int | None = None, seed: int = 0) -> tuple[list[str], list[str] | None]:
    """``(texts, labels)`` of a corpus the CLI's ``--corpus`` takes; ``n`` texts in the CLI's seeded order."""
    from raygeom.sources.corpus import load_corpus

    corpus = load_corpus(source)
    if n is not None:
        corpus = corpus.sample(n, seed)
    return list(corpus.texts), (list(corpus.labels) if corpus.labels is not None else None)


def layer_activations(model, tokenizer, texts: list[str], settings: ExtractionSettings | None = None,
                      layers: list[str] | None = None, nll: bool = True) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Pooled hidden states of every layer (name -> N x d) and per-text mean NLL (NaN with ``nll=False``,
    which skips the full-vocabulary LM head)."""
    settings = settings or ExtractionSettings()
    batches = [extract_batch(model, tokenizer, texts[i:i + settings.batch_size], settings, layers, nll=nll)
               for i in range(0, len(texts), settings.batch_size)]
    names = list(batches[0].pooled)
    return {n: np.concatenate([b.pooled[n] for b in batches]) for n in names}, np.concatenate([b.nll for b in batches])


def unembedding_matrix(model) -> np.ndarray:
    """``W_U`` (V x d) of an HF causal LM; the input embedding when the model ties them."""
    return model_surgery.unembedding(model).detach().float().cpu().numpy()


def pga_by_layer(model, tokenizer, texts: list[str], *, k: int = 100, r: int = 1, n_null: int = 100, seed: int = 0,
                 settings: ExtractionSettings | None = None, layers: str | list[str] = "all") -> list[dict]:
    """Subspace PGA of every layer of ``model`` on ``texts`` (or of ``layers``: names, or a ``--layers`` string
    such as ``"embed,5,-1,final_norm"``): one dict per layer, in depth order, with its index and relative depth."""
    from raygeom.sources.layers import select_layers

    all_layers = model_surgery.layer_names(model)
    chosen = select_layers(all_layers, layers if isinstance(layers, str) else ",".join(layers))
    activations, _ = layer_activations(model, tokenizer, texts, settings, chosen, nll=False)
    basis, _ = pga.readout_basis(unembedding_matrix(model), k)
    rows = []
    for name, h in activations.items():
        index = all_layers.index(name)
        try:
            result = pga.subspace_pga(h, readout=basis, k=k, r=r, n_null=n_null, seed=seed).to_dict()
        except InputError as error:  # one degenerate layer (e.g. every text ends in the same token) is not fatal
            result = {"rho_readout": np.nan, "null_mean": np.nan, "null_std": np.nan, "z": np.nan, "note": str(error)}
        rows.append({"layer": name, "layer_index": index, "relative_depth": index / (len(all_layers) - 1), **result})
    return rows
