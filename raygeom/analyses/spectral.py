"""Spectral metrics of each layer: RankMe, alpha-ReQ, condition number, isotropy (raygeom.numerics.spectral),
and the share of variance on PC1. One unit per (extraction, layer, k)."""

from __future__ import annotations

from dataclasses import dataclass

from raygeom.analyses.registry import Metric, Needs, Params, PerLayer, k_per_d_param, param, read_layer, register
from raygeom.errors import RaygeomError
from raygeom.params import MAX_SEED, MAX_WIDTH


@dataclass(frozen=True)
class SpectralParams(Params):
    k: int = param(100, "Readout subspace dimension for the PC1 readout share (k < d).", low=1, high=MAX_WIDTH)
    k_per_d: float = k_per_d_param()
    seed: int = param(0, "Seed of the half-samples of the intervals over texts.", low=0, high=MAX_SEED)
    text_halves: int = param(10, "Half-samples of the texts for the intervals (none where N/2 < d).", low=2, high=1000)


def spectral_task(root: str, model: str, revision: str, layer: str, k: int, seed: int, halves: int, key: str) -> dict:
    from raygeom.numerics import layer_geometry, spectral
    from raygeom.store.tree import Store

    h = read_layer(root, model, revision, layer, key)[1]
    basis, _ = Store(root).read_readout(model, revision, key)
    summary = spectral.spectral_summary(h, basis[:, :k])
    summary["pc1_variance_fraction"] = layer_geometry.pc1_variance_fraction(h)
    return {**summary, **spectral.spectral_intervals(h, seed, halves, full=summary)}


def check_k(info: dict, k: int, model: str) -> None:
    if info.get("d") is not None and not 0 < k < info["d"]:
        raise RaygeomError(f"k must satisfy 0 < k < d; got k={k}, d={info['d']} for {model}")


@register
class Spectral(PerLayer):
    name = "spectral"
    version = 3  # 3: an interval over texts for each metric; shares its units with `raygeom diagnose`
    Params = SpectralParams
    title = "Spectral metrics"
    needs = Needs(readout=True)
    columns = (
        "k",
        "k_per_d",
        "rankme",
        "rankme_centred",
        "alpha_req",
        "alpha_req_r2",
        "condition_number",
        "isotropy",
        "pc1_readout_share",
        "pc1_readout_chance",
        "pc1_variance_fraction",
        "seed",
        # raygeom.numerics.spectral.SPECTRAL_INTERVALS (not imported here: declaring an analysis imports no numerics)
        *(f"{m}_{part}" for m in ("rankme", "alpha_req", "isotropy", "condition_number") for part in ("se", "lo", "hi")),
        "spectral_half_samples",
        "spectral_interval_note",
    )
    metrics = (
        Metric("rankme", "RankMe", "rankme_lo", "rankme_hi"),
        Metric("alpha_req", "alpha-ReQ", "alpha_req_lo", "alpha_req_hi"),
        Metric("isotropy", "isotropy", "isotropy_lo", "isotropy_hi"),
        Metric("condition_number", "condition number", "condition_number_lo", "condition_number_hi"),
    )
    series = ("k_per_d", "k")
    task = spectral_task
    arguments = ("k", "seed", "text_halves")

    def check(self, params: SpectralParams, info: dict, model: str) -> None:
        check_k(info, params.k, model)
