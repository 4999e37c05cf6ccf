"""kNN-LM (Khandelwal et al., 2020, "Generalization through Memorization").

A datastore holds (key, value) pairs: a context representation and the token
that followed it. For a query representation q, with N(q) its k nearest keys,

    p_knn(y | q) = sum_{i in N(q), v_i = y} exp(-d(k_i, q) / T) / sum_{i in N(q)} exp(-d(k_i, q) / T),

where d is the SQUARED L2 distance, as in the paper (its faiss IndexFlatL2
returns squared distances) and T a temperature (1 in the paper). The model
interpolates p = lam * p_knn + (1 - lam) * p_lm.

Search goes through any object with ``search(queries, k) -> (squared
distances (Q, k) ascending, ids (Q, k))`` and ``__len__``; ``ExactIndex`` is
the brute-force one (no ANN library here), and an ANN index wrapped to that
interface can replace it.
"""

from __future__ import annotations

import numpy as np
import torch

from raygeom.errors import InputError
from raygeom.numerics.tensors import shared_tensor

DEFAULT_KEY_CHUNK = 1 << 16


def _tensor(name: str, x, ndim: int) -> torch.Tensor:
    t = x if isinstance(x, torch.Tensor) else shared_tensor(x)
    if t.ndim != ndim:
        raise InputError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    return t


def _float_matrix(name: str, x, dtype: torch.dtype | None, device) -> torch.Tensor:
    t = _tensor(name, x, 2)
    if not t.is_floating_point():
        raise InputError(f"{name} must hold floating-point values, got {t.dtype}")
    if dtype is None:
        dtype = torch.float64 if t.dtype == torch.float64 else torch.float32
    t = t.to(device=device, dtype=dtype)
    if not bool(torch.isfinite(t).all()):
        raise InputError(f"{name} contains NaN or inf values")
    return t


def _token_ids(name: str, x, length: int, vocab_size: int, device) -> torch.Tensor:
    t = _tensor(name, x, 1)
    if t.is_floating_point() or t.dtype == torch.bool or t.shape[0] != length:
        raise InputError(f"{name} must be {length} integer token ids, got {t.dtype} of shape {tuple(t.shape)}")
    t = t.to(device=device, dtype=torch.int64)
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= vocab_size):
        raise InputError(f"{name} must lie in [0, vocab_size={vocab_size})")
    return t


