"""The dispersion analyses: token-level extraction on a replica, then units of the engine.

Extraction: one replica actor (``raygeom.engine.replica_actor``) per (model, revision) cuts the corpus
into chunks (per domain) and, from each forward pass, keeps per chunk and layer the token-level
dispersion, the pooled vector, the chunk's NLL and bytes, and the chunk's dispersion-gap sums.
Everything goes to the store under ``dispersion/``; the per-layer summary is written last and marks
the extraction complete.

Analysis: one engine unit per (extraction, analysis settings), one pure step per layer (the authors'
group protocol, the difficulty slices, the gap, each with a seeded bootstrap interval) and one for the
per-domain summary. Rows go to ``results/dispersion_{layers,slices,groups,domains}/<unit key>.parquet``;
the combined tables ``results/dispersion_<table>.parquet`` hold every stored unit. ``select`` ranks
candidates by G through units ``results/dispersion_gap/``. No Ray here: the engine runs the steps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from raygeom.engine.contract import Step, Unit
from raygeom.errors import InputError, RaygeomError
from raygeom.params import ChunkSettings, default_of
from raygeom.replica.settings import batches_at_once
from raygeom.sources import layers as layer_position
from raygeom.sources.corpus import Corpus
from raygeom.sources.models import CONTEXT_KEYS, DEPTH_KEYS, ModelSpec, config_value
from raygeom.store.tree import Store, atomic_write_table, column_to_matrix, content_key, read_table, vector_column, verified


def _numerics():
    """raygeom.numerics.dispersion (torch): imported by the units that compute, not when the registry's discovery
    imports this module for the CLI, which must refuse bad input before torch loads."""
    from raygeom.numerics import dispersion

    return dispersion


DISPERSION_VERSION = 3  # 2: per-chunk bytes (bits per byte) and per-chunk gap sums (G's bootstrap over chunks); chunks start with BOS where the tokenizer adds one; 3: attn_last's depth inside the last block
ANALYSIS_VERSION = 5  # 2: rows take the step from the model spec (None for a non-Pythia 'main', not 143000); 3: intervals of both dispersions; 4: the token-level interval inside [0, 2]; 5: a rank correlation's note and exact permutation p where it has no interval
TABLES = ("layers", "slices", "groups", "domains")


@dataclass(frozen=True)
class DispersionSettings:
    """The chunk extraction as a replica runs it; its defaults are the declaration's (raygeom.params.ChunkSettings)."""

    chunk_len: int = default_of(ChunkSettings, "chunk_len")
    chunks_per_domain: int = default_of(ChunkSettings, "chunks_per_domain")
    batch_size: int = default_of(ChunkSettings, "batch_size")
    layers: str = "all"
    domain_tokens: str = default_of(ChunkSettings, "domain_tokens")
    seed: int = 0

    def __post_init__(self):
        if self.chunk_len < 2:
            raise RaygeomError(f"chunk-len must be at least 2, got {self.chunk_len}")
        if self.chunks_per_domain < 1 or self.batch_size < 1:
            raise RaygeomError("chunks-per-domain and batch-size must be positive")


MIN_DISTINCT_TEXTS = 3  # below this, chunk and group correlations have nothing to rank


@dataclass(frozen=True)
class AnalysisSettings:
    group_size: int = 20  # the authors use 100 over far more chunks; 20 gives 10 groups over the CLI's default 200
    n_groups: int = 100
    n_slices: int = 8
    gap_layer: str = "final_norm"
    n_boot: int = 1000  # bootstrap draws of every interval

    def __post_init__(self):
        if self.group_size < 1:
            raise RaygeomError(f"--group-size must be at least 1, got {self.group_size}")
        if self.n_groups < 3:
            raise RaygeomError(f"--n-groups must be at least 3 (a correlation across groups needs 3), got {self.n_groups}")
        if self.n_slices < 3:
            raise RaygeomError(f"--n-slices must be at least 3 (a rank agreement across slices needs 3), got {self.n_slices}")
        if self.n_boot < 10:
            raise RaygeomError(f"--n-boot must be at least 10, got {self.n_boot}")

    def check_against(self, n_chunks: int, texts: list[str] | None = None) -> None:
        """Refuse, before any extraction, sizes that can only give NaN group correlations or no slices, and a corpus
        too repetitive to rank (``texts``): chunks of one text repeated have one perplexity and one geometry, so every
        correlation would be NaN and every dispersion rounding noise (as PGA refuses too few distinct texts)."""
        distinct = len(set(texts)) if texts is not None else None
        if distinct is not None and distinct < MIN_DISTINCT_TEXTS:
            raise RaygeomError(
                f"the corpus holds {distinct} distinct text(s) of {len(texts)}; dispersion against "
                f"perplexity needs at least {MIN_DISTINCT_TEXTS} distinct texts"
            )
        full = n_chunks // self.group_size
        if full < 3:
            raise RaygeomError(
                f"--group-size {self.group_size} makes {full} full group(s) of the {n_chunks} chunks asked for; "
                "group correlations need at least 3: lower --group-size or raise --chunks-per-domain"
            )
        if self.n_slices > n_chunks:
            raise RaygeomError(f"--n-slices {self.n_slices} is more than the {n_chunks} chunks asked for; lower it")


