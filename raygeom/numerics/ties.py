"""Exact ties from duplicated rows, honoured on any CPU.

Identical rows of ``H`` (duplicate texts; texts that end in the same token at
the embedding layer) stay identical under CCR and under any linear map. So in
exact arithmetic every pair inside a group of identical rows has cosine
distance 0, and pair ``(i, j)`` has the same distance as pair
``(rep(i), rep(j))``. In float32 those equal distances come out of different
GEMM tiles and differ in their last bits, differently on different CPUs, so a
ranking would break the ties at random.

The cure is structural rather than a tolerance: rows are grouped once by byte
equality of the input, and every pairwise quantity is computed on the groups'
representatives (their first rows), then expanded. Equal values are then the
same float, and rank as ties in any sort. Rows that differ only in the sign of
a zero (``-0.0`` against ``0.0``) are not grouped: that is a missed tie at
worst, never a false one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def duplicate_groups(x: np.ndarray) -> np.ndarray | None:
    """Group label of each row of ``x`` (``N x d``) by byte equality, or None when all rows differ.

    Labels run ``0 .. G-1`` in order of each group's first row, so the
    representative of group ``g`` is the ``g``-th first occurrence.
    """
    x = np.ascontiguousarray(x)
    if x.ndim != 2 or x.shape[0] < 2:
        return None
    if np.unique(_row_hashes(x)).size == x.shape[0]:
        return None  # rows with different hashes differ; the usual case costs one pass over x
    rows = x.view(np.dtype((np.void, x.dtype.itemsize * x.shape[1]))).ravel()
    _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    if first.size == rows.size:
        return None
    relabel = np.empty(first.size, dtype=np.int64)
    relabel[np.argsort(first, kind="stable")] = np.arange(first.size)
    return relabel[np.asarray(inverse).ravel()]


def _row_hashes(x: np.ndarray) -> np.ndarray:
    """A hash of each row's bytes (identical rows, identical hashes): a weighted sum of its 32-bit
    words (or bytes) with odd multipliers, in wrapping uint64 arithmetic."""
    width = x.dtype.itemsize * x.shape[1]
    words = x.view(np.uint32 if width % 4 == 0 else np.uint8).reshape(x.shape[0], -1)
    multipliers = (np.arange(words.shape[1], dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) | np.uint64(1)
    return words @ multipliers


@dataclass(frozen=True)
class Groups:
    """The groups of identical rows: ``labels`` (N), ``representatives`` (G, first row of each) and
    ``sizes`` (G)."""

    labels: np.ndarray
    representatives: np.ndarray
    sizes: np.ndarray

    @classmethod
    def of(cls, labels: np.ndarray) -> "Groups":
        labels = np.asarray(labels, dtype=np.int64)
        _, representatives, sizes = np.unique(labels, return_index=True, return_counts=True)
        return cls(labels, representatives, sizes)

    @property
    def n_groups(self) -> int:
        return self.representatives.size

    def snap(self, x: np.ndarray) -> np.ndarray:
        """``x`` with every row replaced by its group representative's row (bitwise copies)."""
        return x[self.representatives][self.labels]

    def pdist_expansion(self) -> np.ndarray:
        """Flat index into a ``G x G`` matrix for each of the N(N-1)/2 pairs in pdist order.

        Pair ``(i, j)`` reads ``(min(g_i, g_j), max(g_i, g_j))``: one entry per unordered pair of
        groups, so a GEMM's two triangles never disagree; a pair inside a group reads the diagonal.
        """
        n = self.labels.size
        rows, cols = np.triu_indices(n, 1)
        a, b = self.labels[rows], self.labels[cols]
        return np.minimum(a, b) * self.n_groups + np.maximum(a, b)


def tied_similarities(unit_representatives: torch.Tensor, expansion: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """Cosine similarities of all N pairs (pdist order) from the ``G`` unit representative rows.

    ``gram`` is a ``G x G`` buffer; ``expansion`` comes from :meth:`Groups.pdist_expansion`. A pair
    inside a group gets exactly 1 (distance 0), or 0 when the row is zero (it has no direction), and
    every value is clipped to [-1, 1] as ``scipy.spatial.distance.cosine`` does.
    """
    torch.matmul(unit_representatives, unit_representatives.T, out=gram)
    nonzero = unit_representatives.abs().amax(dim=1) > 0
    gram.diagonal().copy_(nonzero.to(gram.dtype))
    gram.clamp_(-1.0, 1.0)
    return torch.index_select(gram.view(-1), 0, expansion)
