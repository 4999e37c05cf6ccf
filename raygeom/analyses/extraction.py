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


ALIGNED_VERSION = 1  # of the cut the cache records; bump when common_prefix cuts differently
_ALIGNED: dict[str, tuple] = {}  # this process's cuts by key


def _tokenizer_identity(spec) -> list:
    """What a model's tokenizer is, without loading it: a hub revision by the commit the local HF cache resolves it
    to; a built-in by its name; a local folder, .gguf file or checkpoint by the size and time of its files."""
    from pathlib import Path

    if spec.kind == "builtin":
        return [spec.kind, spec.source]
    if spec.kind == "hub":
        from raygeom.sources.download import cache_root

        ref = cache_root() / f"models--{spec.source.replace('/', '--')}" / "refs" / spec.revision
        return [spec.kind, spec.source, spec.revision, ref.read_text().strip() if ref.is_file() else None]
    where = Path(spec.path if spec.kind == "checkpoint" else spec.source)
    files = (
        [where]
        if where.is_file()
        else sorted(p for p in where.parent.glob("*") if p.is_file()) + sorted(p for p in where.glob("*") if p.is_file())
    )
    return [spec.kind, str(where), spec.revision, [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]]


def _aligned_file(key: str):
    from raygeom.sources.models import cache_dir

    return cache_dir() / "aligned" / f"{key}.json"


def aligned_corpus(specs: list, corpus, seq_len: int):
    """``corpus`` cut at the longest character prefix every tokenizer reads within ``seq_len``; (corpus, n cut).

    The cut depends only on the texts, the tokenizers and seq_len, and finding it loads every tokenizer (tens of
    seconds for a built-in GGUF's): it is computed once and kept, in this process and as the kept lengths of the texts
    in ``$RAYGEOM_CACHE/aligned/<key>.json``, so `status` and `plan` of a job that compares models read it back."""
    import json
    import os

    from raygeom.sources.corpus import Corpus
    from raygeom.store.tree import content_key

    key = content_key("aligned", ALIGNED_VERSION, corpus.fingerprint(), seq_len, [_tokenizer_identity(s) for s in specs])
    if key not in _ALIGNED:
        path = _aligned_file(key)
        try:
            kept = json.loads(path.read_text())
            lengths, n_cut = kept["lengths"], kept["cut"]
            if len(lengths) != len(corpus.texts) or not all(0 < n <= len(t) for n, t in zip(lengths, corpus.texts)):
                raise ValueError("another sample")
            _ALIGNED[key] = (
                Corpus(f"{corpus.name}[aligned@{seq_len}]", [t[:n] for t, n in zip(corpus.texts, lengths)], corpus.labels),
                n_cut,
            )
        except (OSError, ValueError, KeyError, TypeError):
            from raygeom.sources.align import common_prefix
            from raygeom.sources.models import load_tokenizer

            tokenizers = {f"{spec.name}@{spec.revision}": load_tokenizer(spec) for spec in specs}
            _ALIGNED[key] = common_prefix(corpus, tokenizers, seq_len)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                staging = path.with_name(f".{path.name}.{os.getpid()}")
                staging.write_text(json.dumps({"lengths": [len(t) for t in _ALIGNED[key][0].texts], "cut": _ALIGNED[key][1]}))
                os.replace(staging, path)
            except OSError:  # a read-only cache only means the next process finds the cut again
                pass
    aligned, n_cut = _ALIGNED[key]
    return Corpus(aligned.name, list(aligned.texts), aligned.labels), n_cut


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
