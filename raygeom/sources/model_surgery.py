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
    "gpt_neox": ArchitecturePaths(
        "gpt_neox", "gpt_neox.layers", "gpt_neox.final_layer_norm", "lm_head|embed_out", "gpt_neox.embed_in"
    ),
    "llama": ArchitecturePaths("model", "model.layers", "model.norm", "lm_head", "model.embed_tokens"),
    "gemma3_text": ArchitecturePaths("model", "model.layers", "model.norm", "lm_head", "model.embed_tokens"),
    "gemma3": ArchitecturePaths(
        "model.language_model",
        "model.language_model.layers",
        "model.language_model.norm",
        "lm_head",
        "model.language_model.embed_tokens",
    ),
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


# ------------------------------------------------------------------------------------------ hook points inside blocks
# Names as in ``--layers``: ``block_05.attn_out``, ``block_05.resid_mid``, ``block_05.mlp_out`` (see
# raygeom.sources.layers.select_layers). TransformerLens calls them hook_attn_out, hook_resid_mid and hook_mlp_out.
#   attn_out   what the attention sub-layer adds to the residual stream (after any post-attention norm and dropout)
#   mlp_out    what the MLP adds to the residual stream (after any post-feedforward norm and dropout)
#   resid_mid  the residual stream between the two adds: block input + attn_out. In a sequential block the MLP reads
#              it (through its norm); in a parallel-residual block (GPT-NeoX/Pythia with use_parallel_residual, Phi)
#              the MLP reads the block input instead, and resid_mid is still block input + attn_out, the stream with
#              only attention's write in it. Either way  resid_mid + mlp_out == block output.
SUBLAYERS = ("attn_out", "resid_mid", "mlp_out")


@dataclass(frozen=True)
class BlockPoints:
    """Where a block's sub-layer outputs are, as module paths relative to the block.

    ``attn_out``/``mlp_out``: modules whose output is exactly what is added to the residual stream.
    ``resid_mid``: a module whose *input* is the mid-block residual stream, or None where no module reads it
    (parallel residual), in which case it is formed as block input + attn_out."""

    attn_out: str
    mlp_out: str
    resid_mid: str | None
    parallel: bool = False  # attention and MLP both read the block input


_SEQUENTIAL = BlockPoints("self_attn", "mlp", "post_attention_layernorm")  # Llama, Mistral, Qwen2, OLMo, Gemma 1, Phi-3
_SANDWICH = BlockPoints("post_attention_layernorm", "post_feedforward_layernorm", "pre_feedforward_layernorm")  # Gemma 2/3
BLOCK_POINTS: dict[str, BlockPoints] = {
    "llama": _SEQUENTIAL,
    "mistral": _SEQUENTIAL,
    "qwen2": _SEQUENTIAL,
    "olmo": _SEQUENTIAL,
    "gemma": _SEQUENTIAL,
    "phi3": BlockPoints("resid_attn_dropout", "resid_mlp_dropout", "post_attention_layernorm"),
    "gemma2": _SANDWICH,
    "gemma3_text": _SANDWICH,
    "gemma3": _SANDWICH,
    # OLMo 2 normalises each sub-layer's output before the add and has no pre-MLP norm: resid_mid is formed.
    "olmo2": BlockPoints("post_attention_layernorm", "post_feedforward_layernorm", None),
    "gpt2": BlockPoints("attn", "mlp", "ln_2"),
    # Phi: parallel, attention and MLP both read input_layernorm(x); its one resid_dropout runs twice, so hook the
    # sub-layers themselves (dropout is the identity in eval).
    "phi": BlockPoints("self_attn", "mlp", None, parallel=True),
}
# GPT-NeoX: both sub-layers' adds go through a dropout module (identity in eval); parallel unless configured otherwise.
_NEOX = {
    True: BlockPoints("post_attention_dropout", "post_mlp_dropout", None, parallel=True),
    False: BlockPoints("post_attention_dropout", "post_mlp_dropout", "post_attention_layernorm"),
}


def block_points(model: nn.Module) -> BlockPoints:
    """The sub-layer hook points of this model's blocks (see SUBLAYERS); raises for an unknown family."""
    model_type = getattr(model.config, "model_type", None)
    if model_type == "gpt_neox":
        return _NEOX[bool(getattr(_text_config(model), "use_parallel_residual", True))]
    if model_type not in BLOCK_POINTS:
        raise RaygeomError(
            f"raygeom does not know the sub-layers of '{model_type}' blocks; hook points inside blocks "
            f"work for: {', '.join(sorted({*BLOCK_POINTS, 'gpt_neox'}))}"
        )
    return BLOCK_POINTS[model_type]


def sublayer_module(model: nn.Module, block_index: int, path: str) -> nn.Module:
    return _get(blocks(model)[block_index], path)
