"""Token-level dispersion of each layer over the corpus's chunks (Representation dispersion; raygeom.analyses.dispersion
does the work): the mean pairwise cosine distance of the token vectors inside a chunk, averaged over chunks, with its
Student-t interval over the chunks; the sample level of the pooled chunk vectors with its jackknife interval; and how
dispersion follows perplexity, over perplexity groups (the authors' protocol) and over single chunks, each with a
bootstrap interval.

Its extraction is its own ("chunks": a replica cuts the corpus into chunks per domain and keeps every token's
vector summaries); `slices` and `gap` read the same one, so a job listing all three makes one forward pass."""

from __future__ import annotations

from dataclasses import dataclass

from raygeom.analyses.registry import Analysis, Metric, Reads, param, register
from raygeom.params import MAX_BOOT, MAX_COUNT, MAX_SEED, ChunkSettings


@dataclass(frozen=True)
class ChunkExtractionParams(ChunkSettings):
    """The chunk extraction: what token_dispersion, slices and gap read (the same settings share one)."""

    seed: int = param(0, "Seed of the chunk sample, the k-means slices and the bootstraps.", low=0, high=MAX_SEED)


@dataclass(frozen=True)
class ChunkParams(ChunkExtractionParams):
    """The chunk extraction and the analysis of its layers (shared by token_dispersion and slices)."""

    group_size: int = param(20, "Chunks per perplexity group.", low=1, high=MAX_COUNT)
    n_groups: int = param(100, "Most perplexity groups (a correlation over groups needs 3).", low=3, high=MAX_COUNT)
    n_slices: int = param(8, "k-means difficulty slices (a rank agreement needs 3).", low=3, high=10_000)
    gap_layer: str = param("final_norm", "Layer whose dispersion gap G every row carries.", nonempty=True)
    n_boot: int = param(1000, "Bootstrap draws of every interval (100 at least, as kNN-LM's).", low=100, high=MAX_BOOT)


SERIES = ("chunk_len", "chunks_per_domain", "domain_tokens", "group_size", "n_slices")
# The settings every layer row carries (batch_size changes no number; n_groups is stored as the most groups asked for).
SETTING_COLUMNS = (
    "chunk_len",
    "chunks_per_domain",
    "domain_tokens",
    "group_size",
    "n_groups_max",
    "n_slices",
    "gap_layer",
    "n_boot",
    "seed",
)


def extraction_of(params: ChunkExtractionParams, layers: str):
    """The dispersion module's extraction settings of ``params`` on the job's layer selection."""
    from raygeom.analyses import dispersion as dp

    return dp.DispersionSettings(
        params.chunk_len, params.chunks_per_domain, params.batch_size, layers, params.domain_tokens, params.seed
    )


def settings_of(params: ChunkParams, layers: str):
    """The dispersion module's (extraction, analysis) settings of ``params`` on the job's layer selection."""
    from raygeom.analyses import dispersion as dp

    return extraction_of(params, layers), dp.AnalysisSettings(
        params.group_size, params.n_groups, params.n_slices, params.gap_layer, params.n_boot
    )


def check_model(params: ChunkExtractionParams, gap_layer: str, info: dict, model: str) -> None:
    """The chunk length against the model's context and the job's layers against the gap layer, from its config."""
    from raygeom.analyses import dispersion as dp

    dp.check_model(info.get("config"), info.get("layers") or "all", params.chunk_len, gap_layer, model)


def chunk_reads(params: ChunkExtractionParams, job) -> Reads:
    """The chunk extraction's pass: analyses of the same chunk settings share it."""
    return Reads(
        "chunks",
        settings=extraction_of(params, job.layers),
        why=f"token states of {params.chunks_per_domain} chunks of {params.chunk_len} tokens per domain",
    )


def chunks_extracted(store, job, spec, params: ChunkExtractionParams) -> bool:
    from raygeom.analyses import dispersion as dp

    return dp.is_extracted(store, spec, full_corpus(job), extraction_of(params, job.layers))


def full_corpus(job):
    from raygeom.sources.corpus import load_corpus

    return load_corpus(job.corpus)


def chunks_per_model(params: ChunkExtractionParams, corpus) -> int:
    """How many chunks the extraction asks of each (model, revision): chunks_per_domain for every label."""
    return params.chunks_per_domain * len(set(corpus.labels or ["all"]))


