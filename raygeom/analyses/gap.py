"""The dispersion gap G of each (model, revision) at one layer (Representation dispersion, checkpoint selection):
the mean cosine distance among the representations that predict a domain token set (digits, by default) minus that
among the rest, with its bootstrap interval over chunks, the sides' dispersions, perplexity and bits per byte.
Candidates are ranked by G, largest first (what `raygeom select` prints); rows of the chunk extraction that
token_dispersion and slices read, so a job listing them makes one forward pass."""

from __future__ import annotations

from dataclasses import dataclass

from raygeom.analyses.registry import Analysis, param, register
from raygeom.analyses.token_dispersion import (
    ChunkExtractionParams,
    check_model,
    chunk_reads,
    chunks_extracted,
    chunks_per_domain,
    chunks_per_model,
    extraction_of,
    full_corpus,
)
from raygeom.params import MAX_BOOT


@dataclass(frozen=True)
class GapParams(ChunkExtractionParams):
    layer: str = param("final_norm", "Layer whose gap is measured.", nonempty=True)
    n_boot: int = param(
        1000,
        "Bootstrap draws of G's interval over chunks (at least 100, so that each 2.5 % tail holds a few draws).",
        low=100,
        high=MAX_BOOT,
    )


@register
class DispersionGap(Analysis):
    """Rank checkpoints or models by the dispersion gap G (domain-token minus generic positions), label-free; G with its 95 % bootstrap interval over chunks."""

    name = "gap"
    version = 2
    Params = GapParams
    title = "Dispersion gap G"
    command = "select"
    extraction = "chunks"
    results = "dispersion_gap"
    # results/dispersion_gap.parquet accumulates every stored unit; the ranking of one job's candidates is
    # results/dispersion_select.parquet (rank 1 = largest G), as `raygeom select` writes it.
    columns = (
        "layer",
        "gap",
        "gap_se",
        "gap_lo",
        "gap_hi",
        "domain_dispersion",
        "generic_dispersion",
        "n_domain",
        "n_generic",
        "perplexity",
        "bits_per_byte",
        "gap_warning",
        "chunk_len",
        "chunks_per_domain",
        "domain_tokens",
    )
    series = ("chunk_len", "chunks_per_domain", "domain_tokens")

    def console(self, rows, store=None):
        """The ranking: G with its interval, the sides and perplexity per candidate; a warning per thin domain side."""
        if not rows:
            return []

        def cell(value):
            return f"{value:.4g}" if isinstance(value, float) else str(value)

        first = rows[0]
        columns = [
            "rank",
            "model",
            "revision",
            "G [95%]",
            "gap_se",
            "domain_dispersion",
            "generic_dispersion",
            "n_domain",
            "n_generic",
            "perplexity",
            "bits_per_byte",
        ]
        lines = [
            f"dispersion gap at {first['layer']}, domain tokens: {first.get('domain_tokens')} (interval: bootstrap "
            f"over chunks; bits per byte compare across tokenizers)",
            "",
            "| " + " | ".join(columns) + " |",
            "|" + "---|" * len(columns),
        ]
        for row in rows:
            known = all(isinstance(row.get(c), float) and row[c] == row[c] for c in ("gap", "gap_lo", "gap_hi"))
            shown = {
                **row,
                "G [95%]": f"{row['gap']:+.3f} [{row['gap_lo']:+.3f}, {row['gap_hi']:+.3f}]" if known else cell(row.get("gap")),
            }
            lines.append("| " + " | ".join(cell(shown.get(c, "")) for c in columns) + " |")
        lines.append("")
        return lines + [
            f"warning: {row['model']}@{row['revision']}: {row['gap_warning']}" for row in rows if row.get("gap_warning")
        ]

    def check(self, params: GapParams, info: dict, model: str) -> None:
        check_model(params, params.layer, info, model)

    def chunk_counts(self, params, corpus):
        return chunks_per_domain(params, corpus)

    def reads(self, params, job):
        return chunk_reads(params, job)

    def extracted(self, store, job, spec, params):
        return chunks_extracted(store, job, spec, params)

    def run(self, store, job, specs, params: GapParams, progress):
        from raygeom.analyses import dispersion as dp

        corpus = full_corpus(job)
        per_model = chunks_per_model(params, corpus)
        extraction = extraction_of(params, job.layers)
        with dp.handover() as replicas:  # the chunk extraction first, with its progress (rank_by_gap reuses it)
            for spec in specs:
                dp.extract_unit(
                    store,
                    spec,
                    corpus,
                    extraction,
                    progress(f"chunks pass, {spec.name}@{spec.revision}", per_model),
                    replicas=replicas,
                )
        return dp.rank_by_gap(store, specs, corpus, extraction, params.layer, params.n_boot, progress(f"{self.name} units", None))

    def planned_units(self, store, job, specs, params: GapParams):
        from raygeom.analyses import dispersion as dp

        corpus, extraction = full_corpus(job), extraction_of(params, job.layers)
        keys = [dp.gap_key(dp.unit_key(spec, corpus, extraction), params.layer, params.n_boot, params.seed) for spec in specs]
        return len(keys), sum(store.has_result("dispersion_gap", key) for key in keys)
