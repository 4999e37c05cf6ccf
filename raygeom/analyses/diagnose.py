"""diagnose: per-layer diagnostics of one pooled extraction with per-sample NLL, as one registered analysis
(``raygeom diagnose``, ``[analyses.diagnostics]``): z at several CCR ranks, spectral metrics, PC1 readout share, the
loss against the per-sample readout share, linear probes (raygeom.analyses.diagnostics does the work). One merged row
per layer; its parts are results/diagnostics_{spectral,sample_geometry,pga,probe,samples}.parquet."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raygeom.analyses.convergence import ConvergenceParams
from raygeom.analyses.diagnostics import SPECTRAL_COLUMNS
from raygeom.analyses.probe import ProbeParams, require_labels
from raygeom.analyses.registry import Analysis, Metric, Needs, Params, Reads, param, register
from raygeom.errors import RaygeomError
from raygeom.params import MAX_WIDTH, PGAParams, declared_as, key_settings, number_list

Z_METRICS = (  # (column, label, log scale)
    ("rankme", "RankMe", False),
    ("alpha_req", "alpha-ReQ", False),
    ("condition_number", "condition number", True),
    ("isotropy", "isotropy (Mu & Viswanath)", False),
    ("pc1_readout_share", "PC1 readout share", False),
    ("probe_accuracy", "probe accuracy", False),
)


@dataclass(frozen=True)
class DiagnoseParams(Params):
    """diagnose's settings: PGA's (one declaration each) at several CCR ranks, the per-sample share's rank, probes."""

    ccr_ranks: str = param(
        "0,1,5,10",
        "CCR ranks of the restoration analysis.",
        rule=number_list(low=0, high=MAX_WIDTH, integers=True),
        nonempty=True,
    )
    k: int = declared_as(PGAParams, "k")
    n_null: int = declared_as(PGAParams, "n_null")
    null_chunks: int = declared_as(PGAParams, "null_chunks")
    seed: int = declared_as(PGAParams, "seed")
    z_half_width: float = declared_as(PGAParams, "z_half_width")
    z_rel_width: float = declared_as(PGAParams, "z_rel_width")
    n_null_cap: int = declared_as(PGAParams, "n_null_cap")
    n_null_decide: int = declared_as(PGAParams, "n_null_decide")
    sample_ccr: int = param(1, "CCR rank of the per-sample readout share set beside loss.", low=0, high=MAX_WIDTH)
    probe: bool = param(True, "Linear probes on the corpus labels.")
    probe_test_fraction: float = declared_as(ProbeParams, "test_fraction", flag="--probe-test-fraction")
    max_words: int = declared_as(ConvergenceParams, "max_words")
    n_null_auto: bool = False  # n_null = 'auto' (PGAParams.normalise)

    normalise = classmethod(PGAParams.normalise.__func__)

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted({int(float(part)) for part in self.ccr_ranks.split(",") if part.strip()}))

    def for_run(self):
        from raygeom.analyses.diagnostics import DiagnosticsParams

        return DiagnosticsParams(
            k=self.k,
            ccr_ranks=self.ranks,
            n_null=self.n_null,
            null_chunks=self.null_chunks,
            seed=self.seed,
            sample_ccr=self.sample_ccr,
            probe=self.probe,
            probe_test_fraction=self.probe_test_fraction,
            n_null_auto=self.n_null_auto,
            z_half_width=self.z_half_width,
            z_rel_width=self.z_rel_width,
            n_null_cap=self.n_null_cap,
            n_null_decide=self.n_null_decide,
        )


SETTING_COLUMNS = ("ccr_ranks", "sample_ccr", "seed", "n_null")


