"""The pooled extraction of several models on one text sample, optionally aligned: every text first cut where all
the models' tokenizers still read it whole within seq_len, so each model pools the last token of the same text
(what cross-model convergence needs). Used by the convergence analysis and the diagnose/converge/probe commands."""

from __future__ import annotations

from typing import Callable


def aligned_corpus(specs: list, corpus, seq_len: int):
    """``corpus`` cut at the longest character prefix every tokenizer reads within ``seq_len``; (corpus, n cut)."""
    from raygeom.sources.align import common_prefix
    from raygeom.sources.models import load_tokenizer

    tokenizers = {f"{spec.name}@{spec.revision}": load_tokenizer(spec) for spec in specs}
    return common_prefix(corpus, tokenizers, seq_len)


def extract_models(
    store,
    specs: list,
    corpus,
    settings,
    layers: str,
    nll: bool = False,
    progress: Callable[[str, int], Callable[[int], None]] | None = None,
) -> list[tuple]:
    """Each (model, revision) of ``specs`` extracted into ``store`` (a complete matching extraction is reused);
    [(spec, completion info)]. ``progress(label, total)`` gives each model's advance function."""
    from raygeom.engine import orchestrate, replica_actor
    from raygeom.replica.request import ExtractionRequest

    infos = []
    with replica_actor.Handover() as replicas:  # one replica process, handed from each model to the next
        for spec in specs:
            advance = progress(f"extract {spec.name}@{spec.revision}", len(corpus.texts)) if progress else None
            infos.append(
                (
                    spec,
                    orchestrate.extract(
                        store, ExtractionRequest(spec, corpus, settings, layers, nll=nll), progress=advance, replicas=replicas
                    ),
                )
            )
    return infos
