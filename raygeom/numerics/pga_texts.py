"""Intervals over texts for Subspace PGA: how much rho_readout and the margin over the null depend on which texts
were sampled (delete-d jackknife over seeded subsamples without replacement). Built on numerics.pga (the scoring)
and numerics.uncertainty (the jackknife), so neither of those imports the other."""

from __future__ import annotations

import numpy as np

from raygeom.errors import InputError
from raygeom.numerics import pga
from raygeom.numerics.pga import _check_k, _check_matrix, null_rhos, prepare_layer, subspace_rho
from raygeom.numerics.uncertainty import LEVEL, jackknife_se, level_quantile, text_subsamples


def _subsample_scores(
    h: np.ndarray, basis: np.ndarray, k: int, r: int, seed: int, count: int, size: int, n_null: int, device: str | None
) -> tuple[np.ndarray, np.ndarray]:
    """rho_readout and the margin ``rho - mean(null rhos)`` on each of ``count`` subsamples of ``size`` texts.

    Each subset is prepared afresh (its own centring, CCR and full-space ranks). Every subset uses the
    same null draws ``0..n_null-1`` (seeded by ``(seed, i)``), so their Monte-Carlo noise is largely
    shared and does not inflate the spread across subsets.
    """
    rhos, margins = [], []
    for rows in text_subsamples(h.shape[0], size, seed, count):
        layer = pga.prepare_layer(h[rows], r)
        rho = pga.subspace_rho(layer, basis[:, :k], device)
        rhos.append(rho)
        margins.append(rho - float(np.mean(pga.null_rhos(layer, k, seed, range(n_null), device))))
    return np.array(rhos), np.array(margins)


def _check_subsampling(h: np.ndarray, r: int, count: int, size: int, n_null: int) -> None:
    if count < 2 or n_null < 1 or size < pga.MIN_SAMPLES or size >= h.shape[0] or r >= min(size, h.shape[1]):
        raise InputError(f"N={h.shape[0]} texts are too few for {count} subsamples of {size} with CCR-{r}")


def half_sample_spread(
    h, basis, r: int, k: int, seed: int = 0, n_half: int = 10, n_null: int = 10, device: str | None = None
) -> dict[str, float]:
    """Standard errors over texts of the readout rho and of the PGA margin (rho - mean of nulls), by the
    delete-d jackknife with d about N/2: ``n_half`` seeded subsets of ``N // 2`` texts
    (:func:`text_subsamples`: without replacement, so a duplicated text never meets itself), each
    scored with the readout basis and ``n_null`` nulls, and :func:`jackknife_se` of each statistic
    (factor ``(N//2) / (N - N//2)``: 1 for even N)."""
    h = np.asarray(h)
    size = h.shape[0] // 2
    _check_subsampling(h, r, n_half, size, n_null)
    rhos, margins = _subsample_scores(h, basis, k, r, seed, n_half, size, n_null, device)
    return {
        "rho_texts_se": jackknife_se(rhos, h.shape[0], size),
        "margin_texts_se": jackknife_se(margins, h.shape[0], size),
        "n_half_samples": n_half,
    }


def pga_text_interval(
    h: np.ndarray,
    readout: np.ndarray,
    k: int,
    r: int = 1,
    seed: int = 0,
    *,
    n_subsamples: int = 30,
    fraction: float = 0.5,
    n_null: int = 30,
    z: float | None = None,
    null_std: float | None = None,
    level: float = LEVEL,
    device: str | None = None,
) -> dict[str, float]:
    """How much rho_readout and z depend on which N texts were sampled: intervals over texts.

    Delete-d jackknife by seeded subsampling without replacement: ``n_subsamples`` subsets of
    ``size = int(fraction * N)`` texts (:func:`text_subsamples`), each scored as in
    :func:`half_sample_spread` (rho_readout, and the margin rho - mean of ``n_null`` nulls), and
    :func:`jackknife_se` of each gives its standard error over texts; ``estimate -+ q se`` is the
    interval. No bootstrap with replacement: a text drawn twice is a duplicated row, whose zero
    distances would be artefacts.

    z itself grows with N (the null sd shrinks as pairs are added), so z is not recomputed per
    subset: the interval on the z scale is ``z -+ q se(margin) / null_std``, with ``z`` and
    ``null_std`` those of the full data (pass them from the PGA result, or they are computed here
    with ``n_null`` nulls).

    Cost: ``n_subsamples * (1 + n_null)`` subspace scorings on ``size`` texts, each about
    ``fraction^2`` of a full-N scoring (pairs grow as N^2), plus one CCR per subset; the
    defaults cost about 232 full-N scorings, about 2.3 times a 100-null PGA of the layer.
    """
    h = _check_matrix("H", h)
    n, d = h.shape
    _check_k(k, d)
    readout = _check_matrix("readout basis", readout)
    if readout.shape[0] != d or readout.shape[1] < k:
        raise InputError(f"readout basis is {readout.shape}; need {d} rows and at least k={k} columns")
    if not 0.0 < fraction < 1.0:
        raise InputError(f"fraction must lie in (0, 1); got {fraction}")
    size = int(fraction * n)
    _check_subsampling(h, r, n_subsamples, size, n_null)
    if n_null < 2:
        raise InputError(f"need at least 2 nulls per subsample; got {n_null}")
    basis = readout[:, :k]
    q = level_quantile(level)
    full = prepare_layer(h, r)
    rho_full = subspace_rho(full, basis, device)
    if z is None or null_std is None:
        nulls = null_rhos(full, k, seed, range(n_null), device)
        null_std = float(nulls.std(ddof=1))
        z = (rho_full - float(nulls.mean())) / null_std
    rhos, margins = _subsample_scores(h, basis, k, r, seed, n_subsamples, size, n_null, device)
    rho_se = jackknife_se(rhos, n, size)
    margin_se = jackknife_se(margins, n, size)
    z_se = margin_se / null_std if null_std > 0 else float("nan")
    return {
        "rho_readout": float(rho_full),
        "rho_texts_se": rho_se,
        "rho_texts_lo": rho_full - q * rho_se,
        "rho_texts_hi": rho_full + q * rho_se,
        "margin_texts_se": margin_se,
        "z": float(z),
        "z_texts_se": z_se,
        "z_texts_lo": z - q * z_se,
        "z_texts_hi": z + q * z_se,
        "n": n,
        "subsample_size": size,
        "n_subsamples": n_subsamples,
        "n_null_per_subsample": n_null,
        "level": level,
        "seed": int(seed),
    }


# ----------------------------------------------------------------------------- other decisions
