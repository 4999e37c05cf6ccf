"""Small pure helpers around the PGA diagnostics: per-sample geometry beside loss,
sample alignment across tokenizers, depth matching, and spectral-blindness summaries."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from raygeom.errors import InputError
from raygeom.numerics.distributions import pearson, spearman
from raygeom.numerics.pga import _check_matrix, ccr


def pc1_variance_fraction(h: np.ndarray) -> float:
    """Share of the centred ``H``'s total variance on its top principal direction."""
    h = _check_matrix("H", h).astype(np.float64)
    s = np.linalg.svd(h - h.mean(axis=0), compute_uv=False)
    total = float(np.sum(s**2))
    if total == 0.0:
        raise InputError("H has no variance: every sample is the same vector")
    return float(s[0] ** 2 / total)


def per_sample_readout_share(h: np.ndarray, basis: np.ndarray, r: int = 1) -> np.ndarray:
    """For each sample, ``||V_k^T x_i||^2 / ||x_i||^2`` of its CCR-r corrected vector ``x_i``.

    ``basis`` is ``d x k`` orthonormal. A random direction has expected share ``k/d``;
    a zero row (possible after CCR) gets NaN.
    """
    h = _check_matrix("H", h)
    basis = _check_matrix("readout basis", basis).astype(np.float64)
    if basis.shape[0] != h.shape[1]:
        raise InputError(f"readout basis has {basis.shape[0]} rows but H has d={h.shape[1]}")
    x = ccr(h, r)
    inside = np.sum((x @ basis) ** 2, axis=1)
    total = np.sum(x**2, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, inside / total, np.nan)


def loss_geometry_correlation(nll: np.ndarray, geometry: np.ndarray) -> dict[str, float]:
    """Spearman and Pearson correlation across samples of per-sample loss and a per-sample geometric value."""
    nll, geometry = np.asarray(nll, dtype=np.float64), np.asarray(geometry, dtype=np.float64)
    if nll.shape != geometry.shape or nll.ndim != 1:
        raise InputError(f"loss and geometry must be 1-D of the same length; got {nll.shape} and {geometry.shape}")
    keep = np.isfinite(nll) & np.isfinite(geometry)
    if keep.sum() < 3 or np.ptp(nll[keep]) == 0 or np.ptp(geometry[keep]) == 0:
        return {"spearman": float("nan"), "pearson": float("nan")}
    return {"spearman": spearman(nll[keep], geometry[keep]), "pearson": pearson(nll[keep], geometry[keep])}


def align_by_key(keys_a: Sequence[str], keys_b: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Row indices ``(ia, ib)`` such that ``keys_a[ia] == keys_b[ib]``, in A's order.

    A key that occurs several times (a corpus with duplicate texts) is matched
    occurrence by occurrence: the j-th copy in A with the j-th copy in B.
    Keys present on one side only are dropped.
    """
    seen: dict[str, list[int]] = {}
    for j, key in enumerate(keys_b):
        seen.setdefault(key, []).append(j)
    used: dict[str, int] = {}
    ia, ib = [], []
    for i, key in enumerate(keys_a):
        candidates = seen.get(key)
        occurrence = used.get(key, 0)
        if candidates is not None and occurrence < len(candidates):
            ia.append(i)
            ib.append(candidates[occurrence])
            used[key] = occurrence + 1
    return np.asarray(ia, dtype=np.int64), np.asarray(ib, dtype=np.int64)


def relative_depths(n_layers: int) -> np.ndarray:
    """Relative depth of each of ``n_layers`` layers: 0 for the first, 1 for the last."""
    if n_layers < 1:
        raise InputError("a model needs at least one layer")
    return np.linspace(0.0, 1.0, n_layers) if n_layers > 1 else np.zeros(1)


def blindness_summary(z: Sequence[float], metric: Sequence[float]) -> dict[str, float]:
    """How much a per-layer metric moves compared with z, over the same layers.

    ``z_range`` is max - min of z (in null standard deviations);
    ``metric_relative_range`` is (max - min) / median(|metric|) of the metric;
    ``spearman_with_z`` its rank correlation with z across layers.
    """
    z, metric = np.asarray(z, dtype=np.float64), np.asarray(metric, dtype=np.float64)
    if z.shape != metric.shape or z.ndim != 1:
        raise InputError(f"z and metric must be 1-D of the same length; got {z.shape} and {metric.shape}")
    keep = np.isfinite(z) & np.isfinite(metric)
    if keep.sum() < 3:
        raise InputError("need at least 3 layers with finite z and metric")
    z, metric = z[keep], metric[keep]
    median = float(np.median(np.abs(metric)))
    rho = spearman(z, metric) if np.ptp(z) > 0 and np.ptp(metric) > 0 else float("nan")
    return {
        "z_range": float(np.ptp(z)),
        "metric_relative_range": float(np.ptp(metric) / median) if median > 0 else float("inf"),
        "spearman_with_z": rho,
    }
