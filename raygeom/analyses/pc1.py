"""PC1 readout share of each layer: how much of the top principal direction of the centred layer lies in the
readout subspace V_k of W_U, beside its chance level k/d, with an interval over texts. The PGA paper's
"PC1 migrates out of the readout subspace" is this number over checkpoints."""

from __future__ import annotations

from dataclasses import dataclass

from raygeom.analyses.registry import Metric, Needs, Params, PerLayer, k_per_d_param, param, read_layer, register
from raygeom.analyses.spectral import check_k
from raygeom.params import MAX_SEED, MAX_WIDTH


@dataclass(frozen=True)
class PC1Params(Params):
    k: int = param(100, "Readout subspace dimension (k < d).", low=1, high=MAX_WIDTH)
    k_per_d: float = k_per_d_param()
    seed: int = param(0, "Seed of the half-samples of the interval over texts.", low=0, high=MAX_SEED)
    text_halves: int = param(10, "Half-samples of the texts for the interval.", low=2, high=1000)


def pc1_task(root: str, model: str, revision: str, layer: str, k: int, seed: int, halves: int, key: str) -> dict:
    from raygeom.numerics import layer_geometry, spectral
    from raygeom.store.tree import Store

    h = read_layer(root, model, revision, layer, key)[1]
    basis, _ = Store(root).read_readout(model, revision, key)
    return {
        **spectral.pc1_readout_share_interval(h, basis[:, :k], seed, halves),
        "pc1_variance_fraction": layer_geometry.pc1_variance_fraction(h),
    }


@register
class PC1Share(PerLayer):
    name = "pc1"
    version = 2  # 2: the interval on the logit scale (inside [0, 1]), not clipped
    Params = PC1Params
    title = "PC1 readout share"
    needs = Needs(readout=True)
    columns = (
        "k",
        "k_per_d",
        "seed",
        "pc1_readout_share",
        "pc1_readout_share_lo",
        "pc1_readout_share_hi",
        "pc1_readout_share_se",
        "pc1_readout_chance",
        "pc1_variance_fraction",
        "n_half_samples",
    )
    metrics = (
        Metric(
            "pc1_readout_share", "PC1 readout share", "pc1_readout_share_lo", "pc1_readout_share_hi", chance="pc1_readout_chance"
        ),
    )
    series = ("k_per_d", "k")
    task = pc1_task
    arguments = ("k", "seed", "text_halves")

    def check(self, params: PC1Params, info: dict, model: str) -> None:
        check_k(info, params.k, model)
