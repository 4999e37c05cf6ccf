"""Cross-model convergence, as ../METRICS.md defines it.

The same N inputs go through models A and B. Each model's ``H`` is CCR-r
corrected as in PGA, then the Spearman correlation of A's and B's pairwise
cosine distances is taken (a) in full space, (b) each in its own readout
subspace, (c) each in random ``k``-dim subspaces.

Unlike PGA, neither side's ranks are fixed across subspaces, so both distance
vectors are ranked exactly (ties share their mean rank) for every subspace.
Rows that are identical in a model's ``H`` are grouped once (byte equality);
that side's distances are then computed on the distinct rows and spread out to
all pairs, so pairs that are equal in exact arithmetic are equal floats and
share their rank on any CPU (:mod:`raygeom.numerics.ties`).

Null draw ``i`` of model A is ``random_subspace(d_a, k, seed, i)``; that of
model B is ``random_subspace(d_b, k, seed + MODEL_B_SEED_OFFSET, i)``. Seeds
must lie in ``[0, 2**32)``, so B's draws never coincide with A's draws for any
seed, even when ``d_a == d_b``; and each draw depends only on (seed, i), so the
nulls can be split across workers in any way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch

from raygeom.errors import InputError
from raygeom.numerics.pga import (
    MIN_SAMPLES,
    _check_k,
    _check_matrix,
    _exact_average_ranks,
    ccr,
    default_device,
    random_subspace,
)
from raygeom.numerics.ties import Groups, duplicate_groups, tied_similarities

MODEL_B_SEED_OFFSET = 2**32


def _check_seed(seed: int) -> int:
    if not 0 <= int(seed) < MODEL_B_SEED_OFFSET:
        raise InputError(f"seed must satisfy 0 <= seed < 2**32; got {seed}")
    return int(seed)


def null_subspaces(d_a: int, d_b: int, k: int, seed: int, index: int) -> tuple[np.ndarray, np.ndarray]:
    """Null ``index``: the ``d_a x k`` subspace of model A and the ``d_b x k`` subspace of model B."""
    seed = _check_seed(seed)
    return random_subspace(d_a, k, seed, index), random_subspace(d_b, k, seed + MODEL_B_SEED_OFFSET, index)


@dataclass(frozen=True)
class PreparedPair:
    """Both models' CCR-r corrected ``H`` (float32, ``N x d_a`` and ``N x d_b``).

    ``groups_a`` / ``groups_b``: the group label of each row when that model's ``H``
    has identical rows (byte equality), else None; identical rows are bitwise
    identical in the corrected matrix too.
    """

    corrected_a: np.ndarray
    corrected_b: np.ndarray
    ccr_rank: int
    groups_a: np.ndarray | None = None
    groups_b: np.ndarray | None = None

    @property
    def n_samples(self) -> int:
        return self.corrected_a.shape[0]

    @property
    def dim_a(self) -> int:
        return self.corrected_a.shape[1]

    @property
    def dim_b(self) -> int:
        return self.corrected_b.shape[1]


def prepare_pair(h_a: np.ndarray, h_b: np.ndarray, r: int = 1) -> PreparedPair:
    h_a = _check_matrix("H_a", h_a)
    h_b = _check_matrix("H_b", h_b)
    if h_a.shape[0] != h_b.shape[0]:
        raise InputError(f"H_a and H_b must hold the same N inputs; got N={h_a.shape[0]} and N={h_b.shape[0]}")
    if h_a.shape[0] < MIN_SAMPLES:
        raise InputError(f"need at least {MIN_SAMPLES} samples, got N={h_a.shape[0]}")
    corrected_a, groups_a = tied_ccr(h_a, r)
    corrected_b, groups_b = tied_ccr(h_b, r)
    return PreparedPair(corrected_a, corrected_b, r, groups_a, groups_b)


def tied_ccr(h: np.ndarray, r: int) -> tuple[np.ndarray, np.ndarray | None]:
    """CCR-r corrected ``H`` as float32, and the group label of each row when ``H`` has identical rows
    (byte equality), whose corrected rows are then made bitwise identical; else None."""
    labels = duplicate_groups(h)
    corrected = ccr(h, r).astype(np.float32)
    if labels is not None:
        corrected = Groups.of(labels).snap(corrected)
    return corrected, labels


class DistanceRanker:
    """Centred exact average ranks of one model's pairwise cosine distances (pdist order), on one device.

    ``x`` is the corrected ``H`` (``N x d``); ``groups`` the label of each row when it has identical
    rows. Then only the distinct rows are projected, and their similarities are spread to all pairs
    (:func:`raygeom.numerics.ties.tied_similarities`), so exact ties share their rank. The Gram buffer
    and pair indices live in ``scratch``, which rankers of the same N may share: they are made once
    and reused by every subspace.
    """

    def __init__(self, x: np.ndarray, groups: np.ndarray | None, device: torch.device, scratch: dict | None = None):
        n = x.shape[0]
        self.device = device
        self.mean_rank = (n * (n - 1) // 2 + 1) / 2.0
        self.scratch = {} if scratch is None else scratch
        if groups is None:
            self.x = x
            self.expansion = None
            if ("pairs", n) not in self.scratch:
                rows, cols = torch.triu_indices(n, n, 1, device=device)
                self.scratch["pairs", n] = rows * n + cols
            self.pair_index = self.scratch["pairs", n]
            size = n
        else:
            tied = Groups.of(groups)
            self.x = x[tied.representatives]
            self.expansion = torch.from_numpy(tied.pdist_expansion()).to(device)
            size = tied.n_groups
        if ("gram", size) not in self.scratch:
            self.scratch["gram", size] = torch.empty((size, size), device=device)
        self.gram = self.scratch["gram", size]

    def project(self, basis: np.ndarray | None) -> torch.Tensor:
        x = torch.from_numpy(np.array(self.x, dtype=np.float32)).to(self.device)  # a copy: Ray hands out read-only arrays
        if basis is None:
            return x
        return x @ torch.from_numpy(np.ascontiguousarray(basis, dtype=np.float32)).to(self.device)

    def centred_ranks(self, projected: torch.Tensor) -> tuple[torch.Tensor, float]:
        norms = projected.norm(dim=1, keepdim=True)
        # A zero row has no direction; it gets cosine 0 (distance 1) to everything.
        unit = (projected / torch.where(norms > 0, norms, torch.ones_like(norms))).float()
        if self.expansion is None:
            torch.matmul(unit, unit.T, out=self.gram)
            similarities = torch.index_select(self.gram.view(-1), 0, self.pair_index)
        else:
            similarities = tied_similarities(unit, self.expansion, self.gram)
        # Cosine distance is 1 - similarity, so ranking distances is ranking -similarity.
        centred = _exact_average_ranks(similarities.neg_()) - self.mean_rank
        return centred, float(torch.sqrt(torch.dot(centred, centred)))


class _PairScorer:
    """Spearman correlation of A's and B's pairwise cosine distances, on one torch device."""

    def __init__(self, pair: PreparedPair, device: str | None = None):
        self.pair = pair
        self.device = torch.device(device or default_device())
        self.a = DistanceRanker(pair.corrected_a, pair.groups_a, self.device)
        self.b = DistanceRanker(pair.corrected_b, pair.groups_b, self.device, self.a.scratch)

    def rho(self, projected_a: torch.Tensor, projected_b: torch.Tensor) -> float:
        ranks_a, norm_a = self.a.centred_ranks(projected_a)
        ranks_b, norm_b = self.b.centred_ranks(projected_b)
        if norm_a == 0.0 or norm_b == 0.0:
            return float("nan")
        return float(torch.dot(ranks_a, ranks_b)) / (norm_a * norm_b)

    def rho_full(self) -> float:
        return self.rho(self.a.project(None), self.b.project(None))

    def rho_of_bases(self, basis_a: np.ndarray, basis_b: np.ndarray) -> float:
        return self.rho(self.a.project(basis_a), self.b.project(basis_b))

    def rho_of_null(self, k: int, seed: int, index: int) -> float:
        q_a, q_b = null_subspaces(self.pair.dim_a, self.pair.dim_b, k, seed, index)
        return self.rho_of_bases(q_a, q_b)


def _check_basis(name: str, basis: np.ndarray, d: int, k: int) -> np.ndarray:
    basis = _check_matrix(name, basis)
    if basis.shape[0] != d:
        raise InputError(f"{name} has {basis.shape[0]} rows but its H has d={d}")
    if basis.shape[1] < k:
        raise InputError(f"{name} has {basis.shape[1]} columns, fewer than k={k}")
    return basis[:, :k]


def convergence_result(
    rho_full: float, rho_readout: float, null_rhos: Sequence[float], *, k: int, r: int, n: int, seed: int
) -> dict:
    """The result dict of :func:`convergence` from its parts (e.g. nulls gathered from workers).

    ``z = (rho_readout - null_mean) / null_std``: how much more the readout
    subspaces agree than random ones. With fewer than 2 nulls the null
    statistics are NaN.
    """
    rhos = np.asarray(null_rhos, dtype=np.float64)
    if rhos.size >= 2:
        mean, std = float(rhos.mean()), float(rhos.std(ddof=1))
    else:
        mean, std = float("nan"), float("nan")
    z = (rho_readout - mean) / std if std > 0 else float("nan")
    return {
        "rho_full": float(rho_full),
        "rho_readout": float(rho_readout),
        "null_mean": mean,
        "null_std": std,
        "z": float(z),
        "k": int(k),
        "r": int(r),
        "n": int(n),
        "n_null": int(rhos.size),
        "seed": int(seed),
    }


def convergence(
    h_a: np.ndarray,
    h_b: np.ndarray,
    basis_a: np.ndarray,
    basis_b: np.ndarray,
    k: int,
    r: int = 1,
    n_null: int = 100,
    seed: int = 0,
    null_indices: Iterable[int] | None = None,
    device: str | None = None,
) -> dict:
    """Convergence of models A and B on the same N inputs.

    ``basis_a`` (``d_a x >=k``) and ``basis_b`` (``d_b x >=k``) are the readout
    bases; their first ``k`` columns are used. The nulls are draws
    ``range(n_null)``, or ``null_indices`` when given (``[]`` skips them).
    """
    h_a = _check_matrix("H_a", h_a)
    h_b = _check_matrix("H_b", h_b)
    _check_k(k, h_a.shape[1])
    _check_k(k, h_b.shape[1])
    _check_seed(seed)
    basis_a = _check_basis("basis_a", basis_a, h_a.shape[1], k)
    basis_b = _check_basis("basis_b", basis_b, h_b.shape[1], k)
    pair = prepare_pair(h_a, h_b, r)
    scorer = _PairScorer(pair, device)
    indices = range(n_null) if null_indices is None else null_indices
    return convergence_result(
        scorer.rho_full(),
        scorer.rho_of_bases(basis_a, basis_b),
        [scorer.rho_of_null(k, seed, i) for i in indices],
        k=k,
        r=r,
        n=pair.n_samples,
        seed=seed,
    )
