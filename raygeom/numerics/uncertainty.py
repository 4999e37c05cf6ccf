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


def half_sample_spread(h, basis, r: int, k: int, seed: int = 0, n_half: int = 10, n_null: int = 10,
                       device: str | None = None) -> dict[str, float]:
    """Standard errors over texts of the readout rho and of the PGA margin (rho - mean of nulls), by the
    delete-d jackknife with d = N/2: ``n_half`` seeded subsets of half the texts (drawn without
    replacement, so a duplicated text never meets itself), each scored with the readout basis and
    ``n_null`` nulls. With d = N/2 the jackknife variance factor (N - d) / d is 1: the standard error of
    the full-sample statistic is the standard deviation of the half-sample values."""
    from raygeom.numerics import pga

    h = np.asarray(h)
    n = h.shape[0]
    m = n // 2
    if n_half < 2 or m < pga.MIN_SAMPLES or r >= min(m, h.shape[1]):
        raise InputError(f"N={n} texts are too few for {n_half} half-samples with CCR-{r}")
    rng = np.random.default_rng([int(seed), 0x7E47])
    rhos, margins = [], []
    for _ in range(n_half):
        layer = pga.prepare_layer(h[np.sort(rng.choice(n, size=m, replace=False))], r)
        rho = pga.subspace_rho(layer, basis[:, :k], device)
        rhos.append(rho)
        margins.append(rho - float(np.mean(pga.null_rhos(layer, k, seed, range(n_null), device))))
    return {"rho_texts_se": float(np.std(rhos, ddof=1)), "margin_texts_se": float(np.std(margins, ddof=1)),
            "n_half_samples": n_half}


def normal_interval(value: float, se: float, level: float = 0.95) -> tuple[float, float]:
    from scipy.stats import norm

    half = float(norm.ppf(0.5 + level / 2)) * se
    return value - half, value + half


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion (e.g. probe accuracy on n test texts)."""
    from scipy.stats import norm

    if n <= 0 or not 0 <= successes <= n:
        raise InputError(f"need 0 <= successes <= n and n > 0, got {successes} of {n}")
    z = float(norm.ppf(0.5 + level / 2))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # At 0 or n successes the exact bound is 0 or 1; the formula reaches it only up to rounding.
    low = 0.0 if successes == 0 else float(max(0.0, centre - half))
    high = 1.0 if successes == n else float(min(1.0, centre + half))
    return low, high
