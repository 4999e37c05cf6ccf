"""Plain numpy/scipy versions of the metrics, written from METRICS.md and used as test oracles.

Nothing here imports raygeom: expected values never come from the code under test.
"""

import numpy as np
from scipy.spatial.distance import pdist, squareform
from scipy.stats import spearmanr


def ccr(h, r):
    centred = h.astype(np.float64) - h.mean(axis=0)
    if r == 0:
        return centred
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return centred - centred @ vt[:r].T @ vt[:r]


def readout(w_u, k):
    _, _, vt = np.linalg.svd(w_u.astype(np.float64), full_matrices=False)
    return vt[:k].T


def null_subspace(d, k, seed, i):
    q, r = np.linalg.qr(np.random.default_rng([seed, i]).standard_normal((d, k)))
    return q * np.sign(np.diag(r))


def tie_groups(h):
    """First row of each group of identical rows of ``h``, and each row's group."""
    _, first, inverse = np.unique(np.asarray(h), axis=0, return_index=True, return_inverse=True)
    return first, np.asarray(inverse).ravel()


def cosine_distances(x, groups):
    """pdist(x, "cosine"), with the distances that are equal in exact arithmetic made equal floats.

    Rows that are identical in the input H (``groups`` from :func:`tie_groups`) are identical
    after any linear map: their pairs have distance 0 and pair (i, j) equals pair (rep i, rep j).
    So the distances of the representatives are computed once and spread out; without
    duplicates this is plain pdist.
    """
    first, inverse = groups
    square = squareform(pdist(x[first], "cosine"))  # zero diagonal: a row and its copy
    return square[np.ix_(inverse, inverse)][np.triu_indices(len(inverse), 1)]


def pga(h, w_u, k=100, r=1, n_null=100, seed=0):
    corrected = ccr(h, r)
    groups = tie_groups(h)
    d_full = cosine_distances(corrected, groups)
    rho = spearmanr(d_full, cosine_distances(corrected @ readout(w_u, k), groups))[0]
    nulls = np.array(
        [spearmanr(d_full, cosine_distances(corrected @ null_subspace(h.shape[1], k, seed, i), groups))[0] for i in range(n_null)]
    )
    return {
        "rho_readout": rho,
        "null_mean": nulls.mean(),
        "null_std": nulls.std(ddof=1),
        "z": (rho - nulls.mean()) / nulls.std(ddof=1),
        "nulls": nulls,
    }


# --- Diagnostics around PGA (METRICS.md "Diagnostics around PGA") ---


def singular_values(h):
    return np.linalg.svd(h - h.mean(axis=0), compute_uv=False)


def rankme_of_singular_values(s):
    p = s / s.sum() + 1e-7
    return np.exp(-np.sum(p * np.log(p)))


def rankme_garrido(h, centred=False):
    """RankMe as Garrido et al. (2023, eq. 1) define it: singular values of the embedding matrix as given."""
    z = np.asarray(h, dtype=np.float64)
    if centred:
        z = z - z.mean(axis=0)
    return rankme_of_singular_values(np.linalg.svd(z, compute_uv=False))


def alpha_req_reptrix(h, fit_range=None):
    """alpha-ReQ and R^2 as reptrix (github.com/BARL-SSL/reptrix, reptrix/alpha.py get_powerlaw and
    reptrix/utils.py get_eigenspectrum) computes them, rewritten in numpy without torch or sklearn.

    get_eigenspectrum: sklearn PCA(svd_solver="full") of the centred activations,
    explained_variance_ratio_ = S^2 / (N-1), normalised to sum 1. get_powerlaw: y = log(eigen[trange]),
    trange = np.arange(10, 100) then +1 (ranks 11-100), x = [-log(rank), 1], w = 1/rank,
    b = solve(x^T (x w), (w x)^T y), alpha = b[0]. Two departures, both documented in METRICS.md:
    the range is clamped to the eigenvalues above 1e-24 of the largest (reptrix would index past
    the end, or take the log of a rounding-noise eigenvalue); R^2 is sklearn's r2_score over the
    fitted ranks themselves (reptrix's fit_R2_100 starts one rank later, at 12).
    """
    centred = np.asarray(h, dtype=np.float64) - np.asarray(h, dtype=np.float64).mean(axis=0)
    s = np.linalg.svd(centred, compute_uv=False)
    variance = s**2 / (centred.shape[0] - 1)
    eigen = variance / variance.sum()
    positive = int(np.sum(s > 1e-12 * s[0]))
    first, last = (11, 100) if fit_range is None else fit_range
    last = positive if last is None else min(last, positive)
    trange = np.arange(first - 1, last)
    logss = np.log(np.abs(eigen))
    y = logss[trange][:, np.newaxis]
    trange = trange + 1
    x = np.concatenate((-np.log(trange)[:, np.newaxis], np.ones((trange.size, 1))), axis=1)
    w = 1.0 / trange.astype(np.float64)[:, np.newaxis]
    b = np.linalg.solve(x.T @ (x * w), (w * x).T @ y).flatten()
    predicted = (x @ b[:, np.newaxis]).ravel()
    y = y.ravel()
    r2 = 1.0 - np.sum((y - predicted) ** 2) / np.sum((y - y.mean()) ** 2)
    return b[0], r2


def isotropy(h):
    """Mu & Viswanath on the unit rows of the centred H, over all d principal directions;
    each one's largest-magnitude entry made positive (the sign convention raygeom documents)."""
    centred = h - h.mean(axis=0)
    _, _, directions = np.linalg.svd(centred, full_matrices=True)
    pivots = np.abs(directions).argmax(axis=1)
    directions = directions * np.sign(directions[np.arange(len(directions)), pivots])[:, None]
    norms = np.linalg.norm(centred, axis=1, keepdims=True)
    unit = centred / np.where(norms > 0, norms, 1.0)
    z = np.exp(unit @ directions.T).sum(axis=0)
    return z.min() / z.max()


def pc1_readout_share(h, basis):
    _, _, vt = np.linalg.svd(h - h.mean(axis=0), full_matrices=False)
    return np.sum((basis.T @ vt[0]) ** 2)


def convergence(h_a, h_b, basis_a, basis_b, k, r=1, n_null=100, seed=0):
    """Model B's null i is drawn with seed + 2**32 (the documented derivation)."""
    a, b = ccr(h_a, r), ccr(h_b, r)
    groups_a, groups_b = tie_groups(h_a), tie_groups(h_b)

    def rho(x, y):
        return spearmanr(cosine_distances(x, groups_a), cosine_distances(y, groups_b))[0]

    nulls = np.array(
        [rho(a @ null_subspace(a.shape[1], k, seed, i), b @ null_subspace(b.shape[1], k, seed + 2**32, i)) for i in range(n_null)]
    )
    return {
        "rho_full": rho(a, b),
        "rho_readout": rho(a @ basis_a[:, :k], b @ basis_b[:, :k]),
        "null_mean": nulls.mean(),
        "null_std": nulls.std(ddof=1),
        "nulls": nulls,
    }
