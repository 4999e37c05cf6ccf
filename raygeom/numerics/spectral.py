"""Spectral diagnostics of one layer ``H`` (N x d), as ../METRICS.md defines them.

Every function mean-centres ``H`` over samples first, except RankMe, which by
its authors' definition (Garrido et al. 2023) takes the singular values of the
embedding matrix as given; its centred variant is an option. alpha-ReQ is
fitted as the authors' implementation (reptrix, ``reptrix/alpha.py``) fits it:
eigenvalues of the centred ``H``, log eigenvalue against log rank over ranks
11-100, least squares weighted by 1/rank. Singular values come from an SVD,
not from a Gram matrix: squaring would lose the small singular values that the
condition number and alpha-ReQ depend on.
"""

from __future__ import annotations

import numpy as np

from raygeom.errors import InputError
from raygeom.numerics.pga import MIN_SAMPLES, _check_matrix, _fix_signs, _unit_rows, principal_directions

RANKME_EPS = 1e-7
RELATIVE_CUTOFF = 1e-12
ALPHA_REQ_RANKS = (11, 100)  # reptrix's default fit_range np.arange(10, 100), as 1-based ranks


def _checked(h: np.ndarray) -> np.ndarray:
    h = _check_matrix("H", h)
    if h.shape[0] < MIN_SAMPLES:
        raise InputError(f"need at least {MIN_SAMPLES} samples, got N={h.shape[0]}")
    return h.astype(np.float64)


def _centred(h: np.ndarray) -> np.ndarray:
    h = _checked(h)
    centred = h - h.mean(axis=0, keepdims=True)
    if not np.any(centred):
        raise InputError("H has no variance: every sample is the same vector")
    return centred


def _positive(s: np.ndarray) -> np.ndarray:
    """Singular values above ``RELATIVE_CUTOFF * s_max``: the rest are rounding noise."""
    return s[s > RELATIVE_CUTOFF * s[0]]


def _rankme(s: np.ndarray) -> float:
    p = s / s.sum() + RANKME_EPS
    return float(np.exp(-np.sum(p * np.log(p))))


def _alpha_req_fit(s: np.ndarray, fit_range: tuple[int, int | None] | None = None) -> dict[str, float]:
    """Weighted least squares of ``log(s_i^2)`` on ``log(i)`` over ranks ``fit_range`` (1-based, inclusive),
    weights ``1/i``; ranks above the last positive singular value are dropped."""
    s = _positive(s)
    if s.size < 2:
        raise InputError("alpha-ReQ needs at least 2 nonzero singular values; centred H has rank 1")
    first, last = ALPHA_REQ_RANKS if fit_range is None else fit_range
    last = s.size if last is None else min(int(last), s.size)
    first = int(first)
    if first < 1 or last - first + 1 < 2:
        raise InputError(f"alpha-ReQ's fit range of ranks {first}-{last} holds fewer than 2 of the {s.size} nonzero eigenvalues")
    ranks = np.arange(first, last + 1, dtype=np.float64)
    x, y, w = np.log(ranks), np.log(s[first - 1 : last] ** 2), 1.0 / ranks
    # Closed-form weighted regression: slope = weighted cov(x, y) / weighted var(x).
    x_bar, y_bar = np.average(x, weights=w), np.average(y, weights=w)
    slope = np.sum(w * (x - x_bar) * (y - y_bar)) / np.sum(w * (x - x_bar) ** 2)
    residual = y - (y_bar + slope * (x - x_bar))
    total = np.sum((y - y.mean()) ** 2)
    r2 = 1.0 - np.sum(residual**2) / total if total > 0 else float("nan")
    return {"alpha_req": float(-slope), "alpha_req_r2": float(r2), "alpha_req_first_rank": first, "alpha_req_last_rank": last}


def _condition_number(s: np.ndarray) -> float:
    s = _positive(s)
    return float(s[0] / s[-1])


def _isotropy(centred: np.ndarray, s: np.ndarray, vt: np.ndarray) -> float:
    directions = _fix_signs(vt[: _positive(s).size].T).T
    z = np.exp(_unit_rows(centred) @ directions.T).sum(axis=0)
    if directions.shape[0] < centred.shape[1]:
        # Directions orthogonal to every sample have c . x_i = 0, so Z(c) = N.
        z = np.append(z, centred.shape[0])
    return float(z.min() / z.max())


def rankme(h: np.ndarray, centred: bool = False) -> float:
    """RankMe (Garrido et al. 2023): ``exp(entropy(p))``, ``p = s / sum(s) + 1e-7`` over all
    ``min(N, d)`` singular values ``s`` of ``H`` as given (the embedding matrix, not centred), or of
    the centred ``H`` with ``centred=True``. Between ~1 and min(N, d)."""
    matrix = _centred(h) if centred else _checked(h)
    if not centred and not np.any(matrix):
        raise InputError("H is all zeros: it has no singular values to spread")
    return _rankme(np.linalg.svd(matrix, compute_uv=False))