@register
class Diagnose(Analysis):
    """Per-layer diagnostics: z at several CCR ranks, spectral metrics, PC1 readout share, loss beside geometry, probes."""

    name = "diagnostics"
    version = 1
    Params = DiagnoseParams
    title = "Diagnostics"
    command = "diagnose"
    needs = Needs(nll=True)
    # Its own extraction: the job's pooled one, with the per-sample NLL (the full-vocabulary LM head).
    extraction = "pooled_nll"
    results = "diagnostics_layers"
    columns = (*SPECTRAL_COLUMNS, "loss_share_spearman", "loss_share_spearman_lo", "loss_share_spearman_hi", *SETTING_COLUMNS)
    # What only diagnose measures: the z, spectral and probe rows it writes are drawn in their own analyses' sections.
    metrics = (
        Metric("pc1_readout_share", "PC1 readout share", chance="pc1_readout_chance"),
        Metric("loss_share_spearman", "Spearman(loss, readout share)", "loss_share_spearman_lo", "loss_share_spearman_hi"),
    )
    series = ("k", "ccr_ranks", "sample_ccr")

    def check(self, params: DiagnoseParams, info: dict, model: str) -> None:
        d = info.get("d")
        if d is not None and not 0 < params.k < d:
            raise RaygeomError(f"k must satisfy 0 < k < d; got k={params.k}, d={d} for {model}")

    def check_job(self, params: DiagnoseParams, job) -> None:
        if params.probe and not job.corpus_pending:
            require_labels(job.corpus, "--no-probe")

    def reads(self, params: DiagnoseParams, job) -> Reads:
        # The pooled extraction with per-sample NLL: the job's pooled pass, unless its texts are cut at max_words.
        if not params.max_words:
            return Reads()
        return Reads(texts=("words", params.max_words), why=f"texts cut at max_words={params.max_words}", shared=False)

    def pooled_corpus(self, params: DiagnoseParams, job, specs, corpus):
        from raygeom.sources.corpus import truncate_words

        return truncate_words(corpus, params.max_words or None)

    def run(self, store, job, specs, params: DiagnoseParams, progress):
        import pyarrow as pa

        from raygeom.analyses import diagnostics
        from raygeom.analyses.extraction import extract_models, texts_of
        from raygeom.store.tree import atomic_write_table, content_key

        run_params = params.for_run()
        corpus = texts_of(self, params, job, specs)
        infos = extract_models(store, specs, corpus, job.extraction, job.layers, nll=True, progress=progress)
        merged, samples, parts = [], [], {"spectral": [], "sample_geometry": [], "pga": [], "probe": []}
        for spec, info in infos:
            advance = progress(f"diagnose {spec.name}@{spec.revision}", diagnostics.units(info["layers"], run_params))
            result = diagnostics.run_diagnostics(
                store, spec.slug, spec.revision, info["layers"], run_params, progress=advance, key=info["key"]
            )
            settings = {"ccr_ranks": params.ccr_ranks, "sample_ccr": params.sample_ccr, "seed": params.seed}
            nulls = "auto" if params.n_null_auto else str(params.n_null)
            merged += [
                {
                    **row,
                    **settings,
                    "n_null": nulls,
                    "unit_key": content_key(self.name, self.version, info["key"], row["layer"], *key_settings(params)),
                }
                for row in result["layers"]
            ]
            for name in parts:
                parts[name] += result[name]
            samples += diagnostics.read_sample_rows(
                store, spec.slug, spec.revision, info["layers"], params.k, params.sample_ccr, info["key"]
            )
        results = store.root / "results"
        for name, rows in [*parts.items(), ("samples", samples)]:
            if rows or name == "samples":
                atomic_write_table(pa.Table.from_pylist(rows), results / f"diagnostics_{name}.parquet")
        return merged

    def planned_units(self, store, job, specs, params):
        """One merged unit per (model, revision), done when its extraction is stored and the merged table holds a row
        of every layer of it at these settings (a run merges them again from their stored parts, computing nothing)."""
        from raygeom.analyses.extraction import texts_of
        from raygeom.replica.request import ExtractionRequest
        from raygeom.store.tree import content_key, read_table

        path = store.root / "results" / f"{self.results_dir}.parquet"
        if not path.is_file():
            return len(specs), 0
        table = read_table(path)
        merged = set(table.column("unit_key").to_pylist()) if "unit_key" in table.column_names else set()
        corpus, done = texts_of(self, params, job, specs), 0
        for spec in specs:
            key = ExtractionRequest(spec, corpus, job.extraction, job.layers, nll=True).key()
            info = store.completion(spec.slug, spec.revision, key)
            layers = (info or {}).get("layers") or []
            done += bool(layers) and all(
                content_key(self.name, self.version, key, layer, *key_settings(params)) in merged for layer in layers
            )
        return len(specs), done

    def console(self, rows, store=None):
        return [rows_markdown(rows)] if rows else []

    def documents(self, rows):
        return {"diagnostics.md": rows_markdown(rows)} if rows else {}


def _fmt(value, spec=".3f") -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    return format(value, spec)


def _z_cell(row: dict, rank: int) -> str:
    """z at CCR-rank with the 95 % half-width of its Monte-Carlo interval."""
    z, half = row.get(f"z_ccr{rank}"), row.get(f"z_half_width_ccr{rank}")
    return _fmt(z, "+.1f") + (f" ± {half:.1f}" if half is not None and half == half else "")


def _probe_cell(row: dict) -> str:
    low, high = row.get("probe_accuracy_lo"), row.get("probe_accuracy_hi")
    return _fmt(row.get("probe_accuracy")) + (f" ({low:.2f}-{high:.2f})" if low is not None else "")


