"""The one place that knows where each architecture keeps its parts.

Everything else asks this module for the base model, the block list, the
final norm, the unembedding and how logits are made from final hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from raygeom.errors import RaygeomError


@dataclass(frozen=True)
class ArchitecturePaths:
    """Dotted attribute paths; ``a|b`` lists alternatives across transformers versions."""

    base: str
    layers: str
    final_norm: str
    # The output projection, and the input embedding that a tied W_U shares.
    unembedding: str
    input_embedding: str


ARCHITECTURES: dict[str, ArchitecturePaths] = {
    "gpt_neox": ArchitecturePaths("gpt_neox", "gpt_neox.layers", "gpt_neox.final_layer_norm", "lm_head|embed_out", "gpt_neox.embed_in"),
    "llama": ArchitecturePaths("model", "model.layers", "model.norm", "lm_head", "model.embed_tokens"),
    "gemma3_text": ArchitecturePaths("model", "model.layers", "model.norm", "lm_head", "model.embed_tokens"),
    "gemma3": ArchitecturePaths("model.language_model", "model.language_model.layers", "model.language_model.norm", "lm_head", "model.language_model.embed_tokens"),
    "gemma2": ArchitecturePaths("model", "model.layers", "model.norm", "lm_head", "model.embed_tokens"),
    "gemma": ArchitecturePaths("model", "model.layers", "model.norm", "lm_head", "model.embed_tokens"),
    "gpt2": ArchitecturePaths("transformer", "transformer.h", "transformer.ln_f", "lm_head", "transformer.wte"),
    "olmo": ArchitecturePaths("model", "model.layers", "model.norm", "lm_head", "model.embed_tokens"),
    "olmo2": ArchitecturePaths("model", "model.layers", "model.norm", "lm_head", "model.embed_tokens"),
    "phi": ArchitecturePaths("model", "model.layers", "model.final_layernorm", "lm_head", "model.embed_tokens"),
    "phi3": ArchitecturePaths("model", "model.layers", "model.norm", "lm_head", "model.embed_tokens"),
    "mistral": ArchitecturePaths("model", "model.layers", "model.norm", "lm_head", "model.embed_tokens"),
    "qwen2": ArchitecturePaths("model", "model.layers", "model.norm", "lm_head", "model.embed_tokens"),
}


def _get(obj, dotted: str):
    for alternative in dotted.split("|"):
        try:
            found = obj
            for name in alternative.split("."):
                found = getattr(found, name)
            return found
        except AttributeError:
            continue
    raise RaygeomError(f"{type(obj).__name__} has none of the attributes {dotted}")


def paths_for(model: nn.Module) -> ArchitecturePaths:
    model_type = getattr(model.config, "model_type", None)
    if model_type not in ARCHITECTURES:
        known = ", ".join(sorted(ARCHITECTURES))
        raise RaygeomError(f"unsupported architecture '{model_type}'; raygeom knows: {known}")
    return ARCHITECTURES[model_type]


def base_model(model: nn.Module) -> nn.Module:
    """The transformer without its output head: calling it never makes logits."""
    return _get(model, paths_for(model).base)


def blocks(model: nn.Module) -> nn.ModuleList:
    return _get(model, paths_for(model).layers)


def final_norm(model: nn.Module) -> nn.Module:
    return _get(model, paths_for(model).final_norm)


def _text_config(model: nn.Module):
    config = model.config
    return getattr(config, "text_config", None) or config


def is_tied(model: nn.Module) -> bool:
    return bool(getattr(model.config, "tie_word_embeddings", False))


def unembedding(model: nn.Module) -> torch.Tensor:
    """``W_U`` as a ``V x d`` tensor; for tied models, the input embedding."""
    paths = paths_for(model)
    return _get(model, paths.input_embedding if is_tied(model) else paths.unembedding).weight


def hidden_size(model: nn.Module) -> int:
    return int(_text_config(model).hidden_size)


def n_blocks(model: nn.Module) -> int:
    return len(blocks(model))


def layer_names(model: nn.Module) -> list[str]:
    """Every layer raygeom extracts, in depth order.

    ``embed`` is the input of the first block, ``block_XX`` each block's output
    (the last one before the final norm) and ``final_norm`` the final norm's output.
    """
    width = max(2, len(str(n_blocks(model) - 1)))
    return ["embed", *[f"block_{i:0{width}d}" for i in range(n_blocks(model))], "final_norm"]


def logits_from_final_hidden(model: nn.Module, final_hidden: torch.Tensor) -> torch.Tensor:
    """Next-token logits from final-norm hidden states, with any final soft-capping applied."""
    logits = model.get_output_embeddings()(final_hidden)
    cap = getattr(_text_config(model), "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


# The attention module of a block, relative to the block. Its output is the attention sub-layer's
# output before the residual add (and, in Gemma, before the post-attention norm).
ATTENTION_SUBLAYER = "self_attn|attention|attn"


def last_attention(model: nn.Module) -> nn.Module:
    """The attention sub-layer of the last block, whose output kNN-LM and dispersion studies use as a layer."""
    return _get(blocks(model)[-1], ATTENTION_SUBLAYER)
