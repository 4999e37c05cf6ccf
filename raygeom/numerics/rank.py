"""What a layer can support before it is scored: distinct rows, numerical rank, distinct residual distances.

Pure numpy (no torch, no I/O). See docs/METRICS.md, "Rank: score only what has the rank to be scored".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import eigvalsh

from raygeom.errors import InputError

FLOAT32_EPS = float(np.finfo(np.float32).eps)
MIN_DISTINCT_PER_100_PAIRS = 3.0


@dataclass(frozen=True)
class LayerRank:
    n: int  # rows
    distinct_rows: int  # by byte equality
    rank: int  # numerical rank of the centred layer
    singular_values: np.ndarray  # of the centred layer, descending (min(N, d) of them)
    tolerance: float  # singular values at or below it count as zero

    def after_ccr(self, r: int) -> int:
        """CCR-r removes the top-r principal directions, which are the top-r singular directions."""
        return max(self.rank - r, 0)


def distinct_rows(h: np.ndarray) -> int:
    h = np.ascontiguousarray(h)
    if h.shape[0] == 0:
        return 0
    return int(np.unique(h.view(np.dtype((np.void, h.dtype.itemsize * h.shape[1]))).ravel()).size)


def layer_rank(h: np.ndarray) -> LayerRank:
    """Distinct rows and the numerical rank of the mean-centred ``h`` (N x d).

    A singular value counts when it is above ``max(N, d) * eps_float32 * max(sigma_max, max|h|)``. Activations
    are float32, so every entry carries a rounding error of at least eps_float32 / 2 of its magnitude (of the
    uncentred value: a large common offset rounds too), and by Weyl's inequality a perturbation E moves each
    singular value by at most ||E||_2 <= ||E||_F <= sqrt(N d) * eps_float32 * max|h|, which is below the
    tolerance. This is the rule of numpy.linalg.matrix_rank and LAPACK (max(N, d) * eps * sigma_max), with
    float32's eps because the data were float32. Below it a direction cannot be told from rounding. The
    singular values come from the eigenvalues of the smaller Gram matrix in float64, whose error (about
    sqrt(max(N, d) * eps_float64) * sigma_max) is far below the tolerance.
    """
    h = np.asarray(h)
    if h.ndim != 2 or not np.isfinite(h).all():
        raise InputError("a layer must be a finite 2-D array")
    n, d = h.shape
    centred = h.astype(np.float64) - h.astype(np.float64).mean(axis=0, keepdims=True)
    gram = centred @ centred.T if n <= d else centred.T @ centred
    squares = np.clip(eigvalsh(gram)[::-1], 0.0, None)
    singular = np.sqrt(squares)
    top = float(singular[0]) if singular.size else 0.0
    tolerance = max(n, d) * FLOAT32_EPS * max(top, float(np.abs(h).max(initial=0.0)))
    rank = int(np.count_nonzero(singular > tolerance))
    return LayerRank(n, distinct_rows(h), rank, singular, tolerance)


def check_rank(info: LayerRank, r: int, k: int) -> None:
    """Refuse a layer whose rank after CCR-r is below k + 2: a k-dimensional readout subspace of a residual that
    spans at most k + 1 directions cannot be told from a random one, and the rest is rounding noise."""
    left = info.after_ccr(r)
    if left < k + 2:
        raise InputError(
            f"rank {left} after CCR-{r}, below k + 2 = {k + 2} (centred rank {info.rank}, "
            f"{info.distinct_rows} distinct of {info.n} rows)"
        )


def distinct_per_100_pairs(values: np.ndarray, n_pairs: int) -> float:
    """Distinct values of a layer's pair distances (or of their ranks: ties share one) per 100 of its pairs."""
    return 100.0 * np.unique(np.asarray(values)).size / max(int(n_pairs), 1)


def check_distinct_distances(values: np.ndarray, n_pairs: int, info: LayerRank, r: int) -> None:
    """Refuse residual distances with fewer than MIN_DISTINCT_PER_100_PAIRS distinct values per 100 pairs:
    Spearman over a handful of values ranks ties and noise, not geometry."""
    per_100 = distinct_per_100_pairs(values, n_pairs)
    if per_100 < MIN_DISTINCT_PER_100_PAIRS:
        raise InputError(
            f"rank {info.after_ccr(r)} after CCR-{r}: its cosine distances take only "
            f"{np.unique(np.asarray(values)).size} distinct values over {n_pairs} pairs "
            f"({per_100:.2g} per 100, below {MIN_DISTINCT_PER_100_PAIRS:g})"
        )


def readout_rank(singular_values: np.ndarray, shape: tuple[int, int]) -> int:
    """Numerical rank of ``W_U`` (``shape`` = (V, d)) from its singular values: layer_rank's rule (float32's eps,
    since weights are float32 or narrower), with sigma_max >= max|W_U| standing for the entries' size."""
    values = np.asarray(singular_values, dtype=np.float64)
    top = float(values.max(initial=0.0))
    return int(np.count_nonzero(values > max(shape) * FLOAT32_EPS * top)) if top > 0 else 0


def check_readout_rank(singular_values: np.ndarray, k: int, shape: tuple[int, int], name: str = "W_U") -> None:
    """Refuse a readout of rank below ``k``: its top-k subspace would hold directions ``W_U`` never reads (their
    basis vectors are whatever the eigensolver returns for a zero eigenvalue), so z would score noise."""
    found = readout_rank(singular_values, shape)
    if found < k:
        raise InputError(f"{name} ({shape[0]} x {shape[1]}) has rank {found}, below k = {k}: k must be <= the readout's rank")