def check_model(config: dict | None, selection: str, chunk_len: int, gap_layer: str, model: str) -> None:
    """Refuse, from the model's config (known without loading it; None: checked once it loads), a chunk longer than
    the model's context and a layer selection without the gap layer, before Ray starts: they were refused only
    after the weights had loaded or every layer had been extracted."""
    context = config_value(config, CONTEXT_KEYS)
    if context is not None and chunk_len > context:
        raise RaygeomError(
            f"chunk_len {chunk_len} is longer than the {context}-token context of {model} (its config's "
            f"{next(k for k in CONTEXT_KEYS if config_value(config, (k,)) == context)}); use at most {context}"
        )
    if gap_layer == "attn_last":  # always extracted
        return
    blocks = config_value(config, DEPTH_KEYS)
    named = ",".join(p for p in selection.split(",") if p.strip() != "attn_last") or "all"
    if blocks is not None:
        chosen = layer_position.select_layers(layer_position.layer_names(blocks), named)
    elif named.strip() != "all" and gap_layer in ("embed", "final_norm"):  # chosen by name only, whatever the depth
        chosen = [p.strip() for p in named.split(",")]
    else:
        return
    if gap_layer not in chosen:
        shown = ", ".join(chosen if len(chosen) <= 6 else [*chosen[:3], "...", *chosen[-2:]])
        raise RaygeomError(
            f"the gap layer '{gap_layer}' is not among the layers selected ('{selection}': {shown}, attn_last) "
            f"for {model}; add it to the layers or choose a gap layer among them"
        )


# ---------------------------------------------------------------- extraction (driver + replica actor)


def start_worker(spec: ModelSpec, gpus: float | None = None, replicas=None):
    """A replica actor for token-level work (a GPU, else every CPU of a node) and its description,
    whose ``layers`` are the token layers (every layer, then ``attn_last``). ``replicas``: a
    ``replica_actor.Handover`` whose parked replica this takes, if it has one."""
    from raygeom.engine import replica_actor

    worker, described = (replicas or replica_actor).start(spec, gpus)
    return worker, {**described, "layers": described["token_layers"]}


def handover():
    """Replicas handed from one (model, revision) to the next by a driver loop of ``extract_unit`` calls."""
    from raygeom.engine import replica_actor

    return replica_actor.Handover()


def release_worker(worker, replicas, handed_on: bool) -> None:
    """A ``start_worker`` replica when its work is done: stopped without ``replicas``, else parked in it for the next
    (model, revision), or stopped if its work failed (not handed on)."""
    from raygeom.engine import replica_actor

    if replicas is None:
        replica_actor.stop(worker)
    elif handed_on:
        replicas.park(worker)
    else:
        replicas.discard(worker)


def _get(ref):
    from raygeom.engine import replica_actor

    return replica_actor.get(ref)


def unit_key(spec: ModelSpec, corpus: Corpus, settings: DispersionSettings) -> str:
    return content_key(
        "dispersion", DISPERSION_VERSION, spec.kind, spec.source, spec.revision, corpus.fingerprint(), asdict(settings)
    )


def _paths_of(root: str | Path, slug: str, revision: str, key: str) -> dict[str, Path]:
    base = Path(root) / "dispersion" / f"model={slug}" / f"revision={revision}"
    return {
        "chunks": base / f"chunks-{key}.parquet",
        "pooled": base / f"pooled-{key}.parquet",
        "gap": base / f"gap-{key}.parquet",
        "layers": base / f"summary-{key}.parquet",
    }


def _paths(store: Store, spec: ModelSpec, key: str) -> dict[str, Path]:
    return _paths_of(store.root, spec.slug, spec.revision, key)


