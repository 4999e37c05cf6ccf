"""Plain numpy/scipy versions of the metrics, written from METRICS.md and used as test oracles.

Nothing here imports raygeom: expected values never come from the code under test.
"""

import numpy as np
from scipy.spatial.distance import pdist
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


def pga(h, w_u, k=100, r=1, n_null=100, seed=0):
    corrected = ccr(h, r)
    d_full = pdist(corrected, "cosine")
    rho = spearmanr(d_full, pdist(corrected @ readout(w_u, k), "cosine"))[0]
    nulls = np.array(
        [spearmanr(d_full, pdist(corrected @ null_subspace(h.shape[1], k, seed, i), "cosine"))[0] for i in range(n_null)]
    )
    return {"rho_readout": rho, "null_mean": nulls.mean(), "null_std": nulls.std(ddof=1),
            "z": (rho - nulls.mean()) / nulls.std(ddof=1), "nulls": nulls}
