"""Cross-model convergence for every pair of layers at once, factorised by layer.

:func:`raygeom.numerics.convergence.convergence` scores one (layer of A, layer
of B) pair. Its Spearman rho is ``<c_a, c_b> / (|c_a| |c_b|)`` where ``c_a``
are the centred exact ranks of A's pairwise cosine distances in some space
(full, readout, or null draw ``i``). ``c_a`` depends on A's layer and the
space only, never on B's layer: null draw ``i`` of A is
``random_subspace(d_a, k, seed, i)`` whichever B layer it is paired with.
So the ranks of each layer are computed once and every cell of the
``L_a x L_b`` grid is a dot product: ``L_a + L_b`` rankings per space instead
of ``L_a * L_b``. The values equal :func:`convergence`'s cell by cell (same
float32 similarities, same exact average ranks); a test checks that.

Identical rows: :func:`prepare_layer` makes rows that are identical in ``H``
bitwise identical after CCR, and each layer's groups of identical rows are found
once per call (byte equality of the corrected rows), so exact ties share their
rank as in :mod:`raygeom.numerics.convergence`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch

from raygeom.errors import InputError
from raygeom.numerics.convergence import DistanceRanker, _check_seed, null_subspaces, tied_ccr
from raygeom.numerics.pga import MIN_SAMPLES, _check_k, _check_matrix
from raygeom.numerics.ties import duplicate_groups


@dataclass(frozen=True)
class LayerRanks:
    """Centred exact ranks of one layer's pairwise cosine distances (pdist order) and their norm."""

    centred: np.ndarray
    norm: float


def prepare_layer(h: np.ndarray, r: int = 1) -> np.ndarray:
    """CCR-r corrected ``H`` as float32, exactly as :func:`convergence.prepare_pair` makes each side
    (rows identical in ``H`` are bitwise identical here)."""
    h = _check_matrix("H", h)
    if h.shape[0] < MIN_SAMPLES:
        raise InputError(f"need at least {MIN_SAMPLES} samples, got N={h.shape[0]}")
    return tied_ccr(h, r)[0]


class _Rankers:
    """One :class:`DistanceRanker` per layer of a model, built once per call."""

    def __init__(self, layers: Sequence[np.ndarray], device: str = "cpu", scratch: dict | None = None):
        self.scratch = {} if scratch is None else scratch
        self.rankers = []
        for x in layers:
            x = np.asarray(x, dtype=np.float32)
            self.rankers.append(DistanceRanker(x, duplicate_groups(x), torch.device(device), self.scratch))

    def ranks(self, basis: np.ndarray | None = None) -> list[LayerRanks]:
        out = []
        for ranker in self.rankers:
            centred, norm = ranker.centred_ranks(ranker.project(basis))
            out.append(LayerRanks(centred.cpu().numpy(), norm))
        return out


def _grid(ranks_a: Sequence[LayerRanks], ranks_b: Sequence[LayerRanks]) -> np.ndarray:
    """rho for every (a, b); NaN where a side's distances are all tied."""
    stack_a = np.stack([r.centred for r in ranks_a])
    stack_b = np.stack([r.centred for r in ranks_b])
    norms = np.outer([r.norm for r in ranks_a], [r.norm for r in ranks_b])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norms > 0, (stack_a @ stack_b.T) / norms, np.nan)


def _check_layers(name: str, layers: Sequence[np.ndarray], k: int) -> tuple[int, int]:
    if not layers:
        raise InputError(f"model {name} has no layers")
    shapes = {np.asarray(x).shape for x in layers}
    if len(shapes) != 1:
        raise InputError(f"every layer of model {name} must have the same shape; got {sorted(shapes)}")
    n, d = shapes.pop()
    _check_k(k, d)
    return n, d


def observed_grid(
    layers_a: Sequence[np.ndarray],
    layers_b: Sequence[np.ndarray],
    basis_a: np.ndarray,
    basis_b: np.ndarray,
    k: int,
    device: str = "cpu",
) -> dict[str, np.ndarray]:
    """``rho_full`` and ``rho_readout`` (``L_a x L_b``) from prepared (corrected) layers.

    ``basis_a`` (``d_a x >=k``) and ``basis_b`` are the readout bases; their first ``k`` columns are used.
    """
    n_a, d_a = _check_layers("A", layers_a, k)
    n_b, d_b = _check_layers("B", layers_b, k)
    if n_a != n_b:
        raise InputError(f"both models must hold the same N inputs; got N={n_a} and N={n_b}")
    for name, basis, d in (("A", basis_a, d_a), ("B", basis_b, d_b)):
        basis = _check_matrix(f"basis_{name}", basis)
        if basis.shape[0] != d or basis.shape[1] < k:
            raise InputError(f"readout basis of model {name} is {basis.shape}; need {d} rows and at least k={k} columns")
    rankers_a = _Rankers(layers_a, device)
    rankers_b = _Rankers(layers_b, device, rankers_a.scratch)
    full = _grid(rankers_a.ranks(), rankers_b.ranks())
    readout = _grid(rankers_a.ranks(basis_a[:, :k]), rankers_b.ranks(basis_b[:, :k]))
    return {"rho_full": full, "rho_readout": readout}