def is_extracted(store: Store, spec: ModelSpec, corpus: Corpus, settings: DispersionSettings) -> bool:
    """Whether the store holds this token-level extraction, every file intact."""
    return all(verified(p) for p in _paths(store, spec, unit_key(spec, corpus, settings)).values())


def extract_unit(
    store: Store,
    spec: ModelSpec,
    corpus: Corpus,
    settings: DispersionSettings,
    progress: Callable[[int], None] | None = None,
    gpus: float | None = None,
    replicas=None,
) -> dict:
    """Token-level extraction of one (model, revision) into the store; returns the unit's description.

    Skipped when the unit's summary exists. Files of an interrupted run are overwritten. ``replicas``
    (``handover()``): the replica is taken from it and parked in it for the next call.
    """
    from raygeom.sources.layers import select_layers

    key = unit_key(spec, corpus, settings)
    paths = _paths(store, spec, key)
    if is_extracted(store, spec, corpus, settings):
        table = read_table(paths["layers"])
        if progress and table.num_rows:
            progress(int(table["n_chunks"][0].as_py()))
        return {"key": key, "layers": table["layer"].to_pylist(), "cached": True}
    worker, described = start_worker(spec, gpus, replicas)
    handed_on = False
    try:
        selection = ",".join(p for p in settings.layers.split(",") if p.strip() != "attn_last") or "all"
        wanted = select_layers(described["layers"][:-1], selection)
        layers = wanted + ["attn_last"]
        chunks, domains = _get(
            worker.chunks.remote(
                corpus.texts, corpus.labels, settings.chunk_len, settings.chunks_per_domain, settings.seed, spec=spec
            )
        )
        n_bytes = _get(worker.chunk_bytes.remote(chunks, spec=spec))
        n = len(domains)
        bounds = [(s, min(n, s + settings.batch_size)) for s in range(0, n, settings.batch_size)]
        group = batches_at_once(described)
        groups = [bounds[i : i + group] for i in range(0, len(bounds), group)]
        refs = [
            worker.statistics_batches.remote([chunks[s:e] for s, e in some], layers, settings.domain_tokens, spec=spec)
            for some in groups
        ]
        results = []
        for ref, some in zip(refs, groups):
            results.extend(_get(ref))
            if progress:
                progress(sum(e - s for s, e in some))
        handed_on = True
    finally:
        release_worker(worker, replicas, handed_on)
    _write_unit(paths, spec, corpus, settings, described, layers, domains, np.asarray(n_bytes), results, key)
    return {"key": key, "layers": layers, "cached": False}


