"""Cross-model convergence (Subspace PGA across models): for every pair of the job's models and every pair of their
layers, how well each model's top-k readout subspace of W_U preserves the distance structure the two models share
(Spearman), as a z-score against random k-dim subspaces, with its interval and p-values (raygeom.analyses.converge
does the work). Its extraction is its own ("aligned"): every text is first cut where all the models' tokenizers
still read it whole within seq_len, so each model pools the last token of exactly the same text."""

from __future__ import annotations

from dataclasses import dataclass

from raygeom.analyses.registry import Analysis, Params, Reads, param, register
from raygeom.params import MAX_COUNT, MAX_NULLS, MAX_WIDTH


@dataclass(frozen=True)
class ConvergenceParams(Params):
    k: int = param(100, "Readout subspace dimension (k < d of each model).", low=1, high=MAX_WIDTH)
    r: int = param(1, "Top principal components removed after centring (CCR-r).", low=0, flag="--ccr", high=MAX_WIDTH)
    n_null: int = param(100, "Random subspaces in the null.", low=2, high=MAX_NULLS)
    seed: int = param(0, "Seed of the nulls.", low=0, high=2**32, high_open=True)
    null_chunks: int = param(10, "Ray tasks the nulls of one pair are split into.", low=1, high=10_000)
    depths: int = param(
        0, "Compare only the layers nearest this many (>= 2) evenly spaced relative depths; 0: every layer.", low=0, high=10_000
    )
    text_halves: int = param(
        10, "Half-samples of the texts behind each cell's interval over texts (0: none, else >= 2).", low=0, high=1000
    )
    max_words: int = param(
        0,
        "Cut every text to its first N words before tokenizing, so models with different "
        "tokenizers read the same text; 0: no cut.",
        low=0,
        high=MAX_COUNT,
    )

    def __post_init__(self):
        super().__post_init__()
        if self.depths == 1:
            from raygeom.errors import RaygeomError

            raise RaygeomError("depths must be 0 (every layer) or at least 2, got 1")
        if self.text_halves == 1:
            from raygeom.errors import RaygeomError

            raise RaygeomError("text_halves must be 0 (no interval over texts) or at least 2, got 1")


def _converge_params(params: ConvergenceParams):
    from raygeom.analyses.converge import ConvergeParams

    return ConvergeParams(
        k=params.k,
        r=params.r,
        n_null=params.n_null,
        seed=params.seed,
        null_chunks=params.null_chunks,
        depths=params.depths or None,
        text_halves=params.text_halves,
    )


def _aligned(job, specs, params: ConvergenceParams, corpus=None):
    """The job's sample (or ``corpus``), cut at max_words, then where every model's tokenizer reads it whole."""
    from raygeom.analyses.extraction import aligned_corpus
    from raygeom.sources.corpus import load_corpus, truncate_words

    sample = corpus if corpus is not None else load_corpus(job.corpus).sample(job.n_samples, job.sample_seed)
    return aligned_corpus(specs, truncate_words(sample, params.max_words or None), job.extraction.seq_len)[0]


def _check_count(models) -> None:
    if len(models) < 2:
        from raygeom.errors import RaygeomError

        raise RaygeomError(
            f"convergence needs at least two models (or revisions) in the job; got {len(models)}; converge compares models"
        )


@register
class Convergence(Analysis):
    """Cross-model convergence for every pair of models and every pair of layers: full space, readout subspaces, random subspaces."""

    name = "convergence"
    version = 1
    Params = ConvergenceParams
    title = "Cross-model convergence"
    command = "converge"
    extraction = "aligned"
    results = "converge"
    columns = (
        "model_a",
        "revision_a",
        "model_b",
        "revision_b",
        "layer_a",
        "layer_b",
        "z",
        "z_lo",
        "z_hi",
        "k",
        "r",
        "n",
        "n_null",
    )
    series = ("k", "r", "n_null")

    def console(self, rows, store=None):
        from raygeom.analyses.converge import convergence_markdown, pairs

        return [convergence_markdown(group) for group in pairs(rows).values()]

    def documents(self, rows):
        return {"converge.md": "\n".join(self.console(rows))} if rows else {}

    def check_job(self, params, job) -> None:
        # a run directory's revisions are its checkpoints: known only when the job runs, so run() checks again
        if not any(entry.run_dir for entry in job.models):
            _check_count({(entry.source, revision) for entry in job.models for revision in entry.revisions})

    def reads(self, params: ConvergenceParams, job) -> Reads:
        # The pooled extraction, on texts every model reads whole: the job's other pooled analyses read them too.
        cut = f", cut at max_words={params.max_words}" if params.max_words else ""
        return Reads(texts=("aligned", params.max_words), why=f"texts every model reads whole (aligned across models{cut})")

    def pooled_corpus(self, params, job, specs, corpus):
        return _aligned(job, specs, params, corpus)

    def run(self, store, job, specs, params: ConvergenceParams, progress):
        from raygeom.analyses import converge
        from raygeom.analyses.extraction import extract_models, texts_of

        converge_params = _converge_params(params)
        _check_count(specs)
        corpus = texts_of(self, params, job, specs)
        infos = extract_models(store, specs, corpus, job.extraction, job.layers, progress=progress)
        models = [(spec.slug, spec.revision, info["key"]) for spec, info in infos]
        sides = converge.model_sides(store, models, converge_params)
        advance = progress("convergence", converge.units([len(s.layers) for s in sides], converge_params))
        return converge.run_converge(store, models, converge_params, progress=advance)

    def planned_units(self, store, job, specs, params: ConvergenceParams):
        from raygeom.analyses import converge
        from raygeom.replica.request import READOUT_COMPONENTS, extraction_key

        corpus = _aligned(job, specs, params)
        models = [
            (s.slug, s.revision, extraction_key(s, corpus.fingerprint(), job.extraction, job.layers, READOUT_COMPONENTS))
            for s in specs
        ]
        return converge.planned_pairs(store, models, _converge_params(params))
