"""Spearman's rank correlation with an interval, for a handful of paired values (checkpoints, models).

Two intervals, because with n around 10-20 neither is reliable alone:
- Fisher z with the Fieller-Hartley-Pearson variance for Spearman, ``1.06 / (n - 3)``;
- a percentile bootstrap over the pairs (resamples whose ranks are all tied carry no correlation and
  are dropped; how many were kept is reported).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from raygeom.numerics.distributions import normal_quantile, pearson_rows
from raygeom.numerics.pga import average_ranks


@dataclass(frozen=True)
class SpearmanInterval:
    rho: float
    n: int
    level: float
    fisher_lo: float
    fisher_hi: float
    boot_lo: float
    boot_hi: float
    n_boot: int  # resamples that gave a defined correlation


def spearman_with_ci(x, y, level: float = 0.95, n_boot: int = 2000, seed: int = 0) -> SpearmanInterval:
    """Spearman's rho of paired ``x`` and ``y`` (ties share their average rank) with Fisher-z and bootstrap intervals."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"x and y must be 1-D of one length, got {x.shape} and {y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("x and y must be finite")
    n = x.shape[0]
    if n < 4:
        raise ValueError(f"an interval for Spearman's rho needs at least 4 pairs, got {n}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    rho = float(pearson_rows(average_ranks(x), average_ranks(y)))
    quantile = normal_quantile(0.5 + level / 2)
    if math.isfinite(rho):
        centre = math.atanh(max(-1 + 1e-12, min(1 - 1e-12, rho)))
        half = quantile * math.sqrt(1.06 / (n - 3))
        fisher = (math.tanh(centre - half), math.tanh(centre + half))
    else:
        fisher = (float("nan"), float("nan"))
    rng = np.random.default_rng([seed, 0x5BEA])
    draws = rng.integers(0, n, size=(n_boot, n))
    boot = pearson_rows(np.apply_along_axis(average_ranks, 1, x[draws]), np.apply_along_axis(average_ranks, 1, y[draws]))
    boot = boot[np.isfinite(boot)]
    tail = (1 - level) / 2
    lo, hi = (np.quantile(boot, [tail, 1 - tail]) if boot.size else (float("nan"), float("nan")))
    return SpearmanInterval(rho, n, level, fisher[0], fisher[1], float(lo), float(hi), int(boot.size))