def _gap_parts(results, layers: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per layer: (n, 2, d) per-chunk sums of unit vectors (domain, generic), (n, 2) their squared norms, (n, 2) counts."""
    parts = {}
    for layer in layers:
        per_chunk = [chunk for r in results for chunk in r[4].get(layer, [])]
        if not per_chunk:
            continue
        sums = np.stack(
            [
                np.stack([np.asarray(s["domain"], dtype=np.float64), np.asarray(s["generic"], dtype=np.float64)])
                for s, _, _ in per_chunk
            ]
        )
        diagonal = np.array([[d["domain"], d["generic"]] for _, d, _ in per_chunk], dtype=np.float64)
        counts = np.array([[c["domain"], c["generic"]] for _, _, c in per_chunk], dtype=np.int64)
        parts[layer] = (sums, diagonal, counts)
    return parts


def _write_unit(
    paths,
    spec: ModelSpec,
    corpus: Corpus,
    settings: DispersionSettings,
    described: dict,
    layers: list[str],
    domains: list[str],
    n_bytes: np.ndarray,
    results,
    key: str,
) -> None:
    n = len(domains)
    all_layers = described["layers"]
    depth = {name: i / (len(all_layers) - 2) for i, name in enumerate(all_layers[:-1])}
    # The last block's attention output lies inside that block, between its input and output (as block_05.attn_out
    # does), not at its output's depth, where a line by depth would have two points.
    depth["attn_last"] = layer_position.relative_depth(all_layers[:-1], f"{all_layers[-3]}.attn_out")
    for layer in layers:  # points inside a block (block_05.mlp_out) lie between its input and output
        if layer not in depth:
            depth[layer] = layer_position.relative_depth(all_layers[:-1], layer)
    nll = np.concatenate([r[2] for r in results])
    n_predicted = results[0][3]
    chunk_ids = np.arange(n, dtype=np.int32)
    chunks = pa.table(
        {
            "chunk_id": np.tile(chunk_ids, len(layers)),
            "domain": domains * len(layers),
            "layer": [l for l in layers for _ in range(n)],
            "layer_index": np.repeat(np.array([layer_position.index(all_layers, l) for l in layers], dtype=np.int16), n),
            "token_dispersion": np.concatenate([np.concatenate([r[0][l] for r in results]) for l in layers]),
            "nll": np.tile(nll, len(layers)),
            "perplexity": np.exp(np.tile(nll, len(layers))),
            "n_predicted": np.full(n * len(layers), n_predicted, dtype=np.int32),
            "n_bytes": np.tile(n_bytes.astype(np.int64), len(layers)),
        }
    )
    pooled = {layer: np.concatenate([r[1][layer] for r in results]).astype(np.float32) for layer in layers}
    pooled_table = pa.table(
        {
            "chunk_id": np.tile(chunk_ids, len(layers)),
            "layer": [l for l in layers for _ in range(n)],
            "vector": vector_column(np.concatenate([pooled[l] for l in layers])),
        }
    )
    gaps = _gap_parts(results, layers)
    gap_layers = [l for l in layers if l in gaps]
    if gap_layers:
        gap_table = pa.table(
            {
                "chunk_id": np.tile(chunk_ids, len(gap_layers)),
                "layer": [l for l in gap_layers for _ in range(n)],
                "domain_sum": vector_column(np.concatenate([gaps[l][0][:, 0] for l in gap_layers])),
                "generic_sum": vector_column(np.concatenate([gaps[l][0][:, 1] for l in gap_layers])),
                "domain_diagonal": np.concatenate([gaps[l][1][:, 0] for l in gap_layers]),
                "generic_diagonal": np.concatenate([gaps[l][1][:, 1] for l in gap_layers]),
                "n_domain": np.concatenate([gaps[l][2][:, 0] for l in gap_layers]),
                "n_generic": np.concatenate([gaps[l][2][:, 1] for l in gap_layers]),
            }
        )
    else:
        gap_table = pa.table({"layer": pa.array([], pa.string())})
    atomic_write_table(chunks, paths["chunks"])
    atomic_write_table(pooled_table, paths["pooled"])
    atomic_write_table(gap_table, paths["gap"])
    token_nll_mean = float(nll.mean())
    bpb = _numerics().bits_per_byte(nll, np.full(n, n_predicted), n_bytes)
    summary = []
    for layer in layers:
        values = np.concatenate([r[0][layer] for r in results])
        summary.append(
            {
                "model": spec.name,
                "revision": spec.revision,
                "layer": layer,
                "layer_index": layer_position.index(all_layers, layer),
                "relative_depth": depth[layer],
                "token_dispersion": float(np.nanmean(values)),
                "sample_dispersion": _numerics().dispersion(pooled[layer]),
                "perplexity": float(np.exp(token_nll_mean)),
                "bits_per_byte": bpb,
                "n_chunks": n,
                "n_bytes": int(n_bytes.sum()),
                "d": described["d"],
                "vocab_size": described.get("vocab_size"),
                "fingerprint": described["fingerprint"],
                "key": key,
                **extraction_provenance(spec, corpus, settings),
            }
        )
    atomic_write_table(pa.Table.from_pylist(summary), paths["layers"])


def extraction_provenance(spec: ModelSpec, corpus: Corpus, settings: DispersionSettings) -> dict:
    """The settings behind an extraction, in every row made from it."""
    from raygeom import __version__

    return {
        "step": spec.step,
        "corpus": corpus.name,
        "corpus_fingerprint": corpus.fingerprint(),
        "chunk_len": settings.chunk_len,
        "chunks_per_domain": settings.chunks_per_domain,
        "layers_selected": settings.layers,
        "domain_tokens": settings.domain_tokens,
        "extraction_seed": settings.seed,
        "raygeom_version": __version__,
    }


def read_unit_at(root: str, slug: str, revision: str, key: str) -> dict:
    paths = _paths_of(root, slug, revision, key)
    pooled = read_table(paths["pooled"])
    vectors = column_to_matrix(pooled["vector"])
    layer_col = np.asarray(pooled["layer"].to_pylist())
    return {
        "chunks": read_table(paths["chunks"]),
        "gap": read_table(paths["gap"]),
        "layers": read_table(paths["layers"]),
        "pooled": {layer: vectors[layer_col == layer] for layer in dict.fromkeys(layer_col.tolist())},
    }


def gap_parts_of(gap_table: pa.Table, layer: str):
    """(sums (n, 2, d), diagonal (n, 2), counts (n, 2)) of one layer from a stored gap table, in chunk order; None if absent."""
    if "chunk_id" not in gap_table.column_names:
        return None
    mask = np.asarray(gap_table["layer"].to_pylist()) == layer
    if not mask.any():
        return None
    part = gap_table.filter(pa.array(mask))
    order = np.argsort(part["chunk_id"].to_numpy())
    sums = np.stack([column_to_matrix(part["domain_sum"]), column_to_matrix(part["generic_sum"])], axis=1)[order]
    diagonal = np.stack([part["domain_diagonal"].to_numpy(), part["generic_diagonal"].to_numpy()], axis=1)[order]
    counts = np.stack([part["n_domain"].to_numpy(), part["n_generic"].to_numpy()], axis=1)[order]
    return sums, diagonal, counts


# ---------------------------------------------------------------- analysis (pure steps)


def _nan_interval(prefix: str) -> dict:
    return {f"{prefix}_lo": float("nan"), f"{prefix}_hi": float("nan")}


def _correlations(x: np.ndarray, y: np.ndarray, prefix: str, n_boot: int, seed: int) -> dict:
    """Spearman and Pearson of paired values with percentile-bootstrap intervals over the pairs (NaN below 4 pairs)."""
    from raygeom.numerics.distributions import pearson, spearman  # scipy.special: in the units, not at discovery
    from raygeom.numerics.uncertainty import bootstrap_ci, spearman_with_ci

    out = {
        f"{prefix}_spearman": spearman(x, y) if len(x) >= 3 else float("nan"),
        f"{prefix}_pearson": pearson(x, y) if len(x) >= 3 else float("nan"),
    }
    try:
        rank = spearman_with_ci(x, y, seed=seed, method="bootstrap", n_boot=n_boot)
        linear = bootstrap_ci((x, y), pearson, seed=seed, n_boot=n_boot)
        out.update(
            {
                f"{prefix}_spearman_lo": rank["lo"],
                f"{prefix}_spearman_hi": rank["hi"],
                # where no interval is honest (fewer than 10 pairs, |rho| = 1): why, and the exact permutation p-value
                f"{prefix}_spearman_note": rank["note"],
                f"{prefix}_spearman_p_perm": rank["p_perm"],
                f"{prefix}_pearson_lo": linear["lo"],
                f"{prefix}_pearson_hi": linear["hi"],
            }
        )
    except InputError as error:
        out.update({**_nan_interval(f"{prefix}_spearman"), **_nan_interval(f"{prefix}_pearson")})
        out.update({f"{prefix}_spearman_note": str(error), f"{prefix}_spearman_p_perm": float("nan")})
    return out


def analyse_layer(
    row: dict, part, pooled: np.ndarray, gap_parts, analysis: AnalysisSettings, seed: int
) -> tuple[dict, list, list]:
    """One layer: group protocol, chunk correlations, slices (domains and k-means) and the gap, with intervals."""
    layer = row["layer"]
    ppl, disp = part["perplexity"].to_numpy(), part["token_dispersion"].to_numpy()
    groups = []
    try:
        result = _numerics().perplexity_groups(ppl, disp, analysis.group_size, analysis.n_groups)
        keep = np.isfinite(result.mean_dispersion)
        row = {
            **row,
            **_correlations(result.mean_perplexity[keep], result.mean_dispersion[keep], "group", analysis.n_boot, seed),
            "n_groups": len(result.members),
        }
        groups = [
            {
                "model": row["model"],
                "revision": row["revision"],
                "layer": layer,
                "group": i,
                "n_chunks": len(m),
                "mean_perplexity": float(p),
                "mean_dispersion": float(d),
            }
            for i, (p, d, m) in enumerate(zip(result.mean_perplexity, result.mean_dispersion, result.members))
        ]
    except InputError:
        row = {
            **row,
            "group_spearman": float("nan"),
            "group_pearson": float("nan"),
            "n_groups": 0,
            **_nan_interval("group_spearman"),
            **_nan_interval("group_pearson"),
            "group_spearman_note": "too few chunks for perplexity groups",
            "group_spearman_p_perm": float("nan"),
        }
    finite = np.isfinite(disp)
    row.update(_dispersion_intervals(disp[finite], pooled))
    row.update(_correlations(ppl[finite], disp[finite], "chunk", analysis.n_boot, seed))
    slices = []
    for kind, labels in _slice_labels(part["domain"].to_numpy(), pooled, analysis.n_slices, seed):
        names, sample_disp = _numerics().dispersion_by_slice(pooled, labels)
        slice_ppl = np.array([float(np.exp(np.mean(np.log(ppl[labels == s])))) for s in names])
        slice_token = np.array([float(np.nanmean(disp[labels == s])) for s in names])
        for s, sd, td, sp in zip(names, sample_disp, slice_token, slice_ppl):
            slices.append(
                {
                    "model": row["model"],
                    "revision": row["revision"],
                    "layer": layer,
                    "slicing": kind,
                    "slice": str(s),
                    "n_chunks": int((labels == s).sum()),
                    "sample_dispersion": float(sd),
                    "token_dispersion": float(td),
                    "perplexity": float(sp),
                }
            )
        keep = np.isfinite(sample_disp)
        row[f"{kind}_agreement_sample"] = (
            _numerics().rank_agreement(sample_disp[keep], slice_ppl[keep]) if keep.sum() >= 3 else float("nan")
        )
        row[f"{kind}_agreement_token"] = _numerics().rank_agreement(slice_token, slice_ppl) if len(names) >= 3 else float("nan")
        try:
            interval = _numerics().slice_agreement_interval(labels, ppl, disp, pooled, seed, analysis.n_boot)
        except InputError:
            interval = {"token_lo": float("nan"), "token_hi": float("nan"), "sample_lo": float("nan"), "sample_hi": float("nan")}
        for level in ("token", "sample"):
            row[f"{kind}_agreement_{level}_lo"] = interval[f"{level}_lo"]
            row[f"{kind}_agreement_{level}_hi"] = interval[f"{level}_hi"]
    row.update(_gap_columns(gap_parts, analysis.n_boot, seed))
    return row, slices, groups


def _dispersion_intervals(chunk_dispersion: np.ndarray, pooled: np.ndarray) -> dict:
    """95 % intervals of the layer's two dispersions: the token-level mean over chunks (Student t over the chunks, on
    the logit scale of D / 2)
    and the sample level of the pooled chunk vectors (delete-one jackknife over the chunks)."""
    from raygeom.numerics.uncertainty import bounded_mean_interval  # scipy.special: in the units, not at discovery

    nan = float("nan")
    # a mean cosine distance lies in [0, 2]: the t interval on its logit scale stays inside
    token = bounded_mean_interval(chunk_dispersion, bounds=(0.0, 2.0)) if chunk_dispersion.size else {"lo": nan, "hi": nan}
    try:
        sample = _numerics().sample_dispersion_interval(pooled)
    except InputError:
        sample = {"dispersion_lo": nan, "dispersion_hi": nan}
    return {
        "token_dispersion_lo": token["lo"],
        "token_dispersion_hi": token["hi"],
        "sample_dispersion_lo": sample["dispersion_lo"],
        "sample_dispersion_hi": sample["dispersion_hi"],
    }


def _gap_columns(gap_parts, n_boot: int, seed: int) -> dict:
    if gap_parts is None:
        return {
            "gap": float("nan"),
            "gap_se": float("nan"),
            "gap_lo": float("nan"),
            "gap_hi": float("nan"),
            "gap_n_domain": 0,
            "gap_n_generic": 0,
            "gap_warning": "no domain token set",
        }
    sums, diagonal, counts = gap_parts
    result = _numerics().gap_interval(sums, diagonal, counts, seed, n_boot)
    return {
        "gap": result["gap"],
        "gap_se": result["gap_se"],
        "gap_lo": result["gap_lo"],
        "gap_hi": result["gap_hi"],
        "gap_n_domain": result["n_domain"],
        "gap_n_generic": result["n_generic"],
        "gap_warning": _numerics().gap_warning(result["n_domain"]),
    }


def _slice_labels(domains: np.ndarray, pooled: np.ndarray, n_slices: int, seed: int):
    out = []
    if len(set(domains.tolist())) >= 3:
        out.append(("domain", domains))
    if n_slices >= 3 and pooled.shape[0] >= n_slices:
        out.append(("kmeans", _numerics().kmeans_slices(pooled, n_slices, seed)))
    return out


def _analysis_columns(analysis: AnalysisSettings, seed: int, unit: str) -> dict:
    return {
        "group_size": analysis.group_size,
        "n_groups_max": analysis.n_groups,
        "n_slices": analysis.n_slices,
        "gap_layer": analysis.gap_layer,
        "n_boot": analysis.n_boot,
        "seed": seed,
        "unit_key": unit,
    }


def layer_step(root: str, slug: str, revision: str, key: str, layer: str, analysis: AnalysisSettings, seed: int):
    """A unit's part: one layer's row, slices and groups, read from the stored extraction."""
    unit = read_unit_at(root, slug, revision, key)
    row = next(r for r in unit["layers"].to_pylist() if r["layer"] == layer)
    chunks = unit["chunks"].to_pandas()
    part = chunks[chunks["layer"] == layer].sort_values("chunk_id")
    return analyse_layer(row, part, unit["pooled"][layer], gap_parts_of(unit["gap"], layer), analysis, seed)


def domains_step(root: str, slug: str, revision: str, key: str, layer: str) -> list[dict]:
    """Per domain at ``layer``: mean token dispersion, perplexity (exp of mean NLL) and bits per byte."""
    unit = read_unit_at(root, slug, revision, key)
    summary = unit["layers"].to_pylist()[0]
    chunks = unit["chunks"].to_pandas()
    part = chunks[chunks["layer"] == layer]
    rows = []
    for domain, group in part.groupby("domain"):
        rows.append(
            {
                "model": summary["model"],
                "revision": summary["revision"],
                "domain": domain,
                "layer": layer,
                "token_dispersion": float(group["token_dispersion"].mean()),
                "perplexity": float(np.exp(group["nll"].mean())),
                "bits_per_byte": _numerics().bits_per_byte(group["nll"], group["n_predicted"], group["n_bytes"]),
                "n_chunks": len(group),
            }
        )
    return rows


def analysis_key(extraction_key: str, analysis: AnalysisSettings, seed: int) -> str:
    """The content key of one extraction's analysis unit (its rows in results/dispersion_layers/)."""
    return content_key("dispersion_analysis", ANALYSIS_VERSION, extraction_key, asdict(analysis), seed)


