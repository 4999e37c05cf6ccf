"""Token-level extraction for the dispersion analyses: pure torch, no Ray, no files.

Text is cut into fixed-length chunks of token ids (512 by default, as in the
authors' code). One forward pass of the base model per batch of chunks gives,
through hooks, every wanted layer (and the last block's attention sub-layer,
named ``attn_last``); the same pass's final hidden states give the per-token
NLL, with logits made a bounded slice of positions at a time and never twice.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from raygeom.errors import RaygeomError
from raygeom.numerics.dispersion import DispersionGap, token_dispersion
from raygeom.replica.extract import LOGIT_CHUNK_ELEMENTS, capture_layers, own_hook, remove_hooks
from raygeom.replica.tokenize import SEPARATOR, make_chunks  # noqa: F401 - chunking lives with the one tokenizer path
from raygeom.sources import model_surgery

ATTENTION_LAYER = "attn_last"


def token_layer_names(model: nn.Module) -> list[str]:
    """Every layer raygeom extracts, then the last block's attention sub-layer output."""
    return [*model_surgery.layer_names(model), ATTENTION_LAYER]


@contextmanager
def capture_token_layers(model: nn.Module, wanted: list[str], reduce):
    """``capture_layers`` plus ``attn_last``; ``reduce(name, hidden)`` gets (B, T, d) tensors."""

    def attention_hook(module, args, output):
        reduce(ATTENTION_LAYER, output[0] if isinstance(output, tuple) else output)

    with ExitStack() as stack:
        stack.enter_context(capture_layers(model, [w for w in wanted if w != ATTENTION_LAYER], reduce))
        if ATTENTION_LAYER in wanted:
            handle = own_hook(model_surgery.last_attention(model), attention_hook, threading.get_ident())
            stack.callback(remove_hooks, [handle])
        yield


