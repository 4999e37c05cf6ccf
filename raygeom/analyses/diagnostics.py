"""Ray orchestration of the per-layer diagnostics around Subspace PGA.

For one complete extraction (model, revision) in the store, and each chosen layer:

- ``spectral``: RankMe, alpha-ReQ, condition number, isotropy of the centred H,
  the PC1 readout share ``||V_k^T u_1||^2`` beside its chance level k/d, and
  PC1's share of the variance;
- ``pga`` at CCR-r for every r in ``ccr_ranks`` (the restoration analysis),
  through the same units as ``raygeom pga`` (raygeom.analyses.pga), so they are shared;
- ``sample_geometry``: per sample, the share of its CCR-r corrected vector's
  energy in the readout subspace, next to that sample's mean next-token NLL,
  and their rank correlation across samples;
- ``probe``: a multinomial logistic-regression probe on the layer with the
  corpus labels, fixed stratified split.

Each (metric, layer) is one unit of the engine (raygeom.engine.units) and one Parquet file under
``results/<metric>/``; a unit already there is read back, not recomputed. No Ray here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from raygeom.analyses import pga as pga_analysis
from raygeom.analyses.pga import read_keyed_layer
from raygeom.analyses.provenance import layer_row
from raygeom.engine.contract import Step, Unit
from raygeom.errors import RaygeomError
from raygeom.params import PGAParams
from raygeom.store.tree import Store, content_key

DIAGNOSTICS_VERSION = 2  # 2: probe rows carry the Wilson interval of accuracy
DEFAULT_CCR_RANKS = (0, 1, 5, 10)


@dataclass(frozen=True)
class DiagnosticsParams:
    k: int = 100
    ccr_ranks: tuple[int, ...] = DEFAULT_CCR_RANKS
    n_null: int = 100
    null_chunks: int = 4
    seed: int = 0
    sample_ccr: int = 1
    probe: bool = True
    probe_test_fraction: float = 0.25
    probe_c: float = 1.0
    n_null_auto: bool = False  # --n-null auto for every PGA unit (raygeom.params.PGAParams)
    z_half_width: float = 0.25
    z_rel_width: float = 0.05
    n_null_cap: int = 1000
    n_null_decide: int = 500

    def __post_init__(self):
        if self.k <= 0:
            raise RaygeomError(f"k must be positive, got {self.k}")
        if not self.ccr_ranks or any(r < 0 for r in self.ccr_ranks):
            raise RaygeomError(f"CCR ranks must be a non-empty list of integers >= 0, got {list(self.ccr_ranks)}")
        if self.n_null < 2:
            raise RaygeomError(f"n-null must be at least 2, got {self.n_null}")
        if not 0.0 < self.probe_test_fraction < 1.0:
            raise RaygeomError(f"probe test fraction must lie in (0, 1), got {self.probe_test_fraction}")

    def pga(self, r: int) -> PGAParams:
        return PGAParams(
            k=self.k,
            r=r,
            n_null=self.n_null,
            seed=self.seed,
            null_chunks=self.null_chunks,
            n_null_auto=self.n_null_auto,
            z_half_width=self.z_half_width,
            z_rel_width=self.z_rel_width,
            n_null_cap=self.n_null_cap,
            n_null_decide=self.n_null_decide,
        )


def _run(store: Store, units: list[Unit], progress: Callable[[int], None] | None) -> list[dict]:
    from raygeom.engine.units import run_units

    return run_units(store, units, progress)


def _sample_geometry_task(root: str, model: str, revision: str, layer: str, k: int, r: int, key: str) -> tuple[dict, dict]:
    store = Store(root)
    h = read_keyed_layer(root, model, revision, layer, key)
    ids = store.read_layer(model, revision, layer, key)[0]
    basis, _ = store.read_readout(model, revision, key)
    samples = store.read_samples(model, revision, key)
    order = np.argsort(samples["sample_id"].to_numpy())
    sample_ids = samples["sample_id"].to_numpy()[order]
    if not np.array_equal(sample_ids, ids):
        raise RaygeomError(f"samples table and layer {layer} hold different sample ids")
    nll = samples["nll"].to_numpy()[order]
    from raygeom.numerics import layer_geometry  # torch: in the task, not when the registry imports this module

    share = layer_geometry.per_sample_readout_share(h, basis[:, :k], r)
    summary = layer_geometry.loss_geometry_correlation(nll, share)
    interval = _spearman_interval(nll, share, summary["spearman"])
    per_sample = {"sample_id": ids.astype(np.int32), "nll": nll, "readout_share": share}
    return {
        "loss_share_spearman": summary["spearman"],
        "loss_share_spearman_lo": interval["lo"],
        "loss_share_spearman_hi": interval["hi"],
        "loss_share_pearson": summary["pearson"],
        "readout_share_mean": float(np.nanmean(share)),
        "readout_share_chance": k / h.shape[1],
        "nll_mean": float(np.mean(nll)),
    }, per_sample


def _spearman_interval(nll, share, rho: float) -> dict[str, float]:
    """The Spearman correlation's 95 % interval over samples (Fisher's z with the Bonett-Wright variance); none
    (NaN) where the correlation has none: too few samples, a constant column, or |rho| = 1."""
    from raygeom.numerics.uncertainty import spearman_with_ci

    keep = np.isfinite(nll) & np.isfinite(share)
    if keep.sum() < 4 or not np.isfinite(rho):
        return {"lo": float("nan"), "hi": float("nan")}
    return spearman_with_ci(nll[keep], share[keep])


def _layer_units(
    store: Store,
    metric: str,
    info: dict,
    model: str,
    revision: str,
    layers: list[str],
    key_parts: tuple,
    task: Callable,
    args: tuple,
    finish: Callable[[str, object], list[dict] | dict],
) -> list[Unit]:
    """One unit per layer: ``task(root, model, revision, layer, *args, extraction key)``, rows from ``finish``."""
    root = str(store.root)
    return [
        Unit(
            analysis=metric,
            key=content_key(metric, DIAGNOSTICS_VERSION, info["key"], layer, *key_parts),
            label=f"{model}@{revision} {layer} ({metric})",
            parts=[Step(task, (root, model, revision, layer, *args, info["key"]))],
            finish=lambda values, layer=layer: finish(layer, values[0]),
            extractions=((model, revision, info["key"]),),
        )
        for layer in layers
    ]


def _complete(store: Store, model: str, revision: str, key: str | None = None) -> dict:
    """The marker of the extraction ``key`` (without it, of the revision's one extraction), its layers all there."""
    info = store.completion(model, revision, key)
    if info is None or (key is not None and info.get("key") != key):
        raise RaygeomError(f"no complete extraction of {model}@{revision} in {store.root}")
    missing = [layer for layer in info["layers"] if not store.layer_path(model, revision, layer, info["key"]).is_file()]
    if missing:
        raise RaygeomError(f"extraction of {model}@{revision} lacks layer files: {', '.join(missing)}")
    return info


def _check_k(info: dict, k: int, model: str) -> None:
    if not 0 < k < info["d"]:
        raise RaygeomError(f"k must satisfy 0 < k < d; got k={k}, d={info['d']} for {model}")


def run_spectral(
    store: Store,
    model: str,
    revision: str,
    layers: list[str],
    k: int,
    progress: Callable[[int], None] | None = None,
    key: str | None = None,
) -> list[dict]:
    from raygeom.analyses.spectral import Spectral, SpectralParams

    info = _complete(store, model, revision, key)
    _check_k(info, k, model)
    return _run(store, Spectral().units(store, model, revision, layers, SpectralParams(k=k), info), progress)


def run_sample_geometry(
    store: Store,
    model: str,
    revision: str,
    layers: list[str],
    k: int,
    r: int = 1,
    progress: Callable[[int], None] | None = None,
    key: str | None = None,
) -> list[dict]:
    """Per-layer summary rows; the per-sample rows go to ``results/sample_geometry_samples/``."""
    info = _complete(store, model, revision, key)
    _check_k(info, k, model)

    def finish(layer: str, value) -> dict:
        summary, per_sample = value
        base = layer_row(model, revision, layer, info)
        # The per-sample table is written before its summary unit, so a summary never exists without it.
        store.write_result(
            "sample_geometry_samples",
            content_key("samples", info["key"], layer, k, r),
            [
                {
                    "model": model,
                    "revision": revision,
                    "layer": layer,
                    "layer_index": base["layer_index"],
                    "k": k,
                    "r": r,
                    "sample_id": int(i),
                    "nll": float(loss),
                    "readout_share": float(share),
                }
                for i, loss, share in zip(per_sample["sample_id"], per_sample["nll"], per_sample["readout_share"])
            ],
        )
        return {**base, "k": k, "r": r, **summary}

    return _run(
        store,
        _layer_units(store, "sample_geometry", info, model, revision, layers, (k, r), _sample_geometry_task, (k, r), finish),
        progress,
    )


def run_probes(
    store: Store,
    model: str,
    revision: str,
    layers: list[str],
    seed: int = 0,
    test_fraction: float = 0.25,
    c: float = 1.0,
    progress: Callable[[int], None] | None = None,
    key: str | None = None,
) -> list[dict]:
    from raygeom.analyses.probe import Probe, ProbeParams

    info = _complete(store, model, revision, key)
    params = ProbeParams(seed=seed, test_fraction=test_fraction, c=c)
    return _run(store, Probe().units(store, model, revision, layers, params, info), progress)


def run_restoration(
    store: Store,
    model: str,
    revision: str,
    layers: list[str],
    params: DiagnosticsParams,
    progress: Callable[[int], None] | None = None,
    key: str | None = None,
) -> list[dict]:
    """Subspace PGA of every layer at CCR-r for each r in ``params.ccr_ranks``."""
    info = _complete(store, model, revision, key)
    limit = min(info["n_samples"], info["d"])
    too_big = [r for r in params.ccr_ranks if r >= limit]
    if too_big:
        raise RaygeomError(f"CCR rank(s) {too_big} must be below min(N, d) = {limit} for {model}")
    basis = store.read_readout(model, revision, info["key"])[0]
    return _run(
        store,
        [
            unit
            for r in params.ccr_ranks
            for unit in pga_analysis.units(store, model, revision, layers, params.pga(r), info, basis)
        ],
        progress,
    )


def read_sample_rows(
    store: Store, model: str, revision: str, layers: list[str], k: int, r: int, key: str | None = None
) -> list[dict]:
    """The per-sample rows (sample_id, nll, readout_share) of these layers, loss and geometry side by side."""
    info = _complete(store, model, revision, key)
    keys = [content_key("samples", info["key"], layer, k, r) for layer in layers]
    return store.read_results("sample_geometry_samples", keys).to_pylist()


def units(layers: list[str], params: DiagnosticsParams) -> int:
    """Progress units :func:`run_diagnostics` reports for one extraction."""
    per_pga = pga_analysis.progress_units(1, params.pga(0))
    return len(layers) * (len(params.ccr_ranks) * per_pga + 2 + (1 if params.probe else 0))


def run_diagnostics(
    store: Store,
    model: str,
    revision: str,
    layers: list[str],
    params: DiagnosticsParams,
    progress: Callable[[int], None] | None = None,
    key: str | None = None,
) -> dict[str, list[dict]]:
    """Every per-layer diagnostic of the extraction ``key`` (without it, of the revision's one extraction), plus one
    merged row per layer under ``"layers"``."""
    info = _complete(store, model, revision, key)
    _check_k(info, params.k, model)
    key = info["key"]
    out = {
        "spectral": run_spectral(store, model, revision, layers, params.k, progress, key),
        "sample_geometry": run_sample_geometry(store, model, revision, layers, params.k, params.sample_ccr, progress, key),
        "pga": run_restoration(store, model, revision, layers, params, progress, key),
    }
    out["probe"] = (
        run_probes(store, model, revision, layers, params.seed, params.probe_test_fraction, params.probe_c, progress, key)
        if params.probe
        else []
    )
    out["layers"] = merge_layer_rows(out)
    return out


# What a merged layer row takes from the spectral part (raygeom.analyses.diagnose declares them among its columns).
SPECTRAL_COLUMNS = (
    "k",
    "rankme",
    "alpha_req",
    "condition_number",
    "isotropy",
    "pc1_readout_share",
    "pc1_readout_chance",
    "pc1_variance_fraction",
)


def merge_layer_rows(parts: dict[str, list[dict]]) -> list[dict]:
    """One row per (model, revision, layer): z at each CCR rank, spectral metrics, PC1 share, loss link, probe."""
    merged: dict[tuple, dict] = {}
    for row in parts["spectral"]:
        merged[(row["model"], row["revision"], row["layer"])] = {
            name: row[name]
            for name in (
                "model",
                "revision",
                "layer",
                "layer_index",
                "relative_depth",
                "n",
                "d",
                *SPECTRAL_COLUMNS,
            )
        }
    for row in parts["pga"]:
        target = merged.get((row["model"], row["revision"], row["layer"]))
        if target is not None:
            target[f"z_ccr{row['r']}"] = row["z"]
            target[f"z_half_width_ccr{row['r']}"] = row.get("z_half_width")
            target[f"n_null_ccr{row['r']}"] = row.get("n_null")
            target[f"rho_readout_ccr{row['r']}"] = row["rho_readout"]
    for row in parts["sample_geometry"]:
        target = merged.get((row["model"], row["revision"], row["layer"]))
        if target is not None:
            target.update(
                {
                    "nll_mean": row["nll_mean"],
                    "loss_share_spearman": row["loss_share_spearman"],
                    # rows stored before the interval was added have none
                    "loss_share_spearman_lo": row.get("loss_share_spearman_lo"),
                    "loss_share_spearman_hi": row.get("loss_share_spearman_hi"),
                    "readout_share_mean": row["readout_share_mean"],
                }
            )
    for row in parts.get("probe", []):
        target = merged.get((row["model"], row["revision"], row["layer"]))
        if target is not None:
            target.update(
                {
                    "probe_accuracy": row["accuracy"],
                    "probe_accuracy_lo": row.get("accuracy_lo"),
                    "probe_accuracy_hi": row.get("accuracy_hi"),
                    "probe_chance": row["chance"],
                    "probe_converged": row["converged"],
                }
            )
    for name in ("spectral", "pga", "sample_geometry", "probe"):  # a merged row costs its parts' units together
        for row in parts.get(name, []):
            target = merged.get((row["model"], row["revision"], row["layer"]))
            if target is not None and row.get("cpu_seconds") is not None:
                target["cpu_seconds"] = target.get("cpu_seconds", 0.0) + row["cpu_seconds"]
    return sorted(merged.values(), key=lambda r: (r["model"], r["revision"], r["layer_index"], r.get("relative_depth") or 0.0))