def analysis_unit(
    store: Store, spec: ModelSpec, extraction_key: str, layers: list[str], analysis: AnalysisSettings, seed: int, provenance: dict
) -> Unit:
    """One engine unit per (extraction, analysis settings): a step per layer and one for the domains."""
    root = str(store.root)
    key = analysis_key(extraction_key, analysis, seed)
    columns = {**provenance, **_analysis_columns(analysis, seed, key)}

    def finish(values: list) -> list[dict]:
        *per_layer, domains = values
        slices = [{**s, **columns} for _, layer_slices, _ in per_layer for s in layer_slices]
        groups = [{**g, **columns} for _, _, layer_groups in per_layer for g in layer_groups]
        # Side tables first: a unit's layer rows (written by the engine) never exist without them.
        store.write_result("dispersion_slices", key, slices)
        store.write_result("dispersion_groups", key, groups)
        store.write_result("dispersion_domains", key, [{**d, **columns} for d in domains])
        return [{**row, **columns} for row, _, _ in per_layer]

    parts = [Step(layer_step, (root, spec.slug, spec.revision, extraction_key, layer, analysis, seed)) for layer in layers]
    parts.append(Step(domains_step, (root, spec.slug, spec.revision, extraction_key, analysis.gap_layer)))
    return Unit(
        analysis="dispersion_layers",
        key=key,
        label=f"{spec.name}@{spec.revision} dispersion analysis",
        parts=parts,
        finish=finish,
    )


