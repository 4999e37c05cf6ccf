"""Batched forward passes that return pooled hidden states of every layer and per-sample NLL.

Pure torch: no Ray and no files. Hidden states are captured with hooks on the
blocks, so the base model runs without ever computing full-vocabulary logits;
logits are made only for the loss, a slice of positions at a time.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from raygeom.errors import RaygeomError
from raygeom.replica import tokenize
from raygeom.replica.settings import POOLS, ExtractionSettings  # noqa: F401 - re-exported
from raygeom.sources import layers as layer_position
from raygeom.sources import model_surgery

# Upper bound on one slice of logits (elements), so a 262k vocabulary stays near 256 MB.
LOGIT_CHUNK_ELEMENTS = 1 << 26
_HOOKS = threading.Lock()


@dataclass
class BatchActivations:
    pooled: dict[str, np.ndarray]  # layer name -> (B, d) float32
    nll: np.ndarray  # (B,) mean next-token NLL in nats; NaN where it was not asked for
    n_tokens: np.ndarray  # (B,) tokens seen after truncation


def _first_and_last_positions(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Index of the first and last real token per row, for left or right padding."""
    seq = mask.shape[1]
    first = mask.int().argmax(dim=1)
    last = seq - 1 - mask.int().flip(1).argmax(dim=1)
    return first, last


def pool_hidden(hidden: torch.Tensor, mask: torch.Tensor, pool: str, skip_first: bool) -> torch.Tensor:
    """(B, T, d) -> (B, d). ``mean`` can drop each row's first real token, whose
    activation is orders of magnitude larger than the rest in many LMs."""
    first, last = _first_and_last_positions(mask)
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    if pool == "last":
        return hidden[rows, last]
    weights = mask.to(hidden.dtype).clone()
    if skip_first:
        single = mask.sum(1) <= 1
        weights[rows[~single], first[~single]] = 0.0
    return (hidden * weights.unsqueeze(-1)).sum(1) / weights.sum(1, keepdim=True).clamp_min(1.0)


def own_hook(module: nn.Module, function, owner: int, pre: bool = False):
    """``function`` as a forward (pre-, with kwargs) hook of ``module`` that serves only thread ``owner``: several
    threads may run forward passes of one model at once (:func:`one_thread_each`). Hooks are added and removed one
    thread at a time."""

    def mine(*args):
        return function(*args) if threading.get_ident() == owner else None

    with _HOOKS:
        return module.register_forward_pre_hook(mine, with_kwargs=True) if pre else module.register_forward_hook(mine)


def remove_hooks(handles) -> None:
    with _HOOKS:
        for handle in handles:
            handle.remove()


@contextmanager
def capture_layers(model: nn.Module, wanted: list[str], reduce):
    """Run ``reduce(name, hidden)`` on each wanted layer's hidden states during a forward pass.

    Besides ``embed``, ``block_XX`` and ``final_norm``, ``wanted`` may name points inside a block
    (``block_XX.attn_out``, ``.resid_mid``, ``.mlp_out``; see raygeom.sources.layers), hooked where
    ``model_surgery.block_points`` says they are."""
    names = model_surgery.layer_names(model)
    blocks = model_surgery.blocks(model)
    handles = []
    owner = threading.get_ident()

    def attach(module: nn.Module, function, pre: bool = False) -> None:
        handles.append(own_hook(module, function, owner, pre))

    def first_input(args, kwargs):
        return args[0] if args else kwargs["hidden_states"]

    def block_input_hook(module, args, kwargs):
        reduce("embed", first_input(args, kwargs))

    def output_hook(name):
        def hook(module, args, output):
            reduce(name, output[0] if isinstance(output, tuple) else output)

        return hook

    def input_hook(name):
        def hook(module, args, kwargs):
            reduce(name, first_input(args, kwargs))

        return hook

    def register_inside(index: int, block_name: str, subs: set[str]) -> None:
        points = model_surgery.block_points(model)
        block = blocks[index]
        formed = "resid_mid" in subs and points.resid_mid is None  # block input + attn_out
        held: dict[str, torch.Tensor] = {}

        def keep_input(module, args, kwargs):
            held["input"] = first_input(args, kwargs)

        def attn_hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            if "attn_out" in subs:
                reduce(f"{block_name}.attn_out", out)
            if formed:
                reduce(f"{block_name}.resid_mid", held.pop("input") + out)

        if formed:
            attach(block, keep_input, pre=True)
        if "attn_out" in subs or formed:
            attach(model_surgery.sublayer_module(model, index, points.attn_out), attn_hook)
        if "resid_mid" in subs and not formed:
            module = model_surgery.sublayer_module(model, index, points.resid_mid)
            attach(module, input_hook(f"{block_name}.resid_mid"), pre=True)
        if "mlp_out" in subs:
            module = model_surgery.sublayer_module(model, index, points.mlp_out)
            attach(module, output_hook(f"{block_name}.mlp_out"))

    inside: dict[str, set[str]] = {}
    for name in wanted:
        block_name, sub = layer_position.split(name)
        if sub is not None:
            inside.setdefault(block_name, set()).add(sub)
    unknown = [name for name in wanted if layer_position.split(name)[0] not in names]
    if unknown:
        raise RaygeomError(f"no layer {unknown[0]} in this model (layers: {names[0]} .. {names[-1]})")
    try:
        if "embed" in wanted:
            attach(blocks[0], block_input_hook, pre=True)
        for index, (name, block) in enumerate(zip(names[1:-1], blocks)):
            if name in wanted:
                attach(block, output_hook(name))
            if name in inside:
                register_inside(index, name, inside[name])
        if "final_norm" in wanted:
            attach(model_surgery.final_norm(model), output_hook("final_norm"))
        yield
    finally:
        remove_hooks(handles)


