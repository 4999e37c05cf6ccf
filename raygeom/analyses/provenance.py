"""The settings that produced a row, read from the extraction's completion marker: every tidy table
carries them, so rows from different jobs in one store can always be told apart."""

from __future__ import annotations

import re

WORDS = re.compile(r"\[:(\d+)w\]")

# The columns every per-layer row starts with (layer_row): where it comes from (model, revision, layer, its depth, d,
# the extraction's fingerprint) and extraction_columns' settings. An analysis reading the pooled extraction may not
# declare one as its own (registry.register refuses it): its value would overwrite the row's provenance.
PROVENANCE_COLUMNS = (
    "model",
    "revision",
    "layer",
    "layer_index",
    "relative_depth",
    "d",
    "fingerprint",
    "step",
    "corpus",
    "corpus_fingerprint",
    "n",
    "seq_len",
    "pool",
    "skip_first",
    "max_words",
    "raygeom_version",
    "source",
)


def extraction_columns(info: dict) -> dict:
    """model, revision, step, corpus and its fingerprint, n, seq_len, pool, skip_first, max_words, raygeom version;
    for vectors written with raygeom.write_activations also ``source``, where they came from."""
    from raygeom import __version__

    settings = info.get("settings") or {}
    corpus = info.get("corpus")
    words = WORDS.search(corpus or "")
    return {
        "step": info.get("step"),
        "corpus": corpus,
        "corpus_fingerprint": info.get("corpus_fingerprint"),
        "n": info.get("n_samples"),
        "seq_len": settings.get("seq_len"),
        "pool": settings.get("pool"),
        "skip_first": settings.get("skip_first"),
        "max_words": int(words.group(1)) if words else None,
        "raygeom_version": __version__,
        **({"source": info["source"]} if info.get("source") else {}),
    }


def layer_row(model: str, revision: str, layer: str, info: dict) -> dict:
    """The columns every per-layer row starts with: where it comes from and the settings that made it."""
    from raygeom.sources import layers

    names = info["all_layers"]
    return {
        "model": model,
        "revision": revision,
        "layer": layer,
        "layer_index": layers.index(names, layer),
        "relative_depth": layers.relative_depth(names, layer),
        "d": info["d"],
        "fingerprint": info.get("fingerprint"),
        **extraction_columns(info),
    }
