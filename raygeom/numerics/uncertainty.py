"""Uncertainty of the numbers users decide on. Pure functions: arrays in, numbers out.

z's Monte-Carlo error: z = (rho - mean(nulls)) / std(nulls) is estimated from a finite set of null
subspaces, so a second draw of nulls gives another z. :func:`z_uncertainty` bootstraps over the null
draws (resampling the n null rhos with replacement, seeded) and reports the bootstrap standard error
and the 95 % percentile interval of z, beside the empirical p-values of rho among the nulls. For
Gaussian nulls the standard error agrees with the delta method, se(z) ~ sqrt((1 + z^2 / 2) / n).
"""

from __future__ import annotations

import numpy as np

from raygeom.errors import InputError

N_BOOT = 2000
BOOT_STREAM = 0xB007  # second seed word: bootstrap draws never share a stream with the null subspaces


def z_uncertainty(rho: float, nulls, seed: int = 0, n_boot: int = N_BOOT, level: float = 0.95) -> dict[str, float]:
    """z of ``rho`` against ``nulls``, with its bootstrap standard error over the null draws, its
    ``level`` percentile interval (and half its width), and the upper/lower empirical p-values
    (1 + #{null >= rho}) / (1 + n) and (1 + #{null <= rho}) / (1 + n)."""
    nulls = np.asarray(nulls, dtype=np.float64).ravel()
    n = nulls.size
    if n < 2 or not np.isfinite(nulls).all() or not np.isfinite(rho):
        raise InputError("need at least 2 finite null rhos and a finite rho")
    std = nulls.std(ddof=1)
    if std == 0:
        raise InputError("the null rhos have no spread, so z is undefined")
    z = (rho - nulls.mean()) / std
    rng = np.random.default_rng([int(seed), BOOT_STREAM])
    samples = nulls[rng.integers(0, n, size=(n_boot, n))]
    spread = samples.std(axis=1, ddof=1)
    boot = (rho - samples.mean(axis=1)[spread > 0]) / spread[spread > 0]
    alpha = (1.0 - level) / 2
    low, high = np.quantile(boot, [alpha, 1.0 - alpha]) if boot.size else (np.nan, np.nan)
    return {"z_se": float(boot.std(ddof=1)) if boot.size > 1 else float("nan"), "z_lo": float(low), "z_hi": float(high),
            "z_half_width": float((high - low) / 2), "p_upper": float((1 + np.sum(nulls >= rho)) / (1 + n)),
            "p_lower": float((1 + np.sum(nulls <= rho)) / (1 + n))}


def z_delta_se(z: float, n: int) -> float:
    """The delta-method standard error of z from n Gaussian null draws: sqrt((1 + z^2 / 2) / n)."""
    return float(np.sqrt((1.0 + z * z / 2.0) / n))