def _read_side(store: Store, table: str, key: str) -> list[dict]:
    return store.read_results(table, [key]).to_pylist()


def run_dispersion(
    store: Store,
    specs: list[ModelSpec],
    corpus: Corpus,
    settings: DispersionSettings,
    analysis: AnalysisSettings,
    progress_factory: Callable[[str, int], Callable[[int], None]] | None = None,
    analysis_progress: Callable[[int], None] | None = None,
) -> dict:
    """Extract every model, analyse each extraction as one engine unit, write the combined tables under
    ``results/`` (every stored unit) and return this job's rows."""
    from raygeom.engine.units import accumulated_rows, run_units

    units = []
    with handover() as replicas:
        for spec in specs:
            progress = progress_factory(f"{spec.name}@{spec.revision}", 0) if progress_factory else None
            info = extract_unit(store, spec, corpus, settings, progress, replicas=replicas)
            if analysis.gap_layer not in info["layers"]:
                raise RaygeomError(f"gap layer '{analysis.gap_layer}' was not extracted; extracted: {', '.join(info['layers'])}")
            units.append(
                analysis_unit(
                    store,
                    spec,
                    info["key"],
                    info["layers"],
                    analysis,
                    settings.seed,
                    extraction_provenance(spec, corpus, settings),
                )
            )
    job = {"layers": run_units(store, units, analysis_progress)}
    for table in TABLES[1:]:
        job[table] = [row for unit in units for row in _read_side(store, f"dispersion_{table}", unit.key)]
    for table, rows in job.items():
        # Stores written before the engine units kept extraction summaries under results/dispersion_layers/: no unit_key.
        combined = [row for row in accumulated_rows(store, f"dispersion_{table}", rows) if row.get("unit_key")]
        atomic_write_table(pa.Table.from_pylist(combined), store.root / "results" / f"dispersion_{table}.parquet")
    return job