def per_sample_nll(model: nn.Module, final_hidden: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token NLL per row, making logits for a bounded slice of positions at a time."""
    valid = (mask[:, :-1] & mask[:, 1:]).bool()
    rows = torch.arange(input_ids.shape[0], device=input_ids.device).unsqueeze(1).expand_as(valid)[valid]
    hidden = final_hidden[:, :-1][valid]
    targets = input_ids[:, 1:][valid]
    vocab = model.get_output_embeddings().weight.shape[0]
    step = max(1, LOGIT_CHUNK_ELEMENTS // vocab)
    losses = torch.empty(len(targets), device=final_hidden.device, dtype=torch.float32)
    for start in range(0, len(targets), step):
        logits = model_surgery.logits_from_final_hidden(model, hidden[start : start + step]).float()
        losses[start : start + step] = nn.functional.cross_entropy(logits, targets[start : start + step], reduction="none")
    totals = torch.zeros(input_ids.shape[0], device=losses.device).index_add_(0, rows, losses)
    counts = valid.sum(1).clamp_min(1)
    return totals / counts


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, so a left-padded row sees the positions it would see alone."""
    return (mask.long().cumsum(1) - 1).clamp_min(0)


@torch.inference_mode()
def extract_batch(
    model: nn.Module,
    tokenizer,
    texts: list[str],
    settings: ExtractionSettings,
    layers: list[str] | None = None,
    encoded: dict | None = None,
    nll: bool = True,
) -> BatchActivations:
    """Pooled vectors of ``layers`` (all when None) and, only when ``nll``, the per-sample NLL (NaN otherwise):
    the full-vocabulary LM head is a large share of a forward pass (about half of Gemma's).

    ``encoded`` (input_ids, attention_mask as arrays from ``tokenize.encode``) skips tokenising."""
    device = next(model.parameters()).device
    if encoded is None:
        encoded = tokenize.encode(tokenizer, texts, settings.seq_len)
    batch = {name: torch.as_tensor(encoded[name]).to(device) for name in ("input_ids", "attention_mask")}
    mask = batch["attention_mask"]
    if int(mask.sum(1).min()) == 0:
        raise RaygeomError("a text produced no tokens; remove empty texts from the corpus")
    wanted = model_surgery.layer_names(model) if layers is None else layers
    pooled: dict[str, np.ndarray] = {}

    def reduce(name, hidden):
        pooled[name] = pool_hidden(hidden, mask, settings.pool, settings.skip_first).float().cpu().numpy()

    with capture_layers(model, wanted, reduce):
        output = model_surgery.base_model(model)(**batch, position_ids=position_ids(mask), use_cache=False)
    if nll:
        losses = per_sample_nll(model, output.last_hidden_state, batch["input_ids"], mask).float().cpu().numpy()
    else:
        losses = np.full(mask.shape[0], np.nan, dtype=np.float32)
    for name, values in pooled.items():
        if not np.isfinite(values).all():
            raise RaygeomError(f"layer {name} produced NaN or inf activations")
    return BatchActivations(pooled, losses, mask.sum(1).cpu().numpy())


def extract_batches(
    model: nn.Module,
    tokenizer,
    parts: list[list[str]],
    settings: ExtractionSettings,
    layers: list[str] | None = None,
    nll: bool = True,
    threads: int | None = None,
) -> list[BatchActivations]:
    """:func:`extract_batch` of each part, by :func:`one_thread_each`."""
    return one_thread_each(model, lambda part: extract_batch(model, tokenizer, part, settings, layers, nll=nll), parts, threads)


def one_thread_each(model: nn.Module, function, items: list, threads: int | None = None) -> list:
    """``function`` of each item in order. On CPU every item runs on one torch thread, up to ``threads`` items at once
    (default: torch's thread count here): torch's CPU kernels split one batch across threads in ways that change its
    last bits (scaled_dot_product_attention, RMSNorm: measured), so a batch's numbers would depend on how many CPUs
    its replica got. One thread per batch makes them the same for any ``threads``, on any node."""
    if next(model.parameters()).device.type != "cpu":
        return [function(item) for item in items]
    previous = torch.get_num_threads()
    workers = max(1, min(int(threads or previous), len(items)))
    try:
        with ThreadPoolExecutor(
            workers, thread_name_prefix="raygeom-forward", initializer=torch.set_num_threads, initargs=(1,)
        ) as pool:
            return list(pool.map(function, items))
    finally:
        # The pool's threads set torch's process-wide default, which threads started later would inherit.
        torch.set_num_threads(previous)