def alpha_req(h: np.ndarray, fit_range: tuple[int, int | None] | None = None) -> float:
    """alpha-ReQ as its authors' implementation (reptrix) fits it: minus the slope of ``log(s_i^2)``
    against ``log(i)`` over ranks ``i`` in 11-100, least squares weighted by ``1/i``; ``s`` are the
    singular values of the centred ``H`` (so ``s_i^2`` are the covariance eigenvalues up to a constant,
    which moves only the intercept). See :func:`alpha_req_fit` for the range and R^2.
    """
    return alpha_req_fit(h, fit_range)["alpha_req"]


def alpha_req_fit(h: np.ndarray, fit_range: tuple[int, int | None] | None = None) -> dict[str, float]:
    """alpha-ReQ with its fit's R^2 and the ranks used.

    ``fit_range``: ``(first, last)`` 1-based inclusive ranks, default ``(11, 100)`` as reptrix;
    ``(1, None)`` fits the whole spectrum. Ranks beyond the last singular value above
    ``1e-12 * s_max`` are dropped (the exact zeros that centring, or N <= d, creates), so the range
    is clamped to what exists; fewer than 2 ranks left is an error. ``alpha_req_r2`` is the
    (unweighted) coefficient of determination of the fitted line on ``log(s_i^2)`` over those ranks.
    A spectrum ``s_i^2 ~ i^-a`` gives ``a`` and R^2 = 1.
    """
    return _alpha_req_fit(np.linalg.svd(_centred(h), compute_uv=False), fit_range)


def condition_number(h: np.ndarray) -> float:
    """``s_max / s_min`` of the centred ``H`` over singular values above ``1e-12 * s_max``."""
    return _condition_number(np.linalg.svd(_centred(h), compute_uv=False))


def isotropy(h: np.ndarray) -> float:
    """Mu & Viswanath (2018) isotropy ``min_c Z(c) / max_c Z(c)``, ``Z(c) = sum_i exp(c . x_i)``.

    ``x_i`` are the unit-normalised rows of the centred ``H``; ``c`` runs over all
    ``d`` principal directions of the centred ``H``. Those with singular value
    below ``1e-12 * s_max`` (all but N-1 when N <= d) are orthogonal to every
    sample and have ``Z(c) = N``; so data confined to a subspace counts as
    anisotropic, not as isotropic within it. ``Z(c)`` and ``Z(-c)`` differ, so
    each direction's sign is fixed as in ``pga``: its largest-magnitude entry is
    positive. Since ``|c . x_i| <= 1`` the value lies in ``[exp(-2), 1]``;
    1 means perfectly isotropic.
    """
    centred = _centred(h)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    return _isotropy(centred, s, vt)


def _check_basis(basis: np.ndarray, d: int) -> np.ndarray:
    basis = _check_matrix("readout basis", basis).astype(np.float64)
    if basis.shape[0] != d:
        raise InputError(f"readout basis has {basis.shape[0]} rows but H has d={d}")
    k = basis.shape[1]
    if not 0 < k < d:
        raise InputError(f"readout basis must have 0 < k < d columns; got k={k}, d={d}")
    # A share ||V^T u||^2 is only a fraction of u's length when V is orthonormal.
    if not np.allclose(basis.T @ basis, np.eye(k), atol=1e-4):
        raise InputError("readout basis columns must be orthonormal")
    return basis


def _pc1_readout_share(centred: np.ndarray, basis: np.ndarray) -> dict[str, float]:
    basis = _check_basis(basis, centred.shape[1])
    u1 = principal_directions(centred, 1)[0]
    coordinates = basis.T @ u1
    return {
        "pc1_readout_share": float(coordinates @ coordinates),
        "pc1_readout_chance": basis.shape[1] / centred.shape[1],
    }


def pc1_readout_share(h: np.ndarray, readout_basis: np.ndarray) -> dict[str, float]:
    """Share ``||V_k^T u_1||^2`` of the top principal direction ``u_1`` of the centred ``H``
    (before any CCR) that lies in the readout subspace ``V_k`` (``d x k``, orthonormal).

    Returns ``pc1_readout_share`` and ``pc1_readout_chance = k / d``, the expected
    share of a uniformly random direction.
    """
    return _pc1_readout_share(_centred(h), readout_basis)