class ExactIndex:
    """Exact k-nearest-neighbour search by squared L2 distance, with torch matmuls in chunks.

    ``||q - k||^2 = ||q||^2 + ||k||^2 - 2 q.k``, clamped at 0, over blocks of
    ``query_chunk`` queries x ``key_chunk`` keys; a running top-k merges the key
    blocks, so memory is bounded by one block whatever the datastore size.
    Keys are kept in float64 if given so, else float32.
    """

    def __init__(
        self, keys, *, device=None, dtype: torch.dtype | None = None, query_chunk: int = 1024, key_chunk: int = DEFAULT_KEY_CHUNK
    ):
        if query_chunk < 1 or key_chunk < 1:
            raise InputError("query_chunk and key_chunk must be positive")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.keys = _float_matrix("keys", keys, dtype, self.device)
        self.key_sq_norms = (self.keys * self.keys).sum(dim=1)
        self.query_chunk, self.key_chunk = query_chunk, key_chunk

    def __len__(self) -> int:
        return self.keys.shape[0]

    @property
    def dim(self) -> int:
        return self.keys.shape[1]

    def search(self, queries, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(squared distances (Q, k), key ids (Q, k)), nearest first, on the index's device."""
        q = _float_matrix("queries", queries, self.keys.dtype, self.device)
        if q.shape[1] != self.dim:
            raise InputError(f"queries have d={q.shape[1]} but the keys have d={self.dim}")
        if not 1 <= k <= len(self):
            raise InputError(f"k must be in [1, number of keys={len(self)}], got {k}")
        parts = [self._search_block(q[s : s + self.query_chunk], k) for s in range(0, q.shape[0], self.query_chunk)]
        if not parts:
            empty = torch.zeros((0, k), device=self.device)
            return empty.to(self.keys.dtype), empty.long()
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def _search_block(self, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        q_sq = (q * q).sum(dim=1, keepdim=True)
        best_d = torch.full((q.shape[0], 0), float("inf"), dtype=q.dtype, device=self.device)
        best_i = torch.zeros((q.shape[0], 0), dtype=torch.int64, device=self.device)
        for start in range(0, len(self), self.key_chunk):
            block = self.keys[start : start + self.key_chunk]
            dist = (q_sq + self.key_sq_norms[start : start + self.key_chunk] - 2.0 * (q @ block.T)).clamp_min_(0.0)
            ids = torch.arange(start, start + block.shape[0], device=self.device).expand(q.shape[0], -1)
            cand_d, cand_i = torch.cat([best_d, dist], dim=1), torch.cat([best_i, ids], dim=1)
            top = torch.topk(cand_d, min(k, cand_d.shape[1]), dim=1, largest=False, sorted=True)
            best_d, best_i = top.values, torch.gather(cand_i, 1, top.indices)
        return best_d, best_i


def knn_log_probs(
    queries, keys, values, vocab_size: int, k: int = 1024, temperature: float = 1.0, chunk_size: int = 1024, targets=None
) -> np.ndarray:
    """log p_knn (float64) for each query.

    ``keys`` is the datastore's (n_keys, d) key matrix, or an index (anything
    with ``search`` and ``__len__``, e.g. :class:`ExactIndex`) built on it;
    ``values`` (n_keys,) are the next-token ids. With ``targets`` (Q,) returns
    log p_knn(target) per query, (Q,), -inf where no neighbour has the target,
    without ever building a (Q, vocab) array; without, the full (Q, vocab)
    log-distribution. Queries are processed ``chunk_size`` at a time.
    """
    if temperature <= 0 or not np.isfinite(temperature):
        raise InputError(f"temperature must be positive and finite, got {temperature}")
    if vocab_size < 1 or chunk_size < 1:
        raise InputError("vocab_size and chunk_size must be positive")
    index = keys if hasattr(keys, "search") else ExactIndex(keys, query_chunk=chunk_size)
    device = getattr(index, "device", None) or torch.device("cpu")
    vals = _token_ids("values", values, len(index), vocab_size, device)
    queries = _tensor("queries", queries, 2)
    n_queries = queries.shape[0]
    tgt = None if targets is None else _token_ids("targets", targets, n_queries, vocab_size, device)
    out = []
    for start in range(0, n_queries, chunk_size):
        dist, ids = index.search(queries[start : start + chunk_size], k)
        logits = -dist.to(device=device, dtype=torch.float64) / temperature
        neighbour_tokens = vals[ids.to(device)]
        if tgt is None:
            probs = torch.softmax(logits, dim=1)
            full = torch.zeros((logits.shape[0], vocab_size), dtype=torch.float64, device=device)
            out.append(full.scatter_add_(1, neighbour_tokens, probs).log_())
        else:
            hit = neighbour_tokens == tgt[start : start + chunk_size, None]
            own = torch.where(hit, logits, torch.full_like(logits, -torch.inf))
            out.append(torch.logsumexp(own, dim=1) - torch.logsumexp(logits, dim=1))
    if not out:
        return np.zeros((0,) if tgt is not None else (0, vocab_size), dtype=np.float64)
    return torch.cat(out).cpu().numpy()


def _log_probs(name: str, x) -> np.ndarray:
    a = np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise InputError(f"{name} must be a non-empty 1-D array, got shape {a.shape}")
    if np.isnan(a).any() or (a > 0).any():
        raise InputError(f"{name} must be log-probabilities (<= 0, no NaN)")
    return a


def interpolated_log_probs(lm_log_probs_of_targets, knn_log_probs_of_targets, lam: float) -> np.ndarray:
    """Per token ``log(lam p_knn + (1 - lam) p_lm)``, in log space with logaddexp.

    lam=0 returns the LM log-probabilities exactly and lam=1 the kNN ones;
    -inf kNN log-probabilities (target not among the neighbours) are fine for lam < 1.
    """
    lm = _log_probs("lm_log_probs_of_targets", lm_log_probs_of_targets)
    knn = _log_probs("knn_log_probs_of_targets", knn_log_probs_of_targets)
    if lm.shape != knn.shape:
        raise InputError(f"LM and kNN log-probs differ in length: {lm.shape[0]} vs {knn.shape[0]}")
    if not 0.0 <= lam <= 1.0:
        raise InputError(f"lam must be in [0, 1], got {lam}")
    if lam == 0.0:
        return lm
    if lam == 1.0:
        return knn
    return np.logaddexp(np.log(lam) + knn, np.log1p(-lam) + lm)


def interpolated_perplexity(lm_log_probs_of_targets, knn_log_probs_of_targets, lam: float) -> float:
    """``exp(-mean log(lam p_knn + (1 - lam) p_lm))`` (see :func:`interpolated_log_probs`)."""
    return float(np.exp(-interpolated_log_probs(lm_log_probs_of_targets, knn_log_probs_of_targets, lam).mean()))