def run_chunks(store, job, specs: list, params: ChunkParams, progress, name: str) -> list[dict]:
    """Chunk extraction of every (model, revision), then one engine unit each: this job's layer rows."""
    from raygeom.analyses import dispersion as dp

    extraction, analysis = settings_of(params, job.layers)
    corpus = full_corpus(job)
    per_model = chunks_per_model(params, corpus)
    analysis.check_against(per_model, corpus.texts)
    result = dp.run_dispersion(
        store,
        specs,
        corpus,
        extraction,
        analysis,
        lambda label, _: progress(f"chunks pass, {label}", per_model),
        progress(f"{name} units", None),
    )
    return result["layers"]


def chunk_units(store, job, specs: list, params: ChunkParams) -> tuple[int, int]:
    """One unit per (model, revision); done when its stored rows exist."""
    from raygeom.analyses import dispersion as dp

    extraction, analysis = settings_of(params, job.layers)
    corpus = full_corpus(job)
    keys = [dp.analysis_key(dp.unit_key(spec, corpus, extraction), analysis, params.seed) for spec in specs]
    return len(keys), sum(store.has_result("dispersion_layers", key) for key in keys)


def chunks_per_domain(params, corpus) -> list[tuple]:
    """A chunk analysis's one count the corpus bounds (:meth:`Analysis.chunk_counts`): chunks_per_domain of every
    labelled domain."""
    return [("chunks_per_domain", params.chunks_per_domain, params.chunk_len, params.seed, corpus.texts, corpus.labels, "")]


class ChunkAnalysis(Analysis):
    """An analysis of the chunk extraction's layer rows."""

    Params = ChunkParams
    command = "dispersion"
    extraction = "chunks"
    results = "dispersion_layers"
    series = SERIES

    def check_job(self, params, job) -> None:
        """Sizes that can only give NaN group correlations or no slices, and a corpus too repetitive to rank."""
        if job.corpus_pending:
            return
        corpus = full_corpus(job)
        settings_of(params, job.layers)[1].check_against(chunks_per_model(params, corpus), corpus.texts)

    def check(self, params: ChunkParams, info: dict, model: str) -> None:
        check_model(params, params.gap_layer, info, model)

    def chunk_counts(self, params, corpus):
        return chunks_per_domain(params, corpus)

    def reads(self, params, job):
        return chunk_reads(params, job)

    def extracted(self, store, job, spec, params):
        return chunks_extracted(store, job, spec, params)

    def run(self, store, job, specs, params, progress):
        return run_chunks(store, job, specs, params, progress, self.name)

    def planned_units(self, store, job, specs, params):
        return chunk_units(store, job, specs, params)


@register
class TokenDispersion(ChunkAnalysis):
    """Dispersion vs perplexity per model, layer and domain: token and sample level, group protocol, slices, gap,
    each correlation with a 95 % bootstrap interval; bits per byte beside perplexity."""

    name = "token_dispersion"
    version = 3
    tables = {name: f"dispersion_{name}" for name in ("layers", "slices", "groups", "domains")}
    title = "Token-level dispersion"
    columns = (
        "token_dispersion",
        "token_dispersion_lo",
        "token_dispersion_hi",
        "sample_dispersion",
        "sample_dispersion_lo",
        "sample_dispersion_hi",
        "perplexity",
        "bits_per_byte",
        "n_chunks",
        "group_spearman",
        "group_spearman_lo",
        "group_spearman_hi",
        "chunk_spearman",
        "chunk_spearman_lo",
        "chunk_spearman_hi",
        *SETTING_COLUMNS,
    )
    metrics = (
        Metric("token_dispersion", "token dispersion", "token_dispersion_lo", "token_dispersion_hi"),
        Metric("sample_dispersion", "sample dispersion (chunks)", "sample_dispersion_lo", "sample_dispersion_hi"),
        Metric("group_spearman", "Spearman(dispersion, perplexity) over groups", "group_spearman_lo", "group_spearman_hi"),
        Metric("chunk_spearman", "Spearman(dispersion, perplexity) over chunks", "chunk_spearman_lo", "chunk_spearman_hi"),
    )
