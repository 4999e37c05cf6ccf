"""Representation dispersion, exactly as ../METRICS.md ("Dispersion") defines it.

Dispersion is the mean cosine distance over all pairs i<j of RAW (not
centred) vectors. It is never computed from the N x N Gram matrix: for
vectors u_i with S = sum_i u_i,

    sum_{i != j} u_i . u_j = ||S||^2 - sum_i ||u_i||^2,

so for unit rows mean_{i<j} cos = (||S||^2 - N) / (N (N - 1)), an O(N d)
computation that streams over row blocks. Sums are accumulated in float64:
when the vectors are collapsed ||S||^2 ~ N^2 and the result is a small
difference of large numbers. Using sum_i ||u_i||^2 instead of N keeps the
identity exact for zero rows, which (as in pga.py and the authors' code) have
no direction and so cosine 0, distance 1, to everything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

import numpy as np
import torch
import torch.nn.functional as F

from raygeom.errors import InputError
from raygeom.numerics.distributions import pearson, pearson_rows, rank_rows, spearman
from raygeom.numerics.tensors import shared_tensor
from raygeom.numerics.uncertainty import _percentile_interval, bounded_normal_interval

# Rows x dims converted to float64 at once; bounds the temporary copy.
BLOCK_ELEMENTS = 1 << 24
POOLINGS = ("tokens", "last", "mean")


def _as_tensor(name: str, x) -> torch.Tensor:
    t = x if isinstance(x, torch.Tensor) else shared_tensor(x)
    if t.dtype == torch.bool or t.is_complex():
        raise InputError(f"{name} must hold real numbers, got {t.dtype}")
    return t if t.is_floating_point() else t.double()


def _check_finite(name: str, t: torch.Tensor) -> None:
    if not bool(torch.isfinite(t).all()):
        raise InputError(f"{name} contains NaN or inf values")


def _as_mask(name: str, mask, shape: tuple[int, ...], device) -> torch.Tensor:
    m = mask if isinstance(mask, torch.Tensor) else torch.from_numpy(np.asarray(mask))
    if tuple(m.shape) != tuple(shape):
        raise InputError(f"{name} must have shape {tuple(shape)}, got {tuple(m.shape)}")
    return m.to(device) != 0


def _unit(x: torch.Tensor) -> torch.Tensor:
    norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x / torch.where(norms > 0, norms, torch.ones_like(norms))


def _off_diagonal_cos_sum(h: torch.Tensor, block_rows: int | None) -> float:
    """sum_{i != j} cos(h_i, h_j) for the rows of a 2-D tensor, streamed in float64 row blocks."""
    n, d = h.shape
    step = block_rows or max(1, BLOCK_ELEMENTS // max(d, 1))
    total = torch.zeros(d, dtype=torch.float64, device=h.device)
    diagonal = torch.zeros((), dtype=torch.float64, device=h.device)
    for start in range(0, n, step):
        block = h[start : start + step].double()
        _check_finite("H", block)
        unit = _unit(block)
        total += unit.sum(dim=0)
        diagonal += (unit * unit).sum()
    return float(torch.dot(total, total) - diagonal)


def dispersion(h, *, block_rows: int | None = None) -> float:
    """Mean pairwise cosine distance ``1 - mean_{i<j} cos(h_i, h_j)`` of the rows of ``h`` (N x d).

    ``h`` is a numpy array or a torch tensor (any float dtype, any device); the
    result is a float64-accurate Python float. Never builds the pairs, see the
    module docstring. ``block_rows`` only changes how many rows are converted
    to float64 at a time.
    """
    t = _as_tensor("H", h)
    if t.ndim != 2:
        raise InputError(f"H must be a 2-D array (N x d), got shape {tuple(t.shape)}")
    n = t.shape[0]
    if n < 2:
        raise InputError(f"dispersion needs at least 2 vectors, got N={n}")
    return 1.0 - _off_diagonal_cos_sum(t, block_rows) / (n * (n - 1))


def _masked_dispersion(unit: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Dispersion of ``unit`` (..., T, d) over the positions where ``keep`` (..., T) is True; NaN below 2."""
    unit = torch.where(keep.unsqueeze(-1), unit, torch.zeros((), dtype=unit.dtype, device=unit.device))
    count = keep.sum(dim=-1).to(unit.dtype)
    total = unit.sum(dim=-2)
    off_diagonal = (total * total).sum(dim=-1) - (unit * unit).sum(dim=(-2, -1))
    pairs = count * (count - 1)
    safe = torch.where(pairs > 0, pairs, torch.ones_like(pairs))
    return torch.where(pairs > 0, 1.0 - off_diagonal / safe, torch.full_like(pairs, float("nan")))