def per_token_nll(model: nn.Module, final_hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """(B, T-1) next-token NLL in nats of full (unpadded) chunks, logits a bounded slice at a time."""
    b, length, d = final_hidden.shape
    hidden = final_hidden[:, :-1].reshape(-1, d)
    targets = input_ids[:, 1:].reshape(-1)
    vocab = model.get_output_embeddings().weight.shape[0]
    step = max(1, LOGIT_CHUNK_ELEMENTS // vocab)
    losses = torch.empty(targets.shape[0], dtype=torch.float32, device=final_hidden.device)
    for start in range(0, targets.shape[0], step):
        logits = model_surgery.logits_from_final_hidden(model, hidden[start : start + step]).float()
        losses[start : start + step] = nn.functional.cross_entropy(logits, targets[start : start + step], reduction="none")
    return losses.reshape(b, length - 1)


class GapAccumulator:
    """Streaming dispersion gap over any number of chunks: only sums of unit vectors are kept.

    Uses the identity of ``numerics.dispersion``: for unit rows u_i with S = sum u_i,
    sum_{i != j} cos = ||S||^2 - sum ||u_i||^2; so the result equals
    ``numerics.dispersion.dispersion_gap`` on all positions at once.
    """

    def __init__(self, domain_token_ids):
        ids = sorted({int(i) for i in domain_token_ids})
        if not ids:
            raise RaygeomError("the domain token set is empty")
        self.domain = torch.tensor(ids, dtype=torch.int64)
        self.sums: dict[str, torch.Tensor | None] = {"domain": None, "generic": None}
        self.diagonal = {"domain": 0.0, "generic": 0.0}
        self.counts = {"domain": 0, "generic": 0}

    def update(self, vectors: torch.Tensor, next_ids: torch.Tensor) -> None:
        """``vectors`` (..., d) at positions whose next token is ``next_ids`` (...); negative ids are skipped."""
        flat = vectors.reshape(-1, vectors.shape[-1]).double()
        ids = next_ids.reshape(-1).to(flat.device)
        norms = torch.linalg.vector_norm(flat, dim=1, keepdim=True)
        unit = flat / torch.where(norms > 0, norms, torch.ones_like(norms))
        is_domain = torch.isin(ids, self.domain.to(ids.device))
        for side, keep in (("domain", (ids >= 0) & is_domain), ("generic", (ids >= 0) & ~is_domain)):
            rows = unit[keep]
            total = rows.sum(dim=0).cpu()
            self.sums[side] = total if self.sums[side] is None else self.sums[side] + total
            self.diagonal[side] += float((rows * rows).sum())
            self.counts[side] += int(rows.shape[0])

    def side_dispersion(self, side: str) -> float:
        n = self.counts[side]
        if n < 2:
            return float("nan")
        total = self.sums[side]
        return 1.0 - (float(torch.dot(total, total)) - self.diagonal[side]) / (n * (n - 1))

    def result(self) -> DispersionGap:
        d_dom, d_gen = self.side_dispersion("domain"), self.side_dispersion("generic")
        return DispersionGap(d_dom - d_gen, d_dom, d_gen, self.counts["domain"], self.counts["generic"])


class ChunkGaps:
    """A :class:`GapAccumulator` per chunk (row of a batch), so G can be bootstrapped over chunks."""

    def __init__(self, domain_token_ids):
        self.ids = domain_token_ids
        self.chunks: list[GapAccumulator] = []

    def update(self, vectors: torch.Tensor, next_ids: torch.Tensor) -> None:
        for row in range(vectors.shape[0]):
            accumulator = GapAccumulator(self.ids)
            accumulator.update(vectors[row], next_ids[row])
            self.chunks.append(accumulator)

    def parts(self) -> list[tuple[dict, dict, dict]]:
        """Per chunk: sums of unit vectors (numpy, per side), sums of their squared norms, counts."""
        return [({side: g.sums[side].numpy() for side in g.sums}, dict(g.diagonal), dict(g.counts)) for g in self.chunks]


def domain_token_ids(tokenizer, spec: str = "digits") -> list[int]:
    """Token ids of a domain token set.

    ``digits``: every token whose text, without the tokenizer's space markers, is
    one or more ASCII digits. Otherwise a comma-separated list of token texts
    (e.g. ``def,return,import``); each must exist, with or without a leading space.
    """
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    cleaned = [str(t).replace("Ġ", "").replace("▁", "").strip() if t is not None else "" for t in tokens]
    if spec.strip() == "digits":
        ids = [i for i, t in enumerate(cleaned) if t and t.isascii() and t.isdigit()]
    else:
        wanted = [w.strip() for w in spec.split(",") if w.strip()]
        ids = [i for i, t in enumerate(cleaned) if t in wanted]
        missing = sorted(set(wanted) - {cleaned[i] for i in ids})
        if missing:
            raise RaygeomError(f"domain tokens not in the vocabulary: {', '.join(missing)}")
    if not ids:
        raise RaygeomError(f"the tokenizer has no tokens for the domain set '{spec}'")
    return ids


@dataclass
class ChunkStatistics:
    token_dispersion: dict[str, np.ndarray]  # layer -> (B,) float64
    pooled: dict[str, np.ndarray]  # layer -> (B, d) float32, mean over tokens (first one skipped)
    nll: np.ndarray  # (B,) mean next-token NLL
    n_predicted: int  # next-token predictions per chunk
    gaps: dict[str, GapAccumulator] = field(default_factory=dict)


@torch.inference_mode()
def chunk_statistics(
    model: nn.Module,
    input_ids: torch.Tensor,
    layers: list[str],
    gaps: dict[str, GapAccumulator] | None = None,
    skip_first: bool = True,
) -> ChunkStatistics:
    """Per-chunk token dispersion and pooled vector of every layer, and per-chunk NLL, from one forward pass.

    ``gaps`` (layer -> accumulator) are updated in place with each position and its next token.
    Pooling skips the first position, whose activation is orders of magnitude larger in many LMs.
    """
    device = next(model.parameters()).device
    ids = input_ids.to(device)
    dispersions: dict[str, np.ndarray] = {}
    pooled: dict[str, np.ndarray] = {}

    def reduce(name, hidden):
        h = hidden.float()
        if not bool(torch.isfinite(h).all()):
            raise RaygeomError(f"layer {name} produced NaN or inf activations")
        dispersions[name] = token_dispersion(h)
        pooled[name] = (h[:, 1:] if skip_first and h.shape[1] > 1 else h).mean(dim=1).cpu().numpy()
        if gaps and name in gaps:
            gaps[name].update(h[:, :-1], ids[:, 1:])

    with capture_token_layers(model, layers, reduce):
        output = model_surgery.base_model(model)(input_ids=ids, use_cache=False)
    nll = per_token_nll(model, output.last_hidden_state, ids)
    missing = set(layers) - set(dispersions)
    if missing:
        raise RaygeomError(f"layers not captured: {', '.join(sorted(missing))}")
    return ChunkStatistics(dispersions, pooled, nll.double().mean(dim=1).cpu().numpy(), ids.shape[1] - 1, gaps or {})


@torch.inference_mode()
def token_features(
    model: nn.Module, input_ids: torch.Tensor, layers: list[str]
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """kNN-LM features of full chunks: per layer the (B*(T-1), d) float32 vectors at every position
    that has a next token, those next tokens, and the LM's log-probability of each."""
    device = next(model.parameters()).device
    ids = input_ids.to(device)
    features: dict[str, np.ndarray] = {}

    def reduce(name, hidden):
        features[name] = hidden[:, :-1].float().reshape(-1, hidden.shape[-1]).cpu().numpy()

    with capture_token_layers(model, layers, reduce):
        output = model_surgery.base_model(model)(input_ids=ids, use_cache=False)
    nll = per_token_nll(model, output.last_hidden_state, ids)
    return features, ids[:, 1:].reshape(-1).cpu().numpy(), (-nll.double()).reshape(-1).cpu().numpy()
