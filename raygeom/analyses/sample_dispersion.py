"""Sample-level representation dispersion of each layer (METRICS.md, "Dispersion" (b)): the mean pairwise cosine
distance of the RAW pooled vectors of the N samples, with a delete-one jackknife interval over the samples. The
token-level dispersion within chunks, its perplexity groups, slices and gap G are ``raygeom dispersion``."""

from __future__ import annotations

from dataclasses import dataclass

from raygeom.analyses.registry import Metric, Params, PerLayer, param, read_layer, register


@dataclass(frozen=True)
class SampleDispersionParams(Params):
    level: float = param(
        0.95, "Coverage of the jackknife interval over the samples.", low=0.0, high=1.0, low_open=True, high_open=True
    )


def sample_dispersion_task(root: str, model: str, revision: str, layer: str, level: float, key: str) -> dict:
    from raygeom.numerics.dispersion import sample_dispersion_interval

    h = read_layer(root, model, revision, layer, key)[1]
    return sample_dispersion_interval(h, level)


@register
class SampleDispersion(PerLayer):
    name = "sample_dispersion"
    version = 2  # 2: the interval on the logit scale of D / 2 (inside [0, 2])
    Params = SampleDispersionParams
    title = "Sample-level dispersion"
    columns = ("level", "dispersion", "dispersion_se", "dispersion_lo", "dispersion_hi")
    metrics = (
        Metric(
            "dispersion",
            "dispersion (mean pairwise cosine distance of the pooled vectors)",
            "dispersion_lo",
            "dispersion_hi",
            level="level",  # its coverage is a parameter: labels name each row's
        ),
    )
    series = ("level",)
    task = sample_dispersion_task
    arguments = ("level",)
