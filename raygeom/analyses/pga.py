"""Subspace PGA as units of the engine: one unit per (extraction, layer, parameters).

A unit's steps: prepare the layer (centring + CCR-r, exact full-space ranks) from the store, then the
readout rho and the null chunks in parallel. Null ``i`` is seeded by ``(seed, i)``, so z is the same
however the nulls are split into chunks or tasks. No Ray here: the engine runs the steps.
"""

from __future__ import annotations

import numpy as np

from raygeom.analyses.provenance import extraction_columns
from raygeom.analyses.registry import Analysis, Metric, Needs, register
from raygeom.engine.contract import PREPARED, More, Step, Unit
from raygeom.errors import InputError, RaygeomError
from raygeom.params import AUTO_NULL_BLOCK, PGAParams, for_width
from raygeom.sources import layers as layer_position
from raygeom.store.tree import Store, content_key

# 2: rows carry z's uncertainty and the interval over texts; 3: z's interval is z +- 1.96 se; 4: z_se includes z's
# jackknife bias, and no interval below 20 nulls; 5: layers without the rank to be scored (rank after CCR-r < k + 2, or
# too few distinct distances) are not scored, so older units of such layers must not be read back as done
PGA_VERSION = 5


def pga_unit_key(extraction_key: str, layer: str, params: PGAParams) -> str:
    decide = (params.n_null_decide,) if params.n_null_decide else ()  # 0 keeps the keys from before the setting
    null = (
        ("auto", params.n_null, params.z_half_width, params.z_rel_width, params.n_null_cap, *decide)
        if params.n_null_auto
        else params.n_null
    )
    per_d = (("k_per_d", params.k_per_d),) if params.k_per_d else ()  # keys of fixed-k units stay as they were
    return content_key(
        "pga", PGA_VERSION, extraction_key, layer, params.k, params.r, null, params.seed, params.text_halves, *per_d
    )


def read_keyed_layer(root: str, model: str, revision: str, layer: str, extraction_key: str) -> np.ndarray:
    """The layer's vectors, only if the store still holds the extraction this unit was planned on (verified bytes)."""
    return Store(root).read_layer(model, revision, layer, key=extraction_key)[1]


