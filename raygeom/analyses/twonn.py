"""TwoNN intrinsic dimension of each layer (Facco et al. 2017; raygeom.numerics.twonn): the paper's linear
fit, as scikit-dimension computes it, and the maximum-likelihood estimate with its exact 95 % interval."""

from __future__ import annotations

from dataclasses import dataclass

from raygeom.analyses.registry import Metric, Params, PerLayer, param, read_layer, register


@dataclass(frozen=True)
class TwoNNParams(Params):
    discard_fraction: float = param(
        0.1, "Share of the largest neighbour ratios left out of the linear fit.", low=0.0, high=1.0, high_open=True
    )


def twonn_task(root: str, model: str, revision: str, layer: str, discard_fraction: float, key: str) -> dict:
    from raygeom.numerics import twonn

    h = read_layer(root, model, revision, layer, key)[1]
    return {"twonn": twonn.twonn_dimension(h, discard_fraction), **twonn.twonn_mle(h)}


@register
class TwoNN(PerLayer):
    name = "twonn"
    version = 1
    Params = TwoNNParams
    title = "TwoNN intrinsic dimension"
    columns = ("discard_fraction", "twonn", "twonn_mle", "twonn_mle_lo", "twonn_mle_hi", "twonn_points")
    metrics = (Metric("twonn_mle", "TwoNN dimension (MLE)", "twonn_mle_lo", "twonn_mle_hi"),)
    series = ("discard_fraction",)
    task = twonn_task
    arguments = ("discard_fraction",)
