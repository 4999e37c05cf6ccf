"""The few distribution functions and rank correlations raygeom reports, from ``scipy.special`` and numpy.

They are the special functions ``scipy.stats`` itself evaluates (``norm.ppf`` is ``ndtri``, ``t.ppf`` is
``stdtrit``, ``t.sf`` is ``stdtr`` at ``-x``, ``chi2.ppf`` is ``2 gammaincinv(df / 2, p)``), without its import:
1.2 s here against 0.4 s for scipy.linalg and scipy.special, paid by the CLI and by every Ray worker that runs a
unit task. Tests check each against ``scipy.stats``.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from raygeom.errors import InputError


def normal_quantile(p: float) -> float:
    """``scipy.stats.norm.ppf(p)``."""
    return float(special.ndtri(p))


def t_quantile(p: float, df: float) -> float:
    """``scipy.stats.t.ppf(p, df)``."""
    return float(special.stdtrit(df, p))


def t_sf(x: float, df: float) -> float:
    """``scipy.stats.t.sf(x, df)``: the upper tail of Student's t."""
    return float(special.stdtr(df, -x))


def chi2_quantile(p: float, df: float) -> float:
    """``scipy.stats.chi2.ppf(p, df)``."""
    return float(2.0 * special.gammaincinv(df / 2.0, p))


def rank_rows(a) -> np.ndarray:
    """1-based average ranks along the last axis (float64), as ``scipy.stats.rankdata(a, axis=-1)``:
    tied values share the mean of their ranks; a row holding NaN is all NaN."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 0:
        raise InputError("rank_rows needs at least one axis")
    if a.size == 0:
        return np.empty(a.shape)
    rows = a.reshape(-1, a.shape[-1])
    count, n = rows.shape
    ranks = np.empty_like(rows)
    order = np.argsort(rows, axis=1)  # any order of tied values gives them the same average
    ordered = np.take_along_axis(rows, order, axis=1)
    starts = np.ones_like(ordered, dtype=bool)
    np.not_equal(ordered[:, 1:], ordered[:, :-1], out=starts[:, 1:])
    group = np.cumsum(starts.ravel()) - 1  # a row always starts a group, so no group spans two rows
    sizes = np.bincount(group)
    first = (np.cumsum(sizes) - sizes) % n  # 0-based position of each group's first value in its row
    np.put_along_axis(ranks, order, (first + (sizes + 1) * 0.5)[group].reshape(count, n), axis=1)
    ranks[np.isnan(rows).any(axis=1)] = np.nan
    return ranks.reshape(a.shape)


def pearson_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation of each row of ``a`` with the same row of ``b``; NaN where a row is constant."""
    a = a - a.mean(axis=-1, keepdims=True)
    b = b - b.mean(axis=-1, keepdims=True)
    denominator = np.sqrt((a * a).sum(axis=-1) * (b * b).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (a * b).sum(axis=-1) / np.where(denominator > 0, denominator, 1.0), np.nan)


def pearson(x, y) -> float:
    """Pearson's r of two 1-D samples, as ``scipy.stats.pearsonr(x, y)[0]``; NaN when either side is constant."""
    return float(np.clip(pearson_rows(*_pair(x, y)), -1.0, 1.0))


def spearman(x, y) -> float:
    """Spearman's rho of two 1-D samples (Pearson's r of their average ranks), as ``scipy.stats.spearmanr(x, y)[0]``."""
    x, y = _pair(x, y)
    return pearson(rank_rows(x), rank_rows(y))


def _pair(x, y) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if x.size != y.size or x.size < 2:
        raise InputError(f"a correlation needs two samples of equal length >= 2; got {x.size} and {y.size}")
    return x, y
