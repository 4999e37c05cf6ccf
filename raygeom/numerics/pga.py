"""Subspace PGA, exactly as ../METRICS.md defines it.

The fast path ranks each projected distance vector with a counting sort over
value bins instead of a comparison sort. Values that share a bin share their
average rank, so the result is the exact Spearman correlation of slightly
quantised distances. Bins are fine enough that a bin holds a handful of pairs;
when one holds more than ``MAX_PAIRS_PER_BIN`` (heavy clustering) that vector
falls back to exact average ranks, and so does any vector of at most
``EXACT_RANK_PAIRS`` values, where a comparison sort costs next to nothing.
Ranks of the full-space distances, used by every subspace, are always exact
and computed once.

Exact ties (see :mod:`raygeom.numerics.ties`): when ``H`` has identical rows,
every distance is computed once per pair of distinct rows, and the N(N-1)/2
pairs are represented by those values with integer weights (how many pairs
share each), plus one weighted entry of distance exactly 0 per group of
identical rows. Both the counting sort and the exact fallback rank weighted
values, so pairs that are equal in exact arithmetic always share one rank.
Without duplicates nothing of this runs.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from threading import Lock
from typing import Iterable

import numpy as np
import torch
from scipy.linalg import eigh
from threadpoolctl import ThreadpoolController

from raygeom.errors import InputError
from raygeom.numerics.limits import MIN_SAMPLES  # noqa: F401 - re-exported
from raygeom.numerics.rank import check_readout_rank
from raygeom.numerics.tensors import shared_tensor
from raygeom.numerics.ties import Groups, duplicate_groups
from raygeom.numerics.uncertainty import summarize_null, z_uncertainty  # noqa: F401 - summarize_null re-exported

MAX_PAIRS_PER_BIN = 256
EXACT_RANK_PAIRS = 1 << 14


def _check_matrix(name: str, a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 2:
        raise InputError(f"{name} must be a 2-D array, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise InputError(f"{name} contains NaN or inf values")
    return a


def _check_k(k: int, d: int) -> None:
    if not 0 < k < d:
        raise InputError(f"k must satisfy 0 < k < d; got k={k}, d={d}")


def readout_basis(w_u: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` right singular vectors (``d x k``) and singular values of ``W_U`` (``V x d``).

    Computed from the ``d x d`` Gram matrix, which is exact up to float64
    rounding and much cheaper than an SVD of a ``V x d`` matrix with V ~ 50k-260k.
    Each vector's sign makes its largest-magnitude entry positive.
    """
    w_u = _check_matrix("W_U", w_u)
    _check_k(k, w_u.shape[1])
    w64 = w_u.astype(np.float64, copy=False)
    basis, singular = readout_basis_from_gram(w64.T @ w64, k)
    check_readout_rank(singular, k, w_u.shape)
    return basis, singular