def token_dispersion(chunks, attention_mask=None) -> np.ndarray:
    """Token-level dispersion per chunk, as the authors' released code computes it.

    For each chunk of T token vectors, ``D_chunk = 1 - mean_{i<j} cos(t_i, t_j)``
    over its (unmasked) tokens. ``chunks`` is a (B, T, d) array/tensor, with an
    optional (B, T) ``attention_mask`` whose zeros (padding) are excluded, or a
    sequence of (T_b, d) arrays of varying length. Returns a float64 array of B
    values; a chunk with fewer than 2 tokens gets NaN (the authors skip it).
    """
    if isinstance(chunks, (list, tuple)):
        if attention_mask is not None:
            raise InputError("attention_mask is only accepted with a (B, T, d) input")
        return np.array([_single_chunk(i, c) for i, c in enumerate(chunks)], dtype=np.float64)
    t = _as_tensor("chunks", chunks)
    if t.ndim != 3:
        raise InputError(f"chunks must be (B, T, d) or a list of (T, d) arrays, got shape {tuple(t.shape)}")
    b, length, d = t.shape
    mask = (
        torch.ones((b, length), dtype=torch.bool, device=t.device)
        if attention_mask is None
        else _as_mask("attention_mask", attention_mask, (b, length), t.device)
    )
    step = max(1, BLOCK_ELEMENTS // max(length * d, 1))
    out = []
    for start in range(0, b, step):
        block, keep = t[start : start + step].double(), mask[start : start + step]
        # Padding may hold anything; only the kept positions must be finite.
        _check_finite("chunks", block[keep])
        out.append(_masked_dispersion(_unit(block), keep))
    return torch.cat(out).cpu().numpy() if out else np.zeros(0, dtype=np.float64)


def _single_chunk(i: int, chunk) -> float:
    t = _as_tensor(f"chunks[{i}]", chunk)
    if t.ndim != 2:
        raise InputError(f"chunks[{i}] must be 2-D (T x d), got shape {tuple(t.shape)}")
    return float("nan") if t.shape[0] < 2 else dispersion(t)


@dataclass(frozen=True)
class DispersionGap:
    gap: float
    domain_dispersion: float
    generic_dispersion: float
    n_domain: int
    n_generic: int

    def to_dict(self) -> dict:
        return asdict(self)


def dispersion_gap(token_vectors, next_token_ids, domain_token_ids: Iterable[int], mask=None) -> DispersionGap:
    """Dispersion gap ``G = D(domain positions) - D(generic positions)``.

    ``token_vectors`` is (..., d) and ``next_token_ids`` has its leading shape
    (e.g. (B, T, d) and (B, T)): position p is a domain position when the token
    that follows it is in ``domain_token_ids``. Positions where ``mask`` is 0
    (padding, last position) or whose next-token id is negative (the -100
    ignore index of HF labels) belong to neither side.
    """
    vectors = _as_tensor("token_vectors", token_vectors)
    if vectors.ndim < 2:
        raise InputError(f"token_vectors must be (..., d), got shape {tuple(vectors.shape)}")
    lead = tuple(vectors.shape[:-1])
    ids = next_token_ids if isinstance(next_token_ids, torch.Tensor) else torch.from_numpy(np.asarray(next_token_ids))
    if tuple(ids.shape) != lead or ids.is_floating_point():
        raise InputError(f"next_token_ids must be integers of shape {lead}, got {ids.dtype} {tuple(ids.shape)}")
    ids = ids.to(vectors.device).long()
    domain = torch.as_tensor(np.fromiter((int(v) for v in domain_token_ids), dtype=np.int64), device=vectors.device)
    if domain.numel() == 0:
        raise InputError("domain_token_ids is empty")
    valid = ids >= 0
    if mask is not None:
        valid &= _as_mask("mask", mask, lead, vectors.device)
    is_domain = torch.isin(ids, domain)
    flat = vectors.reshape(-1, vectors.shape[-1])
    sides = {}
    for name, keep in (("domain", valid & is_domain), ("generic", valid & ~is_domain)):
        rows = flat[keep.reshape(-1)]
        if rows.shape[0] < 2:
            raise InputError(f"dispersion gap needs at least 2 {name} positions, got {rows.shape[0]}")
        sides[name] = (dispersion(rows), rows.shape[0])
    (d_dom, n_dom), (d_gen, n_gen) = sides["domain"], sides["generic"]
    return DispersionGap(d_dom - d_gen, d_dom, d_gen, n_dom, n_gen)


@dataclass(frozen=True)
class PerplexityGroups:
    """Selected groups, in increasing mean perplexity; ``members`` are chunk indices."""

    mean_perplexity: np.ndarray
    mean_dispersion: np.ndarray
    members: list[np.ndarray]
    n_full_groups: int
    spearman: float
    pearson: float


def _vector(name: str, x) -> np.ndarray:
    a = np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    if a.ndim != 1:
        raise InputError(f"{name} must be 1-D, got shape {a.shape}")
    return a


def perplexity_groups(perplexity, dispersion, group_size: int = 100, n_groups: int = 100) -> PerplexityGroups:
    """The authors' dispersion-vs-perplexity protocol over per-chunk values.

    Chunks are stably sorted by perplexity and cut into consecutive groups of
    ``group_size`` (an incomplete last group is dropped). If there are more
    than ``n_groups`` groups, for each of ``n_groups`` targets evenly spaced
    between the lowest and highest group mean perplexity the group whose mean
    is nearest is kept (the lower one only if strictly nearer); targets that
    pick the same group keep it once, so fewer than ``n_groups`` may remain.
    Per group: mean perplexity, and mean dispersion over its chunks ignoring
    NaN (chunks too short to measure). Spearman and Pearson are between the
    two, across the selected groups.
    """
    ppl, disp = _vector("perplexity", perplexity), _vector("dispersion", dispersion)
    if ppl.shape != disp.shape:
        raise InputError(f"perplexity and dispersion differ in length: {ppl.shape[0]} vs {disp.shape[0]}")
    if not np.isfinite(ppl).all():
        raise InputError("perplexity contains NaN or inf values")
    if group_size < 1 or n_groups < 3:
        raise InputError(f"need group_size >= 1 and n_groups >= 3; got {group_size}, {n_groups}")
    n_full = len(ppl) // group_size
    if n_full < 3:
        raise InputError(f"need at least 3 full groups of {group_size} chunks, got {len(ppl)} chunks")
    order = np.argsort(ppl, kind="stable")[: n_full * group_size].reshape(n_full, group_size)
    means = ppl[order].mean(axis=1)
    chosen = np.arange(n_full) if n_full <= n_groups else _nearest_groups(means, n_groups)
    members = [order[g] for g in chosen]
    with np.errstate(invalid="ignore"):
        group_disp = np.array([np.nanmean(disp[m]) if np.isfinite(disp[m]).any() else np.nan for m in members])
    keep = np.isfinite(group_disp)
    if keep.sum() < 3:
        raise InputError("fewer than 3 selected groups have a finite mean dispersion")
    x, y = means[chosen][keep], group_disp[keep]
    return PerplexityGroups(
        mean_perplexity=means[chosen],
        mean_dispersion=group_disp,
        members=members,
        n_full_groups=n_full,
        spearman=spearman(x, y),
        pearson=pearson(x, y),
    )


def _nearest_groups(sorted_means: np.ndarray, count: int) -> np.ndarray:
    targets = np.linspace(sorted_means[0], sorted_means[-1], count)
    right = np.minimum(np.searchsorted(sorted_means, targets, side="left"), len(sorted_means) - 1)
    left = np.maximum(right - 1, 0)
    lower_nearer = (right > 0) & (np.abs(sorted_means[left] - targets) < np.abs(sorted_means[right] - targets))
    return np.unique(np.where(lower_nearer, left, right))


def rank_agreement(slice_dispersion, slice_perplexity) -> float:
    """How well dispersion ranks slices by difficulty, as perplexity does.

    Returns Spearman(-dispersion, perplexity): +1 when the lowest-dispersion
    slice is the highest-perplexity one and so on down, i.e. the paper's
    negative relation holds perfectly; -1 when the order is exactly reversed.
    """
    disp, ppl = _vector("slice_dispersion", slice_dispersion), _vector("slice_perplexity", slice_perplexity)
    if disp.shape != ppl.shape:
        raise InputError(f"slice_dispersion and slice_perplexity differ in length: {disp.shape[0]} vs {ppl.shape[0]}")
    if disp.shape[0] < 3 or not (np.isfinite(disp).all() and np.isfinite(ppl).all()):
        raise InputError("rank agreement needs at least 3 slices with finite values")
    return spearman(-disp, ppl)


def kmeans_slices(h, n_slices: int, seed: int = 0, *, normalize: bool = True, n_init: int = 10) -> np.ndarray:
    """Slice labels (N,) from scikit-learn KMeans, for data without a slice column.

    With ``normalize`` the rows are L2-normalised first, so slices follow the
    cosine geometry that dispersion measures rather than vector norms.
    """
    from sklearn.cluster import KMeans

    t = _as_tensor("H", h)
    if t.ndim != 2:
        raise InputError(f"H must be a 2-D array (N x d), got shape {tuple(t.shape)}")
    _check_finite("H", t)
    if not 1 <= n_slices <= t.shape[0]:
        raise InputError(f"n_slices must be in [1, N={t.shape[0]}], got {n_slices}")
    x = (_unit(t.double()) if normalize else t.double()).cpu().numpy()
    return KMeans(n_clusters=n_slices, random_state=seed, n_init=n_init).fit_predict(x).astype(np.int64)


def dispersion_by_slice(h, labels) -> tuple[np.ndarray, np.ndarray]:
    """(slice labels in increasing order, dispersion of each slice); NaN for a slice of one row."""
    t = _as_tensor("H", h)
    labels = np.asarray(labels.detach().cpu() if isinstance(labels, torch.Tensor) else labels)
    if t.ndim != 2 or labels.shape != (t.shape[0],):
        raise InputError(f"need H (N x d) and N labels; got {tuple(t.shape)} and {labels.shape}")
    slices = np.unique(labels)
    values = [
        dispersion(t[torch.from_numpy(np.flatnonzero(labels == s)).to(t.device)]) if (labels == s).sum() > 1 else np.nan
        for s in slices
    ]
    return slices, np.array(values, dtype=np.float64)


def push_away_loss(hidden: torch.Tensor, attention_mask: torch.Tensor | None = None, over: str = "tokens") -> torch.Tensor:
    """Differentiable ``D_batch`` for the push-away objective ``L = L_LM - lambda * D_batch``.

    Returns D_batch itself (a scalar tensor carrying gradients); the caller
    subtracts ``lambda * D_batch`` from its LM loss. ``hidden`` is either (N, d),
    one vector per example, or (B, T, d) with an optional (B, T) mask, pooled
    according to ``over``:

    - ``"tokens"``: every unmasked token vector of the batch is one vector
      (pairs within and across sequences);
    - ``"last"``: one vector per sequence, its last unmasked position (works for
      left and right padding);
    - ``"mean"``: one vector per sequence, the mean of its unmasked tokens.

    Computed with the O(N d) identity of the module docstring, in the input
    dtype promoted to at least float32.
    """
    if not isinstance(hidden, torch.Tensor):
        raise InputError("push_away_loss needs a torch tensor")
    if over not in POOLINGS:
        raise InputError(f"over must be one of {POOLINGS}, got {over!r}")
    x = hidden if hidden.dtype in (torch.float32, torch.float64) else hidden.float()
    if x.ndim == 2:
        if attention_mask is not None:
            raise InputError("attention_mask needs a (B, T, d) input")
        vectors = x
    elif x.ndim == 3:
        b, length, _ = x.shape
        mask = (
            torch.ones((b, length), dtype=torch.bool, device=x.device)
            if attention_mask is None
            else _as_mask("attention_mask", attention_mask, (b, length), x.device)
        )
        if over != "tokens" and not bool(mask.any(dim=1).all()):
            raise InputError(f"over={over!r} needs at least one unmasked position in every sequence")
        if over == "tokens":
            vectors = x.reshape(b * length, -1)[mask.reshape(-1)]
        elif over == "last":
            position = torch.arange(length, device=x.device).expand(b, length)
            last = torch.where(mask, position, -1).max(dim=1).values
            vectors = x[torch.arange(b, device=x.device), last]
        else:
            kept = torch.where(mask.unsqueeze(-1), x, torch.zeros((), dtype=x.dtype, device=x.device))
            vectors = kept.sum(dim=1) / mask.sum(dim=1, keepdim=True).to(x.dtype)
    else:
        raise InputError(f"hidden must be (N, d) or (B, T, d), got shape {tuple(x.shape)}")
    if vectors.shape[0] < 2:
        raise InputError(f"D_batch needs at least 2 vectors, got {vectors.shape[0]}")
    # F.normalize clamps the norm instead of branching, so a zero vector gets a finite gradient, not NaN.
    keep = torch.ones(vectors.shape[0], dtype=torch.bool, device=x.device)
    return _masked_dispersion(F.normalize(vectors, dim=-1, eps=1e-12), keep)


# ---------------------------------------------------------------- uncertainty of the dispersion numbers

MIN_GAP_POSITIONS = 200  # domain positions below which G is flagged: its chunk bootstrap half-width is then typically > 0.05
GAP_STREAM, SLICE_STREAM = 0x6A9, 0x511CE  # second seed words: each bootstrap has its own random stream


def side_dispersions(sums, diagonal, counts, weights=None) -> np.ndarray:
    """(B, 2) dispersion of the domain and generic positions of a multiset of chunks, from per-chunk parts.

    ``sums`` (n, 2, d): per chunk and side (0 domain, 1 generic) the sum of the unit position vectors;
    ``diagonal`` (n, 2): the sum of their squared norms; ``counts`` (n, 2): how many positions.
    ``weights`` (B, n): how often each chunk is taken (default: each once, B = 1). A chunk taken twice
    contributes its positions twice, so each value is exactly the dispersion of that multiset of
    positions (by the identity in the module docstring). NaN where a side has fewer than 2 positions.
    """
    sums = np.asarray(sums, dtype=np.float64)
    diagonal, counts = np.asarray(diagonal, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    if sums.ndim != 3 or sums.shape[1] != 2 or diagonal.shape != sums.shape[:2] or counts.shape != sums.shape[:2]:
        raise InputError(f"need sums (n, 2, d), diagonal and counts (n, 2); got {sums.shape}, {diagonal.shape}, {counts.shape}")
    w = np.ones((1, sums.shape[0])) if weights is None else np.asarray(weights, dtype=np.float64)
    total = np.einsum("bn,nsd->bsd", w, sums)
    n = w @ counts
    off = (total * total).sum(axis=-1) - w @ diagonal
    pairs = n * (n - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(pairs > 0, 1.0 - off / np.where(pairs > 0, pairs, 1.0), np.nan)


def gap_of_parts(sums, diagonal, counts, weights=None) -> np.ndarray:
    """(B,) G = D(domain) - D(generic) of each multiset of chunks (see :func:`side_dispersions`)."""
    sides = side_dispersions(sums, diagonal, counts, weights)
    return sides[:, 0] - sides[:, 1]


def gap_interval(sums, diagonal, counts, seed: int = 0, n_boot: int = 1000, level: float = 0.95) -> dict[str, float]:
    """G with its bootstrap over chunks (positions of one chunk are not independent, chunks are):
    standard error and ``level`` percentile interval, each side's dispersion and the positions behind it."""
    sums = np.asarray(sums, dtype=np.float64)
    n = sums.shape[0]
    if n < 2:
        raise InputError(f"a bootstrap over chunks needs at least 2 chunks, got {n}")

    counts = np.asarray(counts)
    domain, generic = side_dispersions(sums, diagonal, counts)[0]
    rng = np.random.default_rng([int(seed), GAP_STREAM])
    boot = _percentile_interval(gap_of_parts(sums, diagonal, counts, rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot)), level)
    return {
        "gap": float(domain - generic),
        "domain_dispersion": float(domain),
        "generic_dispersion": float(generic),
        "gap_se": boot["se"],
        "gap_lo": boot["lo"],
        "gap_hi": boot["hi"],
        "n_domain": int(counts[:, 0].sum()),
        "n_generic": int(counts[:, 1].sum()),
    }


def gap_warning(n_domain: int, minimum: int = MIN_GAP_POSITIONS) -> str:
    """A line for a G that rests on too few domain positions ('' when enough)."""
    if n_domain >= minimum:
        return ""
    return f"G rests on {n_domain} domain positions (< {minimum}): use more chunks or another token set"


def _rank_rows(a: np.ndarray) -> np.ndarray:
    return rank_rows(a)


def slice_agreement_interval(
    labels, perplexity, token_dispersion, pooled, seed: int = 0, n_boot: int = 1000, level: float = 0.95
) -> dict[str, float]:
    """Bootstrap intervals of the slice rank agreements (token and sample level) over chunks.

    Chunks are resampled within their slice (the slicing is held fixed), and per draw each slice's
    perplexity (geometric mean), token dispersion (mean over chunks) and sample dispersion are
    recomputed. The sample dispersion of a draw is the weighted mean cosine distance over pairs of
    distinct chunks, sum_{i != j} w_i w_j (1 - cos_ij) / sum_{i != j} w_i w_j: a chunk drawn twice is
    never paired with itself, which would add zero distances. Returns ``token_lo/hi`` and ``sample_lo/hi``.
    """
    labels = np.asarray(labels)
    log_ppl = np.log(_vector("perplexity", perplexity))
    token = _vector("token_dispersion", token_dispersion)
    pooled = np.asarray(pooled, dtype=np.float64)
    names = np.unique(labels)
    if len(names) < 3 or pooled.shape[0] != labels.shape[0]:
        raise InputError("slice agreement intervals need at least 3 slices and one pooled vector per chunk")
    rng = np.random.default_rng([int(seed), SLICE_STREAM])
    slice_ppl, slice_token, slice_sample = [], [], []
    for name in names:
        members = np.flatnonzero(labels == name)
        m = members.size
        w = rng.multinomial(m, np.full(m, 1.0 / m), size=n_boot).astype(np.float64)
        total = w.sum(axis=1)
        slice_ppl.append(w @ log_ppl[members] / total)
        finite = np.isfinite(token[members])
        wt = w[:, finite]
        with np.errstate(invalid="ignore", divide="ignore"):
            slice_token.append(wt @ token[members][finite] / wt.sum(axis=1))
        norms = np.linalg.norm(pooled[members], axis=1, keepdims=True)
        unit = pooled[members] / np.where(norms > 0, norms, 1.0)
        cos = unit @ unit.T
        off = np.einsum("bi,ij,bj->b", w, cos, w) - (w * w) @ np.diag(cos)
        pairs = total * total - (w * w).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            slice_sample.append(np.where(pairs > 0, 1.0 - off / np.where(pairs > 0, pairs, 1.0), np.nan))
    ppl_ranks = _rank_rows(np.stack(slice_ppl, axis=1))
    out = {}
    for kind, values in (("token", slice_token), ("sample", slice_sample)):
        values = np.stack(values, axis=1)
        ok = np.isfinite(values).all(axis=1)
        boot = _percentile_interval(pearson_rows(_rank_rows(-values[ok]), ppl_ranks[ok]), level)
        if not boot["lo"] < boot["hi"]:  # every draw ranks the slices alike: a zero-width interval would claim certainty
            boot["lo"] = boot["hi"] = float("nan")
        out[f"{kind}_lo"], out[f"{kind}_hi"] = boot["lo"], boot["hi"]
    return out


def bits_per_byte(nll_nats, n_predicted, n_bytes) -> float:
    """Tokenizer-free loss: summed next-token NLL in bits over the UTF-8 bytes of the predicted text.

    ``nll_nats`` is each chunk's mean NLL (nats per predicted token), ``n_predicted`` its predicted
    tokens, ``n_bytes`` the bytes of those tokens' text: sum(nll * n_predicted) / ln 2 / sum(n_bytes)."""
    nll, tokens, size = (np.asarray(a, dtype=np.float64) for a in (nll_nats, n_predicted, n_bytes))
    total = float(size.sum())
    if total <= 0:
        raise InputError("bits per byte needs predicted text of at least one byte")
    return float((nll * tokens).sum() / np.log(2.0) / total)


def sample_dispersion_interval(h, level: float = 0.95) -> dict[str, float]:
    """Sample-level dispersion ``D`` of the rows of ``h`` (N x d, raw, not centred) with its delete-one jackknife
    interval over the samples: standard error ``sqrt((N-1)/N sum_i (D_(-i) - mean D_(-))^2)``, the interval on the
    logit scale of D / 2 (uncertainty.bounded_normal_interval), so it stays inside [0, 2].

    D is a U-statistic of the pairs, and every leave-one-out value comes from the row sums of the distance
    matrix, ``r_i = sum_{j != i} (1 - cos_ij) = N - u_i . s`` with ``s = sum_j u_j``, so no pair is formed:
    ``D_(-i) = (S - 2 r_i) / ((N-1)(N-2))`` with ``S = sum_i r_i``. Zero rows have cosine 0 to everything.
    """
    x = np.asarray(h.detach().cpu().double().numpy() if isinstance(h, torch.Tensor) else h, dtype=np.float64)
    if x.ndim != 2:
        raise InputError(f"H must be a 2-D array (N x d), got shape {x.shape}")
    n = x.shape[0]
    if n < 3:
        raise InputError(f"dispersion with an interval needs at least 3 vectors, got N={n}")
    if not np.isfinite(x).all():
        raise InputError("H contains NaN or inf values")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    unit = x / np.where(norms > 0, norms, 1.0)
    s = unit.sum(axis=0)
    self_cos = (unit * unit).sum(axis=1)  # 1, or 0 for a zero row
    row = (n - 1) - (unit @ s - self_cos)
    total = float(row.sum())
    value = total / (n * (n - 1))
    leave_out = (total - 2 * row) / ((n - 1) * (n - 2))
    se = float(np.sqrt((n - 1) / n * np.sum((leave_out - leave_out.mean()) ** 2)))
    low, high = bounded_normal_interval(value, se, 0.0, 2.0, level)  # a mean cosine distance lies in [0, 2]
    return {"dispersion": value, "dispersion_se": se, "dispersion_lo": low, "dispersion_hi": high}