def diagnostics_markdown(rows: list[dict], ranks: tuple[int, ...], params) -> str:
    from raygeom.numerics.layer_geometry import blindness_summary

    lines = []
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(f"{row['model']}@{row['revision']}", []).append(row)
    for label, group in groups.items():
        group = sorted(group, key=lambda r: r["layer_index"])
        first = group[0]
        nulls = (
            "nulls: auto, z ± 95% half-width"
            if getattr(params, "n_null_auto", False)
            else f"{params.n_null} nulls, z ± 95% half-width"
        )
        lines += [f"### {label}  (d={first['d']}, N={first['n']}, k={first['k']}, {nulls}, seed {params.seed})", ""]
        header = (
            ["layer", "depth"]
            + [f"z CCR-{r}" for r in ranks]
            + ["RankMe", "alpha-ReQ", "cond", "isotropy", "PC1 share (k/d)", "PC1 var", "probe acc", "loss~share rho"]
        )
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in group:
            cells = (
                [r["layer"], _fmt(r["relative_depth"], ".2f")]
                + [_z_cell(r, c) for c in ranks]
                + [
                    _fmt(r["rankme"], ".1f"),
                    _fmt(r["alpha_req"], ".2f"),
                    _fmt(r["condition_number"], ".3g"),
                    _fmt(r["isotropy"], ".3g"),
                    f"{_fmt(r['pc1_readout_share'])} ({r['pc1_readout_chance']:.3f})",
                    _fmt(r["pc1_variance_fraction"]),
                    _probe_cell(r),
                    _fmt(r.get("loss_share_spearman"), "+.2f"),
                ]
            )
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines += [
            f"CCR restoration (layers with z > 2 and z < -2, out of {len(group)}):",
            "",
            "| CCR-r | z > 2 | z < -2 | median z | min z (layer) | max z (layer) |",
            "|---|---|---|---|---|---|",
        ]
        for c in ranks:
            zs = np.array([r.get(f"z_ccr{c}", np.nan) for r in group])
            if not np.isfinite(zs).any():
                continue
            low, high = int(np.nanargmin(zs)), int(np.nanargmax(zs))
            lines.append(
                f"| {c} | {int(np.sum(zs > 2))} | {int(np.sum(zs < -2))} | {np.nanmedian(zs):+.1f} | "
                f"{zs[low]:+.1f} ({group[low]['layer']}) | {zs[high]:+.1f} ({group[high]['layer']}) |"
            )
        lines.append("")
        z_rank = 1 if 1 in ranks else ranks[0]
        z = [r.get(f"z_ccr{z_rank}", np.nan) for r in group]
        accuracy = np.array([r.get("probe_accuracy", np.nan) for r in group])
        negative = np.array(z) < -2
        if np.isfinite(accuracy).any():
            chance = np.nanmean([r.get("probe_chance", np.nan) for r in group])
            inside = f"{np.nanmean(accuracy[negative]):.3f}" if negative.any() else "-"
            outside = f"{np.nanmean(accuracy[~negative]):.3f}" if (~negative).any() else "-"
            lines += [
                f"Probe accuracy (majority class {chance:.3f}): mean {inside} over the {int(negative.sum())} layers "
                f"with z < -2 at CCR-{z_rank}, {outside} over the other {int((~negative).sum())}.",
                "",
            ]
        lines += [
            f"Spectral blindness over these layers, against z at CCR-{z_rank} (z range = max - min of z; "
            "relative range = (max - min) / median of the metric):",
            "",
            "| metric | z range | metric relative range | Spearman with z |",
            "|---|---|---|---|",
        ]
        for column, label_, _ in Z_METRICS:
            values = [r.get(column, np.nan) for r in group]
            try:
                summary = blindness_summary(z, values)
            except RaygeomError:
                continue
            lines.append(
                f"| {label_} | {summary['z_range']:.1f} | {summary['metric_relative_range']:.3g} | {_fmt(summary['spearman_with_z'], '+.2f')} |"
            )
        lines.append("")
    return "\n".join(lines)


def rows_markdown(rows: list[dict]) -> str:
    """:func:`diagnostics_markdown` of merged rows, their ranks and null settings read from the rows."""
    from types import SimpleNamespace

    ranks = tuple(sorted({int(c[len("z_ccr") :]) for row in rows for c in row if c.startswith("z_ccr")}))
    nulls = str(rows[0].get("n_null", ""))
    settings = SimpleNamespace(
        n_null_auto=nulls == "auto", n_null=int(nulls) if nulls.isdigit() else nulls, seed=rows[0].get("seed")
    )
    return diagnostics_markdown(rows, ranks, settings)
