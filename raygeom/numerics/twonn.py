"""TwoNN intrinsic dimension of one layer (Facco, d'Errico, Rodriguez & Laio 2017, Sci. Rep. 7:12140).

For each point, ``mu = r2 / r1``, the ratio of the Euclidean distances to its second and first nearest
neighbours. On a d-dimensional manifold with locally uniform density, ``mu`` is Pareto distributed with
``F(mu) = 1 - mu^-d``, so ``-log(1 - F(mu)) = d log(mu)``:

- ``twonn_dimension`` fits that line through the origin on the empirical F, after discarding the largest
  ``discard_fraction`` of the mu (the paper's recipe, and scikit-dimension's ``skdim.id.TwoNN`` default);
- ``twonn_mle`` is the maximum-likelihood estimate ``N / sum(log mu)``, whose exact 95 % interval follows
  from ``2 d sum(log mu) ~ chi2(2N)``.

Points that coincide (duplicated texts) have r1 = 0 and are dropped: their mu is undefined.
"""

from __future__ import annotations

import numpy as np

from raygeom.errors import InputError
from raygeom.numerics.distributions import chi2_quantile

MIN_POINTS = 3
LEVEL = 0.95


def neighbour_ratios(h: np.ndarray) -> np.ndarray:
    """``mu_i = r2 / r1`` of every point whose nearest neighbour is at a positive distance."""
    h = np.asarray(h, dtype=np.float64)
    if h.ndim != 2 or h.shape[0] < MIN_POINTS:
        raise InputError(f"TwoNN needs an N x d matrix with N >= {MIN_POINTS}, got shape {h.shape}")
    if not np.isfinite(h).all():
        raise InputError("TwoNN: the layer holds NaN or infinite values")
    squared = np.einsum("ij,ij->i", h, h)
    distances = squared[:, None] + squared[None, :] - 2.0 * (h @ h.T)
    np.fill_diagonal(distances, np.inf)
    # The Gram identity finds the nearest candidates fast but leaves rounding of order sqrt(eps)|h| where points
    # coincide; the candidates' distances are recomputed from differences, so a duplicate's r1 is exactly 0.
    width = min(4, h.shape[0] - 1)
    candidates = np.argpartition(distances, width - 1, axis=1)[:, :width]
    exact = np.sort(np.linalg.norm(h[candidates] - h[:, None, :], axis=2), axis=1)
    r1, r2 = exact[:, 0], exact[:, 1]
    keep = r1 > 0
    if keep.sum() < MIN_POINTS:
        raise InputError(f"TwoNN: only {int(keep.sum())} points have a distinct nearest neighbour")
    return r2[keep] / r1[keep]


def twonn_dimension(h: np.ndarray, discard_fraction: float = 0.1) -> float:
    """The TwoNN estimate by the paper's linear fit (through the origin, the top ``discard_fraction`` of mu dropped)."""
    if not 0.0 <= discard_fraction < 1.0:
        raise InputError(f"discard_fraction must lie in [0, 1), got {discard_fraction}")
    mu = np.sort(neighbour_ratios(h))
    n = mu.size
    empirical = np.arange(1, n + 1, dtype=np.float64) / n
    kept = min(int(np.floor(n * (1.0 - discard_fraction))), n - 1)  # F = 1 at the largest mu: -log(0)
    x = np.log(mu[:kept])
    y = -np.log(1.0 - empirical[:kept])
    if not np.any(x > 0):
        raise InputError("TwoNN: every kept neighbour ratio is 1, so the dimension is undefined")
    return float(np.dot(x, y) / np.dot(x, x))


def twonn_mle(h: np.ndarray, level: float = LEVEL) -> dict[str, float]:
    """Maximum-likelihood dimension with its exact interval: ``2 d S ~ chi2(2n)``, ``S = sum(log mu)``."""
    mu = neighbour_ratios(h)
    total = float(np.log(mu).sum())
    if not total > 0:
        raise InputError("TwoNN: every neighbour ratio is 1, so the dimension is undefined")
    n = mu.size
    tail = (1.0 - level) / 2.0
    return {
        "twonn_mle": n / total,
        "twonn_mle_lo": chi2_quantile(tail, 2 * n) / (2 * total),
        "twonn_mle_hi": chi2_quantile(1.0 - tail, 2 * n) / (2 * total),
        "twonn_points": n,
    }