def spectral_summary(
    h: np.ndarray, readout_basis: np.ndarray | None = None, alpha_fit_range: tuple[int, int | None] | None = None
) -> dict[str, float]:
    """All spectral metrics of ``H``, plus the PC1 readout share when a basis is given.

    ``rankme`` is uncentred (Garrido et al.), ``rankme_centred`` its centred variant. alpha-ReQ comes
    with its R^2 and the ranks it was fitted on; where the fit range holds fewer than 2 nonzero
    eigenvalues (tiny N or d) it is NaN and the other metrics stand.
    """
    centred = _centred(h)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    try:
        alpha = _alpha_req_fit(s, alpha_fit_range)
    except InputError:
        alpha = {"alpha_req": float("nan"), "alpha_req_r2": float("nan"), "alpha_req_first_rank": -1, "alpha_req_last_rank": -1}
    summary = {
        "rankme": _rankme(np.linalg.svd(_checked(h), compute_uv=False)),
        "rankme_centred": _rankme(s),
        **alpha,
        "condition_number": _condition_number(s),
        "isotropy": _isotropy(centred, s, vt),
        "n": centred.shape[0],
        "d": centred.shape[1],
    }
    if readout_basis is not None:
        summary.update(_pc1_readout_share(centred, readout_basis))
    return summary


def pc1_readout_share_interval(h: np.ndarray, readout_basis: np.ndarray, seed: int = 0, n_half: int = 10) -> dict[str, float]:
    """The PC1 readout share with its standard error over texts: the delete-half jackknife of
    :func:`pc1_readout_share` on ``n_half`` seeded half-samples of the rows (without replacement, as PGA's
    interval over texts), and its 95 % normal interval on the logit scale (inside [0, 1]; none where the share sits
    on a bound or the half-samples do not move it)."""
    from raygeom.numerics.uncertainty import bounded_normal_interval, jackknife_se, text_subsamples

    h = _checked(h)
    full = pc1_readout_share(h, readout_basis)
    n, size = h.shape[0], h.shape[0] // 2
    shares = [pc1_readout_share(h[rows], readout_basis)["pc1_readout_share"] for rows in text_subsamples(n, size, seed, n_half)]
    se = jackknife_se(shares, n, size)
    low, high = bounded_normal_interval(full["pc1_readout_share"], se, 0.0, 1.0)
    return {
        **full,
        "pc1_readout_share_se": se,
        "pc1_readout_share_lo": low,
        "pc1_readout_share_hi": high,
        "n_half_samples": n_half,
    }


SPECTRAL_INTERVALS = ("rankme", "alpha_req", "isotropy", "condition_number")


def spectral_intervals(
    h: np.ndarray,
    seed: int = 0,
    n_half: int = 10,
    alpha_fit_range: tuple[int, int | None] | None = None,
    level: float = 0.95,
    full: dict[str, float] | None = None,
) -> dict[str, float]:
    """An interval over texts for each of :data:`SPECTRAL_INTERVALS`: the delete-half jackknife standard error of the
    metric on ``n_half`` seeded half-samples of the rows (as :func:`pc1_readout_share_interval`), and its normal
    interval at ``level`` (isotropy's on the logit scale inside [0, 1], the condition number's on the log scale).

    None (NaN, with ``spectral_interval_note`` saying why) where a half-sample holds fewer rows than ``H`` has
    columns: these metrics count directions, and a half of fewer than d rows spans fewer of them by construction, a
    bias the jackknife would read as noise. ``full``: :func:`spectral_summary` of ``h``, where the caller has it."""
    from raygeom.numerics.uncertainty import bounded_normal_interval, jackknife_se, level_quantile, text_subsamples

    h = _checked(h)
    n, d = h.shape
    size = n // 2
    out: dict[str, float] = {}
    if size < d or n_half < 2:
        for metric in SPECTRAL_INTERVALS:
            out.update({f"{metric}_se": float("nan"), f"{metric}_lo": float("nan"), f"{metric}_hi": float("nan")})
        why = f"half of the N={n} texts is below d={d}" if size < d else f"{n_half} half-samples"
        return {**out, "spectral_half_samples": 0, "spectral_interval_note": f"no interval over texts: {why}"}
    full = full if full is not None else spectral_summary(h, alpha_fit_range=alpha_fit_range)
    halves = [spectral_summary(h[rows], alpha_fit_range=alpha_fit_range) for rows in text_subsamples(n, size, seed, n_half)]
    q = level_quantile(level)
    for metric in SPECTRAL_INTERVALS:
        values = [half[metric] for half in halves if np.isfinite(half[metric])]
        value = full[metric]
        se = jackknife_se(values, n, size) if len(values) >= 2 and np.isfinite(value) else float("nan")
        if not (np.isfinite(se) and se > 0):
            low = high = float("nan")
        elif metric == "isotropy":
            low, high = bounded_normal_interval(value, se, 0.0, 1.0, level)
        elif metric == "condition_number":  # positive and skewed: the interval of its log
            low, high = (float(value * np.exp(sign * q * se / value)) for sign in (-1.0, 1.0))
        else:
            low, high = value - q * se, value + q * se
        out.update({f"{metric}_se": se, f"{metric}_lo": low, f"{metric}_hi": high})
    return {**out, "spectral_half_samples": n_half, "spectral_interval_note": ""}