def null_grids(
    layers_a: Sequence[np.ndarray], layers_b: Sequence[np.ndarray], k: int, seed: int, indices: Iterable[int], device: str = "cpu"
) -> np.ndarray:
    """Null rho grids (``len(indices) x L_a x L_b``); draw ``i`` depends only on (seed, i)."""
    n_a, d_a = _check_layers("A", layers_a, k)
    n_b, d_b = _check_layers("B", layers_b, k)
    if n_a != n_b:
        raise InputError(f"both models must hold the same N inputs; got N={n_a} and N={n_b}")
    _check_seed(seed)
    rankers_a = _Rankers(layers_a, device)
    rankers_b = _Rankers(layers_b, device, rankers_a.scratch)
    grids = []
    for index in indices:
        q_a, q_b = null_subspaces(d_a, d_b, k, seed, index)
        grids.append(_grid(rankers_a.ranks(q_a), rankers_b.ranks(q_b)))
    return np.stack(grids) if grids else np.empty((0, len(layers_a), len(layers_b)))


def grid_uncertainty(rho_readout: np.ndarray, nulls: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """Per cell, z's Monte-Carlo error and the empirical p-values, as :func:`raygeom.numerics.uncertainty.z_uncertainty`
    gives them for one PGA unit (``nulls``: draws x layers A x layers B). Cells whose nulls have no spread get NaN."""
    from raygeom.numerics.uncertainty import z_uncertainty

    names = ("z_se", "z_lo", "z_hi", "z_half_width", "p_upper", "p_lower")
    out = {name: np.full(rho_readout.shape, np.nan) for name in names}
    for index in np.ndindex(*rho_readout.shape):
        cell = nulls[(slice(None),) + index]
        if not np.isfinite(rho_readout[index]) or np.ptp(cell) == 0:
            continue
        values = z_uncertainty(float(rho_readout[index]), cell, seed)
        for name in names:
            out[name][index] = values[name]
    return out


def grid_text_spread(
    raw_a: Sequence[np.ndarray],
    raw_b: Sequence[np.ndarray],
    basis_a: np.ndarray,
    basis_b: np.ndarray,
    k: int,
    r: int,
    seed: int = 0,
    n_half: int = 10,
    n_null: int = 10,
    device: str = "cpu",
) -> dict[str, np.ndarray]:
    """Standard errors over texts, per cell, of ``rho_full``, ``rho_readout``, the readout's excess over full
    space ``rho_readout - rho_full`` and the margin ``rho_readout - mean(null rhos)``: the delete-half
    jackknife of :func:`raygeom.numerics.pga_texts.half_sample_spread`, on the same seeded subsets for
    every layer of both models (row ``i`` of ``raw_a`` and ``raw_b`` is the same text). Each subset is
    corrected afresh (CCR-r); every subset uses null draws ``0..n_null-1``."""
    from raygeom.numerics.pga_texts import _check_subsampling
    from raygeom.numerics.uncertainty import jackknife_se, text_subsamples

    n = raw_a[0].shape[0]
    size = n // 2
    for h in list(raw_a) + list(raw_b):
        _check_subsampling(np.asarray(h), r, n_half, size, n_null)
    scores: dict[str, list[np.ndarray]] = {"rho_full": [], "rho_readout": [], "excess": [], "margin": []}
    for rows in text_subsamples(n, size, seed, n_half):
        layers_a = [prepare_layer(np.asarray(h)[rows], r) for h in raw_a]
        layers_b = [prepare_layer(np.asarray(h)[rows], r) for h in raw_b]
        observed = observed_grid(layers_a, layers_b, basis_a, basis_b, k, device)
        nulls = null_grids(layers_a, layers_b, k, seed, range(n_null), device)
        scores["rho_full"].append(observed["rho_full"])
        scores["rho_readout"].append(observed["rho_readout"])
        scores["excess"].append(observed["rho_readout"] - observed["rho_full"])
        scores["margin"].append(observed["rho_readout"] - nulls.mean(axis=0))
    out = {}
    for name, values in scores.items():
        stacked = np.stack(values)
        out[f"{name}_texts_se"] = np.apply_along_axis(lambda v: jackknife_se(v, n, size), 0, stacked)
    return out


def summarize_grid(rho_full: np.ndarray, rho_readout: np.ndarray, nulls: np.ndarray) -> dict[str, np.ndarray]:
    """Null mean, std (ddof=1) and ``z = (rho_readout - null_mean) / null_std`` per cell."""
    if nulls.shape[0] < 2:
        raise InputError("need at least 2 null draws to estimate a standard deviation")
    mean = nulls.mean(axis=0)
    std = nulls.std(axis=0, ddof=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(std > 0, (rho_readout - mean) / std, np.nan)
    return {"rho_full": rho_full, "rho_readout": rho_readout, "null_mean": mean, "null_std": std, "z": z}