# ---------------------------------------------------------------- select: ranking by the gap

GAP_VERSION = 2  # 2: the step from the model spec, as ANALYSIS_VERSION 2


def gap_step(root: str, slug: str, revision: str, key: str, layer: str, n_boot: int, seed: int, step: int | None) -> dict:
    """G at ``layer`` with its chunk bootstrap, the sides' dispersions, perplexity and bits per byte."""
    unit = read_unit_at(root, slug, revision, key)
    parts = gap_parts_of(unit["gap"], layer)
    if parts is None:
        raise RaygeomError(
            f"layer '{layer}' not extracted for {slug}@{revision}; extracted: {', '.join(unit['layers']['layer'].to_pylist())}"
        )
    sums, diagonal, counts = parts
    summary = next(r for r in unit["layers"].to_pylist() if r["layer"] == layer)
    result = _numerics().gap_interval(sums, diagonal, counts, seed, n_boot)
    return {
        "model": summary["model"],
        "revision": revision,
        "layer": layer,
        **result,
        "perplexity": summary["perplexity"],
        "bits_per_byte": summary.get("bits_per_byte"),
        "gap_warning": _numerics().gap_warning(result["n_domain"]),
        "step": step,
        **{
            k: summary.get(k)
            for k in (
                "corpus",
                "corpus_fingerprint",
                "chunk_len",
                "chunks_per_domain",
                "domain_tokens",
                "extraction_seed",
                "raygeom_version",
                "fingerprint",
            )
        },
    }


