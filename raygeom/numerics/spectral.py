"""Spectral diagnostics of one layer ``H`` (N x d), as ../METRICS.md defines them.

Every function mean-centres ``H`` over samples first. Singular values come from
an SVD of the centred matrix, not from its Gram matrix: squaring would lose the
small singular values that the condition number and alpha-ReQ depend on.
"""

from __future__ import annotations

import numpy as np

from raygeom.errors import InputError
from raygeom.numerics.pga import MIN_SAMPLES, _check_matrix, _fix_signs, _unit_rows, principal_directions

RANKME_EPS = 1e-7
RELATIVE_CUTOFF = 1e-12


def _centred(h: np.ndarray) -> np.ndarray:
    h = _check_matrix("H", h)
    if h.shape[0] < MIN_SAMPLES:
        raise InputError(f"need at least {MIN_SAMPLES} samples, got N={h.shape[0]}")
    h = h.astype(np.float64)
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


def _alpha_req(s: np.ndarray) -> float:
    s = _positive(s)
    if s.size < 2:
        raise InputError("alpha-ReQ needs at least 2 nonzero singular values; centred H has rank 1")
    slope = np.polyfit(np.log(np.arange(1, s.size + 1)), np.log(s**2), 1)[0]
    return float(-slope)


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


def rankme(h: np.ndarray) -> float:
    """RankMe (Garrido et al.): ``exp(entropy(p))``, ``p = s / sum(s) + 1e-7`` over all
    ``min(N, d)`` singular values ``s`` of the centred ``H``. Between ~1 and min(N, d)."""
    return _rankme(np.linalg.svd(_centred(h), compute_uv=False))


def alpha_req(h: np.ndarray) -> float:
    """alpha-ReQ: minus the least-squares slope of ``log(s_i^2)`` against ``log(i)``.

    The fit uses the singular values above ``1e-12 * s_max``, so the exact zeros
    that centring (or N <= d) creates do not enter it. A spectrum ``s_i^2 ~ i^-a``
    gives ``a``.
    """
    return _alpha_req(np.linalg.svd(_centred(h), compute_uv=False))


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


def spectral_summary(h: np.ndarray, readout_basis: np.ndarray | None = None) -> dict[str, float]:
    """All spectral metrics of ``H`` from one SVD, plus the PC1 readout share when a basis is given."""
    centred = _centred(h)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    summary = {
        "rankme": _rankme(s),
        "alpha_req": _alpha_req(s),
        "condition_number": _condition_number(s),
        "isotropy": _isotropy(centred, s, vt),
        "n": centred.shape[0],
        "d": centred.shape[1],
    }
    if readout_basis is not None:
        summary.update(_pc1_readout_share(centred, readout_basis))
    return summary
