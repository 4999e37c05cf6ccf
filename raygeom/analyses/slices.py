"""Difficulty slices of each layer (Representation dispersion): the chunks cut into slices by domain and by k-means
on their pooled vectors; within each slicing, the Spearman agreement between the slices' dispersion (token and
sample level) and their perplexity, each with a bootstrap interval over chunks. Reads the chunk extraction that
token_dispersion and gap read, and the same engine unit: listing several of them costs one forward pass and one
analysis per (model, revision). The per-slice rows are results/dispersion_slices.parquet."""

from __future__ import annotations

from raygeom.analyses.registry import Metric, register
from raygeom.analyses.token_dispersion import SETTING_COLUMNS, ChunkAnalysis, full_corpus
from raygeom.errors import RaygeomError

MIN_DOMAINS = 3  # a rank agreement across domain slices needs 3 (raygeom.analyses.dispersion._slice_labels)


def _agreement(kind: str, level: str) -> Metric:
    column = f"{kind}_agreement_{level}"
    return Metric(column, f"{kind} slices: Spearman({level} dispersion, perplexity)", f"{column}_lo", f"{column}_hi")


@register
class DifficultySlices(ChunkAnalysis):
    name = "slices"
    version = 3
    title = "Difficulty slices"
    metrics = tuple(_agreement(kind, level) for kind in ("domain", "kmeans") for level in ("token", "sample"))
    columns = (*(c for m in metrics for c in (m.column, m.lo, m.hi)), *SETTING_COLUMNS)

    def check_job(self, params, job) -> None:
        super().check_job(params, job)
        if job.corpus_pending:
            return
        corpus = full_corpus(job)
        # its rows hold the domain slicing's agreement, which a corpus of fewer domains cannot give (its rows then
        # lacked those columns, found only after every unit had run)
        domains = len(set(corpus.labels or []))
        if domains < MIN_DOMAINS:
            raise RaygeomError(
                f"[analyses.slices] slices the chunks by domain and needs a corpus with at least {MIN_DOMAINS} domain "
                f"labels; corpus '{corpus.name}' has {domains}: use a labelled corpus, or token_dispersion"
            )