def gap_key(extraction_key: str, layer: str, n_boot: int, seed: int) -> str:
    """The content key of one extraction's gap unit (its row in results/dispersion_gap/)."""
    return content_key("dispersion_gap", GAP_VERSION, extraction_key, layer, n_boot, seed)


def rank_by_gap(
    store: Store,
    specs: list[ModelSpec],
    corpus: Corpus,
    settings: DispersionSettings,
    layer: str,
    n_boot: int = 1000,
    progress: Callable[[int], None] | None = None,
    by_model: bool = False,
) -> list[dict]:
    """Candidates (models or checkpoints) ranked by the dispersion gap at ``layer``, largest first, each with
    G's bootstrap interval over chunks and the positions behind it. ``by_model``: each model's revisions are
    ranked among themselves (the checkpoints of each run of a width ladder), not all candidates together."""
    from raygeom.engine.units import run_units

    if not settings.domain_tokens:
        raise RaygeomError("a domain token set is needed to rank by the dispersion gap")
    units = []
    with handover() as replicas:
        infos = [extract_unit(store, spec, corpus, settings, replicas=replicas) for spec in specs]
    for spec, info in zip(specs, infos):
        if layer not in info["layers"]:
            raise RaygeomError(f"layer '{layer}' not extracted for {spec.name}; extracted: {', '.join(info['layers'])}")
        key = gap_key(info["key"], layer, n_boot, settings.seed)
        units.append(
            Unit(
                analysis="dispersion_gap",
                key=key,
                label=f"{spec.name}@{spec.revision} gap at {layer}",
                parts=[
                    Step(
                        gap_step,
                        (str(store.root), spec.slug, spec.revision, info["key"], layer, n_boot, settings.seed, spec.step),
                    )
                ],
                finish=lambda values, key=key: {**values[0], "n_boot": n_boot, "seed": settings.seed, "unit_key": key},
            )
        )
    rows = run_units(store, units, progress)
    thin = [f"{r['model']}@{r['revision']}" for r in rows if r["n_domain"] < 2]
    if thin:
        raise RaygeomError(f"fewer than 2 domain-token positions for {', '.join(thin)}; use more chunks or another token set")
    rows.sort(key=lambda r: (r["model"] if by_model else "", -r["gap"], r["model"], r["revision"]))
    ranks: dict[str, int] = {}
    for row in rows:
        group = row["model"] if by_model else ""
        ranks[group] = row["rank"] = ranks.get(group, 0) + 1
    atomic_write_table(pa.Table.from_pylist(rows), store.root / "results" / "dispersion_select.parquet")
    return rows