def prepare_step(root: str, model: str, revision: str, layer: str, r: int, extraction_key: str, k: int):
    from raygeom.numerics import pga, rank

    h = read_keyed_layer(root, model, revision, layer, extraction_key)
    # Only what has the rank to be scored is scored: an InputError here is the unit's "not scored" reason.
    info = rank.layer_rank(h)
    if info.rank > 0:  # rank 0 (one vector for every sample) gets prepare_layer's own reason
        rank.check_rank(info, r, k)
    prepared = pga.prepare_layer(h, r)
    n = prepared.n_samples
    rank.check_distinct_distances(prepared.centred_full_ranks, n * (n - 1) // 2, info, r)
    return prepared


def readout_step(layer, basis: np.ndarray, device: str | None) -> float:
    from raygeom.numerics import pga

    return pga.subspace_rho(layer, basis, device)


def null_step(layer, k: int, seed: int, indices: list[int], device: str | None) -> np.ndarray:
    from raygeom.numerics import pga

    return pga.null_rhos(layer, k, seed, indices, device)


def texts_step(
    root: str,
    model: str,
    revision: str,
    layer: str,
    r: int,
    extraction_key: str,
    basis: np.ndarray,
    k: int,
    seed: int,
    halves: int,
    device: str | None,
) -> dict:
    from raygeom.numerics.pga_texts import half_sample_spread

    try:
        spread = half_sample_spread(
            read_keyed_layer(root, model, revision, layer, extraction_key), basis, r, k, seed, n_half=halves, device=device
        )
    except InputError:
        spread = {"rho_texts_se": float("nan"), "margin_texts_se": float("nan"), "n_half_samples": 0}
    return spread


def texts_columns(rho: float, margin: float, spread: dict | None) -> dict:
    from raygeom.numerics.uncertainty import normal_interval

    if spread is None:
        return {}
    rho_lo, rho_hi = normal_interval(rho, spread["rho_texts_se"])
    margin_lo, margin_hi = normal_interval(margin, spread["margin_texts_se"])
    return {
        "rho_texts_lo": rho_lo,
        "rho_texts_hi": rho_hi,
        "margin_texts_lo": margin_lo,
        "margin_texts_hi": margin_hi,
        "n_half_samples": spread["n_half_samples"],
    }


def null_chunks(params: PGAParams, start: int = 0, stop: int | None = None) -> list[list[int]]:
    """Null indices [start, stop) split into the job's number of chunks (the split never changes a number)."""
    indices = np.arange(start, params.n_null if stop is None else stop)
    return [list(map(int, c)) for c in np.array_split(indices, max(1, min(params.null_chunks, len(indices))))]


def more_nulls(params: PGAParams, rho: float, nulls: np.ndarray) -> list[list[int]]:
    """``--n-null auto``: the next block of null indices while z's 95 % half-width is above
    ``max(z_half_width, z_rel_width * |z|)``, or, below ``n_null_decide`` nulls, while its interval holds a
    decision threshold (:func:`raygeom.numerics.uncertainty.null_target_reached`).

    Decided only at block boundaries from the nulls so far, so the final count and z do not depend on
    how the nulls were split into chunks or tasks."""
    from raygeom.numerics.uncertainty import null_target_reached

    if not params.n_null_auto or null_target_reached(
        rho,
        nulls,
        params.z_half_width,
        params.n_null_cap,
        seed=params.seed,
        min_null=params.n_null,
        relative_target=params.z_rel_width,
        decide_cap=params.n_null_decide,
    ):
        return []
    return null_chunks(params, len(nulls), min(len(nulls) + AUTO_NULL_BLOCK, params.n_null_cap))


def check_params(info: dict, params: PGAParams, model: str, readout_components: int) -> None:
    """Everything that would make every layer fail, refused before any work."""
    from raygeom.numerics.limits import MIN_SAMPLES

    if not 0 < params.k < info["d"]:
        raise RaygeomError(f"k must satisfy 0 < k < d; got k={params.k}, d={info['d']} for {model}")
    if params.k > readout_components:
        raise RaygeomError(f"k={params.k} exceeds the {readout_components} readout components stored for {model}")
    if info["n_samples"] < MIN_SAMPLES:
        raise RaygeomError(f"need at least {MIN_SAMPLES} samples, got N={info['n_samples']}")
    if params.r >= min(info["n_samples"], info["d"]):
        raise RaygeomError(f"ccr={params.r} must be below min(N, d) = {min(info['n_samples'], info['d'])} for {model}")


def distinct_texts(texts: list[str]) -> int:
    return len(set(texts))


def check_corpus(name: str, texts: list[str], params: PGAParams, words: dict | None = None) -> str | None:
    """Refuse, before any work, a text sample with too few distinct texts for these settings: D distinct texts give
    a centred layer of rank at most D - 1, and a layer is scored only with rank k + 2 left after CCR-r. Returns the
    line that reports duplicates (None when every text is distinct)."""
    distinct, n = distinct_texts(texts), len(texts)
    need = params.k + params.r + 3
    if distinct < need:
        raise RaygeomError(
            f"the {n} texts sampled from corpus '{name}' hold {distinct} distinct texts; PGA with k={params.k} "
            f"after CCR-{params.r} needs at least {need} (rank k + 2 after CCR-r); use more distinct texts "
            f"or a smaller {(words or {}).get('k', '--k')}"
        )
    if distinct < n:
        return f"corpus '{name}': {n} texts sampled, {distinct} distinct (a duplicate adds no direction)"
    return None


def row(
    model: str, revision: str, layer: str, info: dict, params: PGAParams, rho: float, nulls: np.ndarray, note: str = ""
) -> dict:
    from raygeom.numerics.uncertainty import summarize_null, z_uncertainty

    if note:
        stats = {"null_mean": float("nan"), "null_std": float("nan"), "z": float("nan")}
    else:
        stats = {**summarize_null(rho, nulls), **z_uncertainty(rho, nulls, params.seed)}
    names = info["all_layers"]
    return {
        "model": model,
        "revision": revision,
        "layer": layer,
        "layer_index": layer_position.index(names, layer),
        "relative_depth": layer_position.relative_depth(names, layer),
        "k": params.k,
        "k_per_d": params.k_per_d,
        "r": params.r,
        "n_null": int(len(nulls)) if not note else params.n_null,
        "seed": params.seed,
        "rho_readout": float(rho),
        **stats,
        "d": info["d"],
        "fingerprint": info["fingerprint"],
        "note": note,
        **extraction_columns(info),
    }


def units(
    store: Store,
    model: str,
    revision: str,
    layers: list[str],
    params: PGAParams,
    info: dict | None = None,
    basis: np.ndarray | None = None,
) -> list[Unit]:
    """One unit per layer of one complete extraction."""
    info = info or store.completion(model, revision)
    if info is None:
        raise RaygeomError(f"no complete extraction of {model}@{revision} in {store.root}")
    params = for_width(params, info.get("d"))
    singular = None
    if basis is None:
        basis, singular = store.read_readout(model, revision, key=info["key"])
    check_params(info, params, model, basis.shape[1])
    if singular is not None:  # the API's rule (raygeom.numerics.pga.readout_basis), on the stored singular values
        from raygeom.numerics.rank import check_readout_rank

        d = int(info["d"])
        check_readout_rank(singular, params.k, (int(info.get("vocab_size") or d), d), f"the readout of {model}")
    basis = np.ascontiguousarray(basis[:, : params.k])
    device = "cuda" if params.gpus_per_task > 0 else "cpu"
    options = {"num_gpus": params.gpus_per_task} if params.gpus_per_task > 0 else {}
    chunks = null_chunks(params)
    root = str(store.root)
    out = []
    for layer in layers:
        key = pga_unit_key(info["key"], layer, params)

        def finish(values, layer=layer, key=key):
            rho, *null_parts = values
            spread = None
            if params.text_halves:  # the texts part sits after the first block's null chunks
                spread = null_parts.pop(len(chunks))
            nulls = np.concatenate(null_parts)
            if not np.isfinite(rho) or not np.isfinite(nulls).all() or float(np.std(nulls)) == 0.0:
                raise InputError(f"distances are constant after CCR-{params.r} or the nulls have no spread, so z is undefined")
            extra = more_nulls(params, rho, nulls)
            if extra:
                return More(tuple(Step(null_step, (PREPARED, params.k, params.seed, chunk, device), options) for chunk in extra))
            result = row(model, revision, layer, info, params, rho, nulls)
            result.update(texts_columns(rho, rho - result["null_mean"], spread), unit_key=key)
            return result

        def degenerate(reason: str, layer=layer, key=key) -> dict:
            return {
                **row(model, revision, layer, info, params, float("nan"), np.array([np.nan]), note=reason),
                "unit_key": key,
            }

        out.append(
            Unit(
                analysis="pga",
                key=key,
                label=f"{model}@{revision} {layer}",
                prepare=[Step(prepare_step, (root, model, revision, layer, params.r, info["key"], params.k))],
                parts=[Step(readout_step, (PREPARED, basis, device), options)]
                + [Step(null_step, (PREPARED, params.k, params.seed, chunk, device), options) for chunk in chunks]
                + (
                    [
                        Step(
                            texts_step,
                            (
                                root,
                                model,
                                revision,
                                layer,
                                params.r,
                                info["key"],
                                basis,
                                params.k,
                                params.seed,
                                params.text_halves,
                                device,
                            ),
                            options,
                        )
                    ]
                    if params.text_halves
                    else []
                ),
                finish=finish,
                degenerate=degenerate,
                extractions=((model, revision, info["key"]),),
            )
        )
    return out


def progress_units(n_layers: int, params: PGAParams) -> int:
    """What the engine's progress counts for ``n_layers`` PGA units."""
    return n_layers * (len(null_chunks(params)) + 2 + (1 if params.text_halves else 0))


@register
class SubspacePGA(Analysis):
    name = "pga"
    version = PGA_VERSION
    Params = PGAParams
    title = "Subspace PGA"
    needs = Needs(readout=True)
    columns = (
        "k",
        "k_per_d",
        "r",
        "n_null",
        "seed",
        "rho_readout",
        "null_mean",
        "null_std",
        "z",
        "z_se",
        "z_lo",
        "z_hi",
        "z_half_width",
        "p_upper",
        "p_lower",
        "rho_texts_lo",
        "rho_texts_hi",
        "margin_texts_lo",
        "margin_texts_hi",
        "note",
    )
    metrics = (Metric("z", "Subspace PGA z", "z_lo", "z_hi"),)
    series = ("k_per_d", "k", "r")
    measured = ("z_half_width",)  # z's 95 % half-width in a row; the --n-null auto target in PGAParams
    headline = ("k", "r", "n_null", "seed")

    def work(self, row: dict) -> float:
        return (row["n_null"] + 1) * float(row["n"]) ** 2

    def work_words(self, row: dict) -> str:
        return "(n_null + 1) x N^2"  # every subspace's Spearman over all N^2 pairs

    def reference_seconds(self, row: dict) -> float | None:
        from raygeom.analyses.pga_budget import reference_seconds_per_work

        return None if row.get("d") is None else reference_seconds_per_work(row["d"]) * self.work(row)

    def headline_values(self, params: PGAParams) -> dict:
        return {**super().headline_values(params), "n_null": "auto" if params.n_null_auto else params.n_null}

    def check_texts(self, params: PGAParams, corpus, width: int | None, words: dict) -> str | None:
        # k_per_d gives each width its own k: checked at the widest width known before any model loads (a [train]
        # run's); other models' units are refused by rank when they load.
        if params.k_per_d and width is None:
            return None
        return check_corpus(corpus.name, corpus.texts, for_width(params, width), words)

    def plan_lines(self, plan, cost) -> list[str]:
        """What ``n_null = "auto"`` may cost for the units still to compute (where a planned PGA has it)."""
        from raygeom.analyses.pga_budget import budget_lines, job_budget

        budget = job_budget(plan, cost.rate if cost is not None else None)
        return budget_lines(budget) if budget is not None else []

    def units(self, store, model, revision, layers, params: PGAParams, info):
        return units(store, model, revision, layers, params, info=info)

    def check(self, params: PGAParams, info: dict, model: str) -> None:
        from raygeom.replica.request import READOUT_COMPONENTS

        params.check_against(info["n_samples"], info.get("d"), READOUT_COMPONENTS, what=model, words=info.get("words"))

    def unit_key(self, extraction_key: str, layer: str, params: PGAParams) -> str:
        return pga_unit_key(extraction_key, layer, params)

    def progress_cost(self, params: PGAParams) -> int:
        return progress_units(1, params)
