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
        [spearmanr(d_full, cosine_distances(corrected @ null_subspace(h.shape[1], k, seed, i), groups))[0]
         for i in range(n_null)]
    )
    return {"rho_readout": rho, "null_mean": nulls.mean(), "null_std": nulls.std(ddof=1),
            "z": (rho - nulls.mean()) / nulls.std(ddof=1), "nulls": nulls}


# --- Diagnostics around PGA (METRICS.md "Diagnostics around PGA") ---


def singular_values(h):
    return np.linalg.svd(h - h.mean(axis=0), compute_uv=False)


def rankme_of_singular_values(s):
    p = s / s.sum() + 1e-7
    return np.exp(-np.sum(p * np.log(p)))


def alpha_req_of_singular_values(s):
    from scipy.stats import linregress

    s = s[s > 1e-12 * s.max()]
    return -linregress(np.log(np.arange(1, len(s) + 1)), np.log(s**2)).slope


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

    nulls = np.array([
        rho(a @ null_subspace(a.shape[1], k, seed, i), b @ null_subspace(b.shape[1], k, seed + 2**32, i))
        for i in range(n_null)
    ])
    return {"rho_full": rho(a, b), "rho_readout": rho(a @ basis_a[:, :k], b @ basis_b[:, :k]),
            "null_mean": nulls.mean(), "null_std": nulls.std(ddof=1), "nulls": nulls}
