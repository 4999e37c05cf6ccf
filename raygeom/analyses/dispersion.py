"""Ray orchestration of the dispersion analyses: token-level extraction actor -> Parquet -> analyses, plots.

One replica actor (``raygeom.engine.replica_actor``) per (model, revision) holds the model. It cuts the
corpus into chunks (per domain), runs batches of chunks and, from each forward
pass, keeps per chunk and layer the token-level dispersion, the pooled vector
and the chunk's NLL, plus the streaming dispersion gap. Everything goes to the
store under ``dispersion/`` and ``results/dispersion_*``; the per-layer summary
is written last and is what marks a unit complete. The driver then runs the
authors' group protocol, the difficulty slices and the gap from those files.

Call :func:`raygeom.engine.ray_env.prepare_local_ray_environment` before importing
this module when the cluster is local (the CLI does).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
from scipy.stats import pearsonr, spearmanr

from raygeom.report.figures import save_figure as _save
from raygeom.sources.corpus import Corpus
from raygeom.errors import RaygeomError
from raygeom.sources.models import ModelSpec
from raygeom.numerics.dispersion import (dispersion, dispersion_by_slice, kmeans_slices, perplexity_groups,
                                         rank_agreement)
from raygeom.analyses.sweep import select_layers
from raygeom.store.tree import Store, atomic_write_table, column_to_matrix, content_key, read_table, vector_column, verified

DISPERSION_VERSION = 1


@dataclass(frozen=True)
class DispersionSettings:
    chunk_len: int = 512
    chunks_per_domain: int = 40
    batch_size: int = 4
    layers: str = "all"
    domain_tokens: str = "digits"
    seed: int = 0

    def __post_init__(self):
        if self.chunk_len < 2:
            raise RaygeomError(f"chunk-len must be at least 2, got {self.chunk_len}")
        if self.chunks_per_domain < 1 or self.batch_size < 1:
            raise RaygeomError("chunks-per-domain and batch-size must be positive")


@dataclass(frozen=True)
class AnalysisSettings:
    group_size: int = 20  # the authors use 100 over far more chunks; 20 gives 10 groups over the CLI's default 200
    n_groups: int = 100
    n_slices: int = 8
    gap_layer: str = "final_norm"

    def __post_init__(self):
        if self.group_size < 1:
            raise RaygeomError(f"--group-size must be at least 1, got {self.group_size}")
        if self.n_groups < 3:
            raise RaygeomError(f"--n-groups must be at least 3 (a correlation across groups needs 3), got {self.n_groups}")
        if self.n_slices < 3:
            raise RaygeomError(f"--n-slices must be at least 3 (a rank agreement across slices needs 3), got {self.n_slices}")

    def check_against(self, n_chunks: int) -> None:
        """Refuse, before any extraction, sizes that can only give NaN group correlations or no slices."""
        full = n_chunks // self.group_size
        if full < 3:
            raise RaygeomError(f"--group-size {self.group_size} makes {full} full group(s) of the {n_chunks} chunks asked for; "
                               "group correlations need at least 3: lower --group-size or raise --chunks-per-domain")
        if self.n_slices > n_chunks:
            raise RaygeomError(f"--n-slices {self.n_slices} is more than the {n_chunks} chunks asked for; lower it")


def start_worker(spec: ModelSpec, gpus: float | None = None):
    """A replica actor for token-level work (a GPU, else every CPU of a node) and its description,
    whose ``layers`` are the token layers (every layer, then ``attn_last``)."""
    from raygeom.engine import replica_actor

    worker, described = replica_actor.start(spec, gpus)
    return worker, {**described, "layers": described["token_layers"]}


def _get(ref):
    from raygeom.engine import replica_actor

    return replica_actor.get(ref)


def unit_key(spec: ModelSpec, corpus: Corpus, settings: DispersionSettings) -> str:
    return content_key("dispersion", DISPERSION_VERSION, spec.kind, spec.source, spec.revision, corpus.fingerprint(),
                       asdict(settings))


def _paths(store: Store, spec: ModelSpec, key: str) -> dict[str, Path]:
    base = store.root / "dispersion" / f"model={spec.slug}" / f"revision={spec.revision}"
    return {"chunks": base / f"chunks-{key}.parquet", "pooled": base / f"pooled-{key}.parquet",
            "gap": base / f"gap-{key}.parquet", "layers": store.result_path("dispersion_layers", key)}


def _merge_gaps(parts: list[dict]) -> dict[str, dict]:
    merged: dict[str, dict] = {}
    for part in parts:
        for layer, (sums, diagonal, counts) in part.items():
            entry = merged.setdefault(layer, {"sums": {}, "diagonal": {"domain": 0.0, "generic": 0.0},
                                               "counts": {"domain": 0, "generic": 0}})
            for side in ("domain", "generic"):
                if sums[side] is not None:
                    entry["sums"][side] = sums[side] + entry["sums"].get(side, 0)
                entry["diagonal"][side] += diagonal[side]
                entry["counts"][side] += counts[side]
    return merged


def _side(entry: dict, side: str) -> float:
    n = entry["counts"][side]
    if n < 2:
        return float("nan")
    total = entry["sums"][side].double()
    return 1.0 - (float(total @ total) - entry["diagonal"][side]) / (n * (n - 1))


def extract_unit(store: Store, spec: ModelSpec, corpus: Corpus, settings: DispersionSettings,
                 progress: Callable[[int], None] | None = None, gpus: float | None = None) -> dict:
    """Token-level extraction of one (model, revision) into the store; returns the unit's description.

    Skipped when the unit's summary exists. Files of an interrupted run are overwritten.
    """
    key = unit_key(spec, corpus, settings)
    paths = _paths(store, spec, key)
    if store.has_result("dispersion_layers", key) and all(verified(p) for p in paths.values()):
        table = read_table(paths["layers"])
        if progress and table.num_rows:
            progress(int(table["n_chunks"][0].as_py()))
        return {"key": key, "layers": table["layer"].to_pylist(), "cached": True}
    worker, described = start_worker(spec, gpus)
    try:
        selection = ",".join(p for p in settings.layers.split(",") if p.strip() != "attn_last") or "all"
        wanted = select_layers(described["layers"][:-1], selection)
        layers = wanted + ["attn_last"]
        chunks, domains = _get(worker.chunks.remote(corpus.texts, corpus.labels, settings.chunk_len, settings.chunks_per_domain,
                                                    settings.seed))
        n = len(domains)
        bounds = [(s, min(n, s + settings.batch_size)) for s in range(0, n, settings.batch_size)]
        refs = [worker.statistics.remote(chunks[s:e], layers, settings.domain_tokens) for s, e in bounds]
        results = []
        for ref, (s, e) in zip(refs, bounds):
            results.append(_get(ref))
            if progress:
                progress(e - s)
    finally:
        from raygeom.engine import replica_actor

        replica_actor.stop(worker)
    _write_unit(paths, spec, described, layers, domains, results, key)
    return {"key": key, "layers": layers, "cached": False}


def _write_unit(paths, spec: ModelSpec, described: dict, layers: list[str], domains: list[str], results, key: str) -> None:
    n = len(domains)
    all_layers = described["layers"]
    depth = {name: i / (len(all_layers) - 2) for i, name in enumerate(all_layers[:-1])}
    depth["attn_last"] = depth[all_layers[-3]]  # inside the last block
    nll = np.concatenate([r[2] for r in results])
    n_predicted = results[0][3]
    chunk_ids = np.arange(n, dtype=np.int32)
    columns = {"chunk_id": [], "domain": [], "layer": [], "layer_index": [], "token_dispersion": []}
    for index, layer in enumerate(layers):
        columns["chunk_id"].append(chunk_ids)
        columns["domain"] += domains
        columns["layer"] += [layer] * n
        columns["layer_index"].append(np.full(n, all_layers.index(layer), dtype=np.int16))
        columns["token_dispersion"].append(np.concatenate([r[0][layer] for r in results]))
    chunks = pa.table({"chunk_id": np.concatenate(columns["chunk_id"]), "domain": columns["domain"], "layer": columns["layer"],
                       "layer_index": np.concatenate(columns["layer_index"]),
                       "token_dispersion": np.concatenate(columns["token_dispersion"]),
                       "nll": np.tile(nll, len(layers)), "perplexity": np.exp(np.tile(nll, len(layers))),
                       "n_predicted": np.full(n * len(layers), n_predicted, dtype=np.int32)})
    pooled = {layer: np.concatenate([r[1][layer] for r in results]).astype(np.float32) for layer in layers}
    pooled_table = pa.table({"chunk_id": np.tile(chunk_ids, len(layers)), "layer": [l for l in layers for _ in range(n)],
                             "vector": vector_column(np.concatenate([pooled[l] for l in layers]))})
    gaps = _merge_gaps([r[4] for r in results])
    gap_rows = [{"layer": layer, "domain_dispersion": _side(gaps[layer], "domain"),
                 "generic_dispersion": _side(gaps[layer], "generic"), "n_domain": gaps[layer]["counts"]["domain"],
                 "n_generic": gaps[layer]["counts"]["generic"]} for layer in layers if layer in gaps]
    for row in gap_rows:
        row["gap"] = row["domain_dispersion"] - row["generic_dispersion"]
    atomic_write_table(chunks, paths["chunks"])
    atomic_write_table(pooled_table, paths["pooled"])
    atomic_write_table(pa.Table.from_pylist(gap_rows) if gap_rows else pa.table({"layer": pa.array([], pa.string())}), paths["gap"])
    token_nll_mean = float(nll.mean())
    summary = []
    for layer in layers:
        values = np.concatenate([r[0][layer] for r in results])
        summary.append({"model": spec.name, "revision": spec.revision, "layer": layer, "layer_index": all_layers.index(layer),
                        "relative_depth": depth[layer], "token_dispersion": float(np.nanmean(values)),
                        "sample_dispersion": dispersion(pooled[layer]), "perplexity": float(np.exp(token_nll_mean)),
                        "n_chunks": n, "d": described["d"], "fingerprint": described["fingerprint"], "key": key})
    atomic_write_table(pa.Table.from_pylist(summary), paths["layers"])


def read_unit(store: Store, spec: ModelSpec, key: str) -> dict:
    paths = _paths(store, spec, key)
    pooled = read_table(paths["pooled"])
    vectors = column_to_matrix(pooled["vector"])
    layer_col = np.asarray(pooled["layer"].to_pylist())
    return {"chunks": read_table(paths["chunks"]), "gap": read_table(paths["gap"]), "layers": read_table(paths["layers"]),
            "pooled": {layer: vectors[layer_col == layer] for layer in dict.fromkeys(layer_col.tolist())}}


def analyse_unit(unit: dict, analysis: AnalysisSettings, seed: int = 0) -> dict:
    """Group protocol per layer, difficulty slices (domains and k-means), gap; rows ready for Parquet."""
    chunks = unit["chunks"].to_pandas()
    summary = unit["layers"].to_pylist()
    rows, slices, groups = [], [], []
    for row in summary:
        layer = row["layer"]
        part = chunks[chunks["layer"] == layer].sort_values("chunk_id")
        ppl, disp = part["perplexity"].to_numpy(), part["token_dispersion"].to_numpy()
        try:
            result = perplexity_groups(ppl, disp, analysis.group_size, analysis.n_groups)
            row = {**row, "group_spearman": result.spearman, "group_pearson": result.pearson, "n_groups": len(result.members)}
            groups += [{"model": row["model"], "revision": row["revision"], "layer": layer, "group": i,
                        "mean_perplexity": float(p), "mean_dispersion": float(d)}
                       for i, (p, d) in enumerate(zip(result.mean_perplexity, result.mean_dispersion))]
        except RaygeomError:
            row = {**row, "group_spearman": float("nan"), "group_pearson": float("nan"), "n_groups": 0}
        finite = np.isfinite(disp)
        row["chunk_spearman"] = float(spearmanr(ppl[finite], disp[finite])[0])
        row["chunk_pearson"] = float(pearsonr(ppl[finite], disp[finite])[0])
        pooled = unit["pooled"][layer]
        for kind, labels in _slice_labels(part["domain"].to_numpy(), pooled, analysis.n_slices, seed):
            names, sample_disp = dispersion_by_slice(pooled, labels)
            slice_ppl = np.array([float(np.exp(np.mean(np.log(ppl[labels == s])))) for s in names])
            slice_token = np.array([float(np.nanmean(disp[labels == s])) for s in names])
            for s, sd, td, sp in zip(names, sample_disp, slice_token, slice_ppl):
                slices.append({"model": row["model"], "revision": row["revision"], "layer": layer, "slicing": kind,
                               "slice": str(s), "n_chunks": int((labels == s).sum()), "sample_dispersion": float(sd),
                               "token_dispersion": float(td), "perplexity": float(sp)})
            keep = np.isfinite(sample_disp)
            row[f"{kind}_agreement_sample"] = rank_agreement(sample_disp[keep], slice_ppl[keep]) if keep.sum() >= 3 else float("nan")
            row[f"{kind}_agreement_token"] = rank_agreement(slice_token, slice_ppl) if len(names) >= 3 else float("nan")
        rows.append(row)
    gap = {r["layer"]: r for r in unit["gap"].to_pylist()}
    for row in rows:
        g = gap.get(row["layer"], {})
        row.update({"gap": g.get("gap", float("nan")), "gap_n_domain": g.get("n_domain", 0)})
    return {"layers": rows, "slices": slices, "groups": groups}


def _slice_labels(domains: np.ndarray, pooled: np.ndarray, n_slices: int, seed: int):
    out = []
    if len(set(domains.tolist())) >= 3:
        out.append(("domain", domains))
    if n_slices >= 3 and pooled.shape[0] >= n_slices:
        out.append(("kmeans", kmeans_slices(pooled, n_slices, seed)))
    return out


def run_dispersion(store: Store, specs: list[ModelSpec], corpus: Corpus, settings: DispersionSettings, analysis: AnalysisSettings,
                   progress_factory: Callable[[str, int], Callable[[int], None]] | None = None) -> dict:
    """Extract and analyse every model; write the combined tables under ``results/`` and return them."""
    combined = {"layers": [], "slices": [], "groups": [], "domains": []}
    for spec in specs:
        progress = progress_factory(f"{spec.name}@{spec.revision}", 0) if progress_factory else None
        info = extract_unit(store, spec, corpus, settings, progress)
        unit = read_unit(store, spec, info["key"])
        if analysis.gap_layer not in unit["pooled"]:
            raise RaygeomError(f"gap layer '{analysis.gap_layer}' was not extracted; extracted: {', '.join(unit['pooled'])}")
        result = analyse_unit(unit, analysis, settings.seed)
        result["domains"] = domain_summary(store, spec, info["key"], analysis.gap_layer)
        for name in combined:
            combined[name] += result[name]
    for name, rows in combined.items():
        atomic_write_table(pa.Table.from_pylist(rows), store.root / "results" / f"dispersion_{name}.parquet")
    return combined


def domain_summary(store: Store, spec: ModelSpec, key: str, layer: str) -> list[dict]:
    """Per domain: mean token dispersion at ``layer`` and perplexity (exp of mean NLL); model-level points."""
    chunks = read_unit(store, spec, key)["chunks"].to_pandas()
    part = chunks[chunks["layer"] == layer]
    rows = []
    for domain, group in part.groupby("domain"):
        rows.append({"model": spec.name, "domain": domain, "layer": layer, "token_dispersion": float(group["token_dispersion"].mean()),
                     "perplexity": float(np.exp(group["nll"].mean()))})
    return rows


# ---------------------------------------------------------------- plots

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt




def plot_groups(groups: list[dict], layers_rows: list[dict], model: str, layers: list[str], path: Path) -> Path:
    """The authors' figure: per selected layer, group mean dispersion against group mean perplexity."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(layers), figsize=(3.4 * len(layers), 3.2), dpi=110, squeeze=False)
    stats = {r["layer"]: r for r in layers_rows if r["model"] == model}
    for ax, layer in zip(axes[0], layers):
        pts = [g for g in groups if g["model"] == model and g["layer"] == layer]
        ax.plot([g["mean_perplexity"] for g in pts], [g["mean_dispersion"] for g in pts], "o", ms=4)
        s = stats.get(layer, {})
        ax.set_title(f"{layer}\nSpearman {s.get('group_spearman', float('nan')):+.2f}  Pearson {s.get('group_pearson', float('nan')):+.2f}", fontsize=8)
        ax.set_xlabel("group mean perplexity", fontsize=8)
    axes[0][0].set_ylabel("group mean token dispersion", fontsize=8)
    fig.suptitle(model, fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def plot_layer_profile(rows: list[dict], path: Path) -> Path:
    """Per model, by relative depth: token dispersion, sample dispersion and the group Spearman."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), dpi=110)
    for model in dict.fromkeys(r["model"] for r in rows):
        part = sorted((r for r in rows if r["model"] == model and r["layer"] != "attn_last"), key=lambda r: r["relative_depth"])
        x = [r["relative_depth"] for r in part]
        for ax, field_name in zip(axes, ("token_dispersion", "sample_dispersion", "group_spearman")):
            ax.plot(x, [r[field_name] for r in part], marker="o", ms=3, label=model)
    for ax, title in zip(axes, ("token-level dispersion (mean over chunks)", "sample-level dispersion (pooled chunks)",
                                "Spearman(group perplexity, group dispersion)")):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("relative depth (embed = 0, final norm = 1)", fontsize=8)
    axes[2].axhline(0, color="black", lw=0.7)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def plot_models(points: list[dict], path: Path) -> Path:
    """Model-level (and per-domain) dispersion against perplexity, across models."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4), dpi=110)
    for model in dict.fromkeys(p["model"] for p in points):
        part = [p for p in points if p["model"] == model]
        sc = ax.scatter([p["perplexity"] for p in part], [p["token_dispersion"] for p in part], label=model, s=25)
        for p in part:
            ax.annotate(p["domain"], (p["perplexity"], p["token_dispersion"]), fontsize=6, color=sc.get_facecolor()[0])
    ax.set_xlabel("perplexity (exp mean token NLL)")
    ax.set_ylabel(f"token dispersion at {points[0]['layer'] if points else ''}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def rank_by_gap(store: Store, specs: list[ModelSpec], corpus: Corpus, settings: DispersionSettings, layer: str) -> list[dict]:
    """Candidates (models or checkpoints) ranked by the dispersion gap at ``layer``, largest first."""
    if not settings.domain_tokens:
        raise RaygeomError("a domain token set is needed to rank by the dispersion gap")
    rows = []
    for spec in specs:
        info = extract_unit(store, spec, corpus, settings)
        unit = read_unit(store, spec, info["key"])
        gaps = {r["layer"]: r for r in unit["gap"].to_pylist()}
        if layer not in gaps:
            raise RaygeomError(f"layer '{layer}' not extracted for {spec.name}; extracted: {', '.join(gaps)}")
        g = gaps[layer]
        rows.append({"model": spec.name, "revision": spec.revision, "layer": layer, "gap": g["gap"],
                     "domain_dispersion": g["domain_dispersion"], "generic_dispersion": g["generic_dispersion"],
                     "n_domain": g["n_domain"], "n_generic": g["n_generic"],
                     "perplexity": unit["layers"]["perplexity"][0].as_py(), "domain_tokens": settings.domain_tokens})
    if any(r["n_domain"] < 2 for r in rows):
        thin = [f"{r['model']}@{r['revision']}" for r in rows if r["n_domain"] < 2]
        raise RaygeomError(f"fewer than 2 domain-token positions for {', '.join(thin)}; use more chunks or another token set")
    rows.sort(key=lambda r: (-r["gap"], r["model"], r["revision"]))
    for rank, row in enumerate(rows, 1):
        row["rank"] = rank
    atomic_write_table(pa.Table.from_pylist(rows), store.root / "results" / "dispersion_select.parquet")
    return rows