def readout_basis_from_gram(gram: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`readout_basis` from ``W_U^T W_U`` (``d x d``), for callers that form it on a GPU."""
    gram = _check_matrix("W_U^T W_U", gram).astype(np.float64, copy=False)
    _check_k(k, gram.shape[0])
    eigvals, vectors = _top_eigh(gram, k)
    return _fix_signs(vectors), np.sqrt(np.clip(eigvals, 0.0, None))


def _top_eigh(sym: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Largest ``count`` eigenpairs of a symmetric matrix, in descending order."""
    n = sym.shape[0]
    vals, vecs = eigh(sym, subset_by_index=[n - count, n - 1], driver="evr")
    return vals[::-1], vecs[:, ::-1]


def _fix_signs(vectors: np.ndarray) -> np.ndarray:
    pivot = np.abs(vectors).argmax(axis=0)
    return vectors * np.sign(vectors[pivot, np.arange(vectors.shape[1])])


def principal_directions(centred: np.ndarray, r: int) -> np.ndarray:
    """Top-``r`` principal directions (``r x d``, unit rows) of an already centred matrix.

    Uses the eigenvectors of whichever Gram matrix (N x N or d x d) is smaller.
    """
    n, d = centred.shape
    if d <= n:
        _, vecs = _top_eigh(centred.T @ centred, r)
        return _fix_signs(vecs).T
    _, left = _top_eigh(centred @ centred.T, r)
    directions = centred.T @ left
    directions /= np.linalg.norm(directions, axis=0, keepdims=True)
    return _fix_signs(directions).T


def ccr(h: np.ndarray, r: int = 1) -> np.ndarray:
    """Mean-centre ``H`` over samples, then project out its top-``r`` principal directions."""
    h = _check_matrix("H", h).astype(np.float64)
    if r < 0 or r >= min(h.shape):
        raise InputError(f"CCR rank r must satisfy 0 <= r < min(N, d); got r={r}, shape={h.shape}")
    centred = h - h.mean(axis=0, keepdims=True)
    scale = float(np.abs(h).max()) if h.size else 0.0
    # Below float32 resolution of the input, "centred" is rounding noise, not geometry.
    if float(np.abs(centred).max(initial=0.0)) <= 1e-6 * max(scale, 1e-30):
        raise InputError("all samples have the same vector at this layer, so it has no pairwise geometry")
    if r == 0:
        return centred
    top = principal_directions(centred, r)
    return centred - (centred @ top.T) @ top


def _null_gaussian(d: int, k: int, seed: int, index: int) -> np.ndarray:
    return np.random.default_rng([int(seed), int(index)]).standard_normal((d, k))


def random_subspace(d: int, k: int, seed: int, index: int) -> np.ndarray:
    """Null subspace ``index``: uniform on the Grassmannian, from a generator seeded by (seed, index).

    Q of the QR of a ``d x k`` standard-normal matrix, signs fixed so diag(R) > 0.
    """
    _check_k(k, d)
    q, r = np.linalg.qr(_null_gaussian(d, k, seed, index))
    return q * np.sign(np.diag(r))


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    # A zero row has no direction; it gets cosine 0 (distance 1) to everything.
    return x / np.where(norms > 0, norms, 1.0)


def pairwise_cosine_distances(x: np.ndarray) -> np.ndarray:
    """Cosine distances of all pairs i<j, in ``scipy.spatial.distance.pdist`` order (float64)."""
    x = _check_matrix("X", x).astype(np.float64)
    unit = _unit_rows(x)
    return 1.0 - (unit @ unit.T)[np.triu_indices(len(x), 1)]


def average_ranks(values: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """1-based ranks (float64); tied values share the mean of their ranks, as ``rankdata(method="average")``.

    With ``weights`` (positive integers), value ``i`` stands for ``weights[i]`` tied copies of itself:
    the result is the average rank those copies would get in the expanded vector.
    """
    values = np.asarray(values).ravel()
    n = values.size
    if n == 0:
        return np.empty(0)
    if weights is not None:
        weights = np.asarray(weights, dtype=np.float64).ravel()
        if weights.size != n or not (weights >= 1).all():  # O(n), as the ranking itself
            raise InputError(f"weights must be {n} counts >= 1 (one per value), got {weights.size} values")
        return _weighted_average_ranks(values, weights)
    order = np.argsort(values)
    sorted_values = values[order]
    starts_group = np.empty(n, dtype=bool)
    starts_group[0] = True
    np.not_equal(sorted_values[1:], sorted_values[:-1], out=starts_group[1:])
    ranks = np.empty(n)
    if starts_group.all():
        ranks[order] = np.arange(1.0, n + 1.0)
        return ranks
    starts = np.flatnonzero(starts_group)
    ends = np.append(starts[1:], n)
    ranks[order] = np.repeat((starts + 1 + ends) * 0.5, ends - starts)
    return ranks


def _weighted_average_ranks(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    starts_group = np.empty(values.size, dtype=bool)
    starts_group[0] = True
    np.not_equal(sorted_values[1:], sorted_values[:-1], out=starts_group[1:])
    group = np.cumsum(starts_group) - 1
    group_weight = np.bincount(group, weights=weights[order])
    group_rank = np.cumsum(group_weight) - (group_weight - 1.0) * 0.5
    ranks = np.empty(values.size)
    ranks[order] = group_rank[group]
    return ranks


def _n_bins(n_values: int) -> int:
    return int(min(1 << 24, max(1 << 10, 1 << max(0, int(np.ceil(np.log2(max(n_values, 2) / 8)))))))


def _exact_average_ranks(values: torch.Tensor) -> torch.Tensor:
    order = torch.argsort(values)
    sorted_values = values[order]
    _, inverse, counts = torch.unique_consecutive(sorted_values, return_inverse=True, return_counts=True)
    group_ranks = torch.cumsum(counts, 0).double() - (counts.double() - 1.0) * 0.5
    ranks = torch.empty_like(group_ranks[inverse])
    ranks[order] = group_ranks[inverse]
    return ranks


def _exact_weighted_average_ranks(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """:func:`_exact_average_ranks` where value ``i`` stands for ``weights[i]`` (float64) tied copies."""
    order = torch.argsort(values)
    _, inverse, counts = torch.unique_consecutive(values[order], return_inverse=True, return_counts=True)
    group_weight = torch.zeros(counts.numel(), dtype=torch.float64, device=values.device)
    group_weight.index_add_(0, inverse, weights[order])
    group_ranks = torch.cumsum(group_weight, 0) - (group_weight - 1.0) * 0.5
    ranks = torch.empty_like(group_weight[inverse])
    ranks[order] = group_ranks[inverse]
    return ranks


PAIR_BLOCK = 256


class PairLayout:
    """The order in which the fast path holds the N(N-1)/2 pairs i < j.

    Rows are cut into blocks of ``block``. For each block the pairs with every
    later row form a dense rectangle, which a GEMM writes straight into the pair
    vector; the pairs inside each diagonal block follow at the end. This computes
    half of the Gram matrix and never gathers the triangle out of a full one.
    ``pdist_index[p]`` is the ``scipy.spatial.distance.pdist`` position of pair ``p``.
    """

    def __init__(self, n: int, block: int = PAIR_BLOCK):
        self.n = n
        self.blocks = [(start, min(start + block, n)) for start in range(0, n, block)]
        self.n_pairs = n * (n - 1) // 2
        offset = 0
        self.rectangles = []
        for start, stop in self.blocks:
            if stop < n:
                self.rectangles.append((start, stop, offset))
                offset += (stop - start) * (n - stop)
        self.diagonals = []
        for start, stop in self.blocks:
            self.diagonals.append((start, stop, offset))
            offset += (stop - start) * (stop - start - 1) // 2
        assert offset == self.n_pairs
        self._scratch: dict = {}

    @property
    def pdist_index(self) -> np.ndarray:
        n = self.n
        parts = []
        for start, stop, _ in self.rectangles:
            rows, cols = np.meshgrid(np.arange(start, stop), np.arange(stop, n), indexing="ij")
            parts.append((rows, cols))
        for start, stop, _ in self.diagonals:
            rows, cols = np.triu_indices(stop - start, 1)
            parts.append((rows + start, cols + start))
        rows = np.concatenate([r.ravel() for r, _ in parts]).astype(np.int64)
        cols = np.concatenate([c.ravel() for _, c in parts]).astype(np.int64)
        return rows * n - rows * (rows + 1) // 2 + cols - rows - 1

    def fill(self, left: torch.Tensor, right: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out[p] = left[i] . right[j]`` for every pair ``p = (i, j)`` in layout order."""
        n = self.n
        for start, stop, offset in self.rectangles:
            size = (stop - start) * (n - stop)
            torch.matmul(left[start:stop], right[stop:].T, out=out[offset : offset + size].view(stop - start, n - stop))
        square, upper = self._diagonal_scratch(out.dtype, out.device)
        for start, stop, offset in self.diagonals:
            size = stop - start
            block = torch.matmul(left[start:stop], right[start:stop].T, out=square[: size * size].view(size, size))
            torch.index_select(block.view(-1), 0, upper[size], out=out[offset : offset + upper[size].numel()])
        return out

    def _diagonal_scratch(self, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """One diagonal block's buffer and the flat indices of its strict upper triangle, made once per
        layout and device: ``fill`` runs once per subspace."""
        key = (dtype, device)
        if key not in self._scratch:
            width = self.blocks[0][1] - self.blocks[0][0]
            upper = {}
            for start, stop, _ in self.diagonals:
                size = stop - start
                if size not in upper:
                    rows, cols = torch.triu_indices(size, size, 1, device=device)
                    upper[size] = rows * size + cols
            self._scratch[key] = (torch.empty(width * width, dtype=dtype, device=device), upper)
        return self._scratch[key]


class TiedPairs:
    """The pairs of a layer with identical rows, held once per pair of distinct rows.

    Values are the :class:`PairLayout` pairs of the ``G`` representative rows,
    then one entry per group of two or more identical rows (its pairs all have
    distance exactly 0). ``weights`` (float64, exact integers) says how many of
    the N(N-1)/2 pairs each value stands for; they sum to N(N-1)/2.
    """

    def __init__(self, groups: Groups):
        self.groups = groups
        sizes = groups.sizes.astype(np.float64)
        self.layout = PairLayout(groups.n_groups)
        self.within = np.flatnonzero(groups.sizes >= 2)
        self.n_values = self.layout.n_pairs + self.within.size
        between = np.outer(sizes, sizes)[np.triu_indices(groups.n_groups, 1)][self.layout.pdist_index]
        self.weights = np.concatenate([between, sizes[self.within] * (sizes[self.within] - 1.0) * 0.5])
        n = groups.labels.size
        self.n_pairs = n * (n - 1) // 2

    def fill_negated_similarities(self, unit: torch.Tensor, out: torch.Tensor, within: torch.Tensor) -> torch.Tensor:
        """Minus the cosine similarity of every value, from the ``G`` unit representative rows.

        A pair inside a group is exactly -1 (distance 0), or 0 for a zero row, which has no
        direction; values are clipped to [-1, 1] as ``scipy.spatial.distance.cosine`` does.
        """
        pairs = self.layout.n_pairs
        self.layout.fill(unit.neg(), unit, out[:pairs])
        rows = unit.index_select(0, within)
        out[pairs:] = -(rows.abs().amax(dim=1) > 0).to(out.dtype)
        return out.clamp_(-1.0, 1.0)


@dataclass(frozen=True)
class PreparedLayer:
    """One layer, corrected and with its full-space distance ranks computed once.

    ``corrected`` is float32 (N x d); rows that were identical in ``H`` are bitwise
    identical here. ``centred_full_ranks`` are the exact average ranks of the
    full-space cosine distances minus their mean, as float32 (exact half-integers
    up to N of about 5,800), in :class:`PairLayout` order, or in
    :class:`TiedPairs` order when ``groups`` (the group label of each row of ``H``
    by byte equality) is set because ``H`` has identical rows.
    """

    corrected: np.ndarray
    centred_full_ranks: np.ndarray
    full_ranks_norm: float
    ccr_rank: int
    groups: np.ndarray | None = None

    @property
    def n_samples(self) -> int:
        return self.corrected.shape[0]

    @property
    def dim(self) -> int:
        return self.corrected.shape[1]


def prepare_layer(h: np.ndarray, r: int = 1) -> PreparedLayer:
    h = _check_matrix("H", h)
    if h.shape[0] < MIN_SAMPLES:
        raise InputError(f"need at least {MIN_SAMPLES} samples, got N={h.shape[0]}")
    labels = duplicate_groups(h)
    corrected = ccr(h, r).astype(np.float32)
    if labels is None:
        unit = torch.from_numpy(_unit_rows(corrected).astype(np.float32))
        layout = PairLayout(len(corrected))
        similarities = layout.fill(unit, unit, torch.empty(layout.n_pairs))
        # Cosine distance is 1 - similarity, so ranking distances is ranking -similarity.
        ranks = average_ranks(similarities.neg_().numpy())
        centred = ranks - ranks.mean()
        return PreparedLayer(corrected, centred.astype(np.float32), float(np.sqrt(np.dot(centred, centred))), r)
    groups = Groups.of(labels)
    corrected = groups.snap(corrected)
    tied = TiedPairs(groups)
    unit = torch.from_numpy(_unit_rows(corrected[groups.representatives]).astype(np.float32))
    values = tied.fill_negated_similarities(unit, torch.empty(tied.n_values), torch.from_numpy(tied.within))
    centred = average_ranks(values.numpy(), tied.weights) - (tied.n_pairs + 1) / 2.0
    norm = float(np.sqrt(np.dot(tied.weights * centred, centred)))
    return PreparedLayer(corrected, centred.astype(np.float32), norm, r, labels)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class _SubspaceScorer:
    """Scores subspaces of one prepared layer on one torch device.

    Per subspace: a GEMM writes the (negated) cosine similarities of all pairs into
    one buffer, a counting sort over value bins ranks them, and two bincounts give
    the Spearman sums without a per-pair gather. The per-pair buffers are allocated
    once and reused by every subspace: on CPU, fresh multi-megabyte allocations
    cost more than the arithmetic. With identical rows, only the distinct rows are
    projected and the values carry weights (:class:`TiedPairs`).
    """

    def __init__(self, layer: PreparedLayer, device: str | None = None):
        self.layer = layer
        self.device = torch.device(device or default_device())
        self.reference = shared_tensor(layer.centred_full_ranks).to(self.device)
        if layer.groups is None:
            self.tied = None
            self.x = shared_tensor(layer.corrected).to(self.device)
            self.layout = PairLayout(layer.n_samples)
            n_values = self.layout.n_pairs
            self.mean_rank = (n_values + 1) / 2.0
        else:
            self.tied = TiedPairs(Groups.of(layer.groups))
            self.x = torch.from_numpy(layer.corrected[self.tied.groups.representatives]).to(self.device)
            self.within = torch.from_numpy(self.tied.within).to(self.device)
            self.weights = torch.from_numpy(self.tied.weights).to(self.device)
            self.weighted_reference = self.weights * self.reference.double()
            n_values = self.tied.n_values
            self.mean_rank = (self.tied.n_pairs + 1) / 2.0
        self.n_bins = _n_bins(n_values)
        self.exact_only = n_values <= EXACT_RANK_PAIRS
        self.values = torch.empty(n_values, device=self.device)
        self.scaled = torch.empty(n_values, device=self.device)
        self.keys = torch.empty(n_values, dtype=torch.int32, device=self.device)

    def rho_of_projection(self, projected: torch.Tensor) -> float:
        norms = projected.norm(dim=1, keepdim=True)
        # A zero row has no direction; it gets cosine 0 (distance 1) to everything.
        unit = (projected / torch.where(norms > 0, norms, torch.ones_like(norms))).float()
        # Cosine distance is 1 - similarity, so ranking distances is ranking -similarity.
        if self.tied is None:
            self.layout.fill(unit.neg(), unit, self.values)
        else:
            self.tied.fill_negated_similarities(unit, self.values, self.within)
        return self._spearman(self.values)

    def _spearman(self, values: torch.Tensor) -> float:
        lo, hi = torch.aminmax(values)
        if not bool(hi > lo) or self.layer.full_ranks_norm == 0.0:
            return float("nan")
        if self.exact_only:
            return self._exact_spearman(values)
        scaled = torch.sub(values, lo, out=self.scaled)
        scaled.mul_((self.n_bins - 1) / (hi - lo))
        keys = self.keys.copy_(scaled)
        counts = torch.bincount(keys, minlength=self.n_bins)
        if int(counts.max()) > MAX_PAIRS_PER_BIN:
            return self._exact_spearman(values)
        if self.tied is None:
            counts = counts.double()
            reference_per_bin = torch.bincount(keys, weights=self.reference, minlength=self.n_bins)
        else:
            # A bin holds a few distinct values, each standing for `weight` tied pairs.
            counts = torch.bincount(keys, weights=self.weights, minlength=self.n_bins)
            reference_per_bin = torch.bincount(keys, weights=self.weighted_reference, minlength=self.n_bins)
        centred_bins = torch.cumsum(counts, 0) - (counts - 1.0) * 0.5 - self.mean_rank
        sum_sq = torch.dot(counts, centred_bins * centred_bins)
        # sum over pairs of rank * reference = sum over bins of bin rank * (reference summed in the bin)
        cross = torch.dot(centred_bins, reference_per_bin.double())
        return self._rho(cross, sum_sq)

    def _exact_spearman(self, values: torch.Tensor) -> float:
        if self.tied is None:
            centred = _exact_average_ranks(values) - self.mean_rank
            sum_sq = torch.dot(centred, centred)
            cross = torch.dot(centred, self.reference.double())
        else:
            centred = _exact_weighted_average_ranks(values, self.weights) - self.mean_rank
            sum_sq = torch.dot(self.weights * centred, centred)
            cross = torch.dot(centred, self.weighted_reference)
        return self._rho(cross, sum_sq)

    def _rho(self, cross: torch.Tensor, sum_sq: torch.Tensor) -> float:
        if float(sum_sq) == 0.0:
            return float("nan")
        return float(cross / (self.layer.full_ranks_norm * torch.sqrt(sum_sq)))

    def rho_of_basis(self, basis: np.ndarray) -> float:
        if basis.shape[0] != self.layer.dim:
            raise InputError(f"basis has {basis.shape[0]} rows but the layer has d={self.layer.dim}")
        return self.rho_of_projection(self.x @ torch.from_numpy(np.ascontiguousarray(basis, dtype=np.float32)).to(self.device))

    def rho_of_null(self, k: int, seed: int, index: int) -> float:
        """rho of null ``index`` without an explicit QR.

        With A = QR and diag(R) > 0, R is the Cholesky factor of A^T A, so
        x Q = (x A) R^{-1}: the coordinates of :func:`random_subspace` at a
        fraction of the cost.
        """
        a, r_inverse = _null_factors(self.layer.dim, k, seed, index)
        xa = self.x @ a.to(self.device)
        return self.rho_of_projection(xa @ r_inverse.to(self.device))


NULL_FACTOR_BYTES = 256 << 20
_null_factor_cache: OrderedDict[tuple[int, int, int, int], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
_null_factor_bytes = 0
_null_factor_lock = Lock()


def _null_factors(d: int, k: int, seed: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Null ``index``'s Gaussian ``A`` (d x k) and ``R^{-1}`` (k x k, from the Cholesky factor of A^T A), float32 on
    the CPU; kept for later calls of this process up to :data:`NULL_FACTOR_BYTES`, least recently used out first.
    Every layer of a model and every half-sample of its texts draws the same nulls, and drawing one (the Gaussian,
    A^T A, Cholesky, inverse) cost as much as scoring it at N = 200 here. A pure function of its arguments: a kept
    pair is the pair computed afresh, bit for bit."""
    global _null_factor_bytes
    key = (int(d), int(k), int(seed), int(index))
    with _null_factor_lock:
        kept = _null_factor_cache.get(key)
        if kept is not None:
            _null_factor_cache.move_to_end(key)
            return kept
    a = _null_gaussian(d, k, seed, index)
    r_inverse = np.linalg.inv(np.linalg.cholesky(a.T @ a).T)
    kept = torch.from_numpy(a.astype(np.float32)), torch.from_numpy(r_inverse.astype(np.float32))
    with _null_factor_lock:
        if key not in _null_factor_cache:
            _null_factor_cache[key] = kept
            _null_factor_bytes += _nbytes(kept)
        while len(_null_factor_cache) > 1 and _null_factor_bytes > NULL_FACTOR_BYTES:
            _null_factor_bytes -= _nbytes(_null_factor_cache.popitem(last=False)[1])
    return kept


def _nbytes(tensors: tuple[torch.Tensor, ...]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@contextmanager
def _one_cpu_thread(device: torch.device):
    """On CPU the per-subspace work is memory-bound and made of small ops: one thread is 2-4x
    faster than two here, and OpenBLAS threads spinning beside torch's slow both down.
    Parallelism comes from running chunks of nulls in separate processes (Ray tasks)."""
    if device.type != "cpu":
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with _thread_pools().limit(limits=1):
            yield
    finally:
        torch.set_num_threads(previous)


_pools: tuple[int, ThreadpoolController] | None = None


def _thread_pools() -> ThreadpoolController:
    """This process's BLAS/OpenMP pools, found again only after an import: finding them scans every loaded library
    (1-10 ms a call here, about 2 CPU-s of a small job's null task), and a library loads only with a module."""
    global _pools
    if _pools is None or _pools[0] != len(sys.modules):
        _pools = (len(sys.modules), ThreadpoolController())
    return _pools[1]


def subspace_rho(layer: PreparedLayer, basis: np.ndarray, device: str | None = None) -> float:
    """Spearman correlation of full-space and subspace cosine distances for one ``d x k`` basis."""
    scorer = _SubspaceScorer(layer, device)
    with _one_cpu_thread(scorer.device):
        return scorer.rho_of_basis(basis)


def null_rhos(layer: PreparedLayer, k: int, seed: int, indices: Iterable[int], device: str | None = None) -> np.ndarray:
    """rho of the null subspaces with the given indices; null ``i`` depends only on (seed, i)."""
    _check_k(k, layer.dim)
    scorer = _SubspaceScorer(layer, device)
    with _one_cpu_thread(scorer.device):
        return np.array([scorer.rho_of_null(k, seed, i) for i in indices], dtype=np.float64)


@dataclass(frozen=True)
class PGAResult:
    rho_readout: float
    null_mean: float
    null_std: float
    z: float
    k: int
    r: int
    n: int
    n_null: int
    seed: int
    # z's Monte-Carlo error from the finite null and the empirical p-values (uncertainty.z_uncertainty);
    # NaN where z is undefined.
    z_se: float = float("nan")
    z_lo: float = float("nan")
    z_hi: float = float("nan")
    z_half_width: float = float("nan")
    p_upper: float = float("nan")
    p_lower: float = float("nan")

    def to_dict(self) -> dict:
        return asdict(self)


def subspace_pga(
    h: np.ndarray,
    w_u: np.ndarray | None = None,
    *,
    readout: np.ndarray | None = None,
    k: int = 100,
    r: int = 1,
    n_null: int = 100,
    seed: int = 0,
    device: str | None = None,
) -> PGAResult:
    """Subspace PGA z-score of one layer ``H`` (N x d) against ``W_U`` (V x d), with z's
    Monte-Carlo error and the empirical p-values (:func:`raygeom.numerics.uncertainty.z_uncertainty`,
    its bootstrap seeded by ``seed``).

    Pass ``readout`` (the d x k basis from :func:`readout_basis`) instead of
    ``w_u`` to reuse a basis across layers.
    """
    h = _check_matrix("H", h)
    _check_k(k, h.shape[1])
    if readout is None:
        if w_u is None:
            raise InputError("give either W_U or a readout basis")
        if w_u.shape[1] != h.shape[1]:
            raise InputError(f"W_U has d={w_u.shape[1]} but H has d={h.shape[1]}")
        readout, _ = readout_basis(w_u, k)
    layer = prepare_layer(h, r)
    scorer = _SubspaceScorer(layer, device)
    with _one_cpu_thread(scorer.device):
        rho = scorer.rho_of_basis(readout[:, :k])
        nulls = [scorer.rho_of_null(k, seed, i) for i in range(n_null)]
    stats = summarize_null(rho, nulls)
    error = {}
    if np.isfinite(stats["z"]):
        names = ("z_se", "z_lo", "z_hi", "z_half_width", "p_upper", "p_lower")
        error = {name: value for name, value in z_uncertainty(rho, nulls, seed).items() if name in names}
    return PGAResult(rho, stats["null_mean"], stats["null_std"], stats["z"], k, r, h.shape[0], n_null, seed, **error)
