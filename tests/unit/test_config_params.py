"""`raygeom plan` shows a model's parameters from its config before a run and from the store after it (what the loaded
model counted): the two are one number. The config's count is checked against transformers' own model built from the
same config on the meta device (no weights, no memory)."""

import pytest

from raygeom.sources.models import BUILTIN_SHAPES, config_params


def counted(config: dict) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = {k: v for k, v in config.items() if k != "model_type"}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **settings))
    return sum(p.numel() for p in model.parameters())  # tied embeddings once, as the store's params


@pytest.mark.parametrize("name", sorted(BUILTIN_SHAPES))
def test_a_built_in_counts_what_its_loaded_model_counts(name):
    assert config_params(BUILTIN_SHAPES[name]) == counted(BUILTIN_SHAPES[name])


def test_the_built_ins_are_the_numbers_their_stores_hold():
    # measured by `raygeom run` (the extraction's params): 134.5M and 268.1M, where plan said 121.2M and 244.4M
    assert config_params(BUILTIN_SHAPES["smollm2-135m-instruct-q4_1"]) == 134_515_008
    assert config_params(BUILTIN_SHAPES["gemma3-270m-q4_k_m"]) == 268_098_176


@pytest.mark.parametrize(
    "config",
    [
        {
            "model_type": "gpt_neox",
            "hidden_size": 128,
            "num_hidden_layers": 6,
            "num_attention_heads": 4,
            "intermediate_size": 512,
            "vocab_size": 50304,
            "tie_word_embeddings": False,
        },  # pythia-14m: 14,067,712
        {
            "model_type": "llama",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 96,
            "vocab_size": 300,
            "tie_word_embeddings": False,
            "attention_bias": True,
            "mlp_bias": True,
        },
        {
            "model_type": "gemma2",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "intermediate_size": 96,
            "vocab_size": 300,
        },
    ],
)
def test_other_architectures(config):
    assert config_params(config) == counted(config)
