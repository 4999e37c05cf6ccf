"""The pooled extraction of several models on one text sample, optionally aligned: every text first cut where all
the models' tokenizers still read it whole within seq_len, so each model pools the last token of the same text
(what cross-model convergence needs). Used by the convergence analysis and the diagnose/converge/probe commands."""

from __future__ import annotations

from typing import Callable


def pooled_reader(job):
    """The planned analysis whose text set the job's pooled pass reads (``Reads.texts``: the first a pooled reader
    names); None: the pass reads the job's sample as it is."""
    for item in job.planned():
        reads = item.spec.reads(item.params, job)
        if reads.kind == "pooled" and reads.texts is not None and reads.shared:
            return item
    return None


def job_sample(job):
    from raygeom.sources.corpus import load_corpus

    return load_corpus(job.corpus).sample(job.n_samples, job.sample_seed)


def pooled_corpus(job, specs: list, corpus=None):
    """The texts of the job's pooled pass, from its sample ``corpus`` (default: the job's): the sample, or the text set
    its pooled pass reads (aligned texts when the job compares models)."""
    corpus = job_sample(job) if corpus is None else corpus
    item = pooled_reader(job)
    return corpus if item is None else item.spec.pooled_corpus(item.params, job, specs, corpus)


def texts_of(analysis, params, job, specs: list):
    """The texts a reader of a pooled extraction extracts: the pooled pass's when it is served by it (its
    ``Reads.texts`` None or the pass's), else its own text set."""
    texts = analysis.reads(params, job).texts
    pooled = pooled_reader(job)
    if texts is None or (pooled is not None and pooled.spec.reads(pooled.params, job).texts == texts):
        return pooled_corpus(job, specs)
    return analysis.pooled_corpus(params, job, specs, job_sample(job))


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
            request = ExtractionRequest(spec, corpus, settings, layers, nll=nll)
            # a stage only for a pass that runs: one the store holds (the job's pooled pass) is read back
            runs = progress is not None and orchestrate.needs_extraction(store, request) is not None
            advance = progress(f"pooled pass, {spec.name}@{spec.revision}", len(corpus.texts)) if runs else None
            infos.append((spec, orchestrate.extract(store, request, progress=advance, replicas=replicas)))
    return infos
