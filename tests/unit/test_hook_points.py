"""Points inside blocks (block_XX.attn_out, .resid_mid, .mlp_out): where each family keeps them, checked on tiny
random models by the residual-stream identities that define them."""

import pytest
import torch

from raygeom.errors import RaygeomError
from raygeom.replica.extract import capture_layers
from raygeom.sources import model_surgery
from raygeom.sources.layers import relative_depth, select_layers
from raygeom.testing import tiny_causal_lm

SEQUENTIAL = ["llama", "gemma3_text", "qwen2", "mistral", "olmo", "olmo2", "gemma", "gemma2", "phi3", "gpt2"]
PARALLEL = ["gpt_neox", "phi"]


def captured(model, wanted):
    got = {}
    ids = torch.randint(1, 300, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), capture_layers(model, wanted, lambda name, hidden: got.__setitem__(name, hidden.clone())):
        model_surgery.base_model(model)(input_ids=ids, use_cache=False)
    assert set(got) == set(wanted)
    return got


def points(block):
    return [f"{block}.attn_out", f"{block}.resid_mid", f"{block}.mlp_out"]


@pytest.mark.parametrize(
    "family,extra", [(f, {}) for f in SEQUENTIAL + PARALLEL] + [("gpt_neox", {"use_parallel_residual": False})]
)
def test_resid_mid_plus_mlp_out_is_the_block_output(family, extra):
    model = tiny_causal_lm(family, **extra)
    got = captured(model, ["block_00", "block_01", *points("block_01"), *points("block_02"), "block_02"])
    for before, block in (("block_00", "block_01"), ("block_01", "block_02")):
        attn, mid, mlp = (got[name] for name in points(block))
        # resid_mid is the block input plus what attention added (in every family, parallel or not) ...
        torch.testing.assert_close(got[before] + attn, mid, rtol=1e-5, atol=1e-5)
        # ... and the block output adds what the MLP added to that.
        torch.testing.assert_close(mid + mlp, got[block], rtol=1e-5, atol=1e-5)
        assert attn.abs().mean() > 1e-3 and mlp.abs().mean() > 1e-3  # neither is a zero that passes trivially
    assert model_surgery.block_points(model).parallel == (family in PARALLEL and extra.get("use_parallel_residual", True))


def test_parallel_gpt_neox_mlp_reads_the_block_input_not_resid_mid():
    """Pythia's parallel residual: out = x + attn(ln1(x)) + mlp(ln2(x)); the MLP never sees resid_mid."""
    model = tiny_causal_lm("gpt_neox")
    block = model_surgery.blocks(model)[1]
    got = captured(model, ["block_00", *points("block_01")])
    with torch.inference_mode():
        from_input = block.mlp(block.post_attention_layernorm(got["block_00"]))
        from_mid = block.mlp(block.post_attention_layernorm(got["block_01.resid_mid"]))
    torch.testing.assert_close(from_input, got["block_01.mlp_out"], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(from_mid, got["block_01.mlp_out"], atol=1e-3)


def test_the_layers_rule_names_points_inside_blocks():
    names = ["embed", "block_00", "block_01", "block_02", "final_norm"]
    assert select_layers(names, "1.mlp_out,embed,block_01.resid_mid,-1.attn_out,block_01") == [
        "embed",
        "block_01.resid_mid",
        "block_01.mlp_out",
        "block_01",
        "block_02.attn_out",
    ]
    assert select_layers(names, "0:2.mlp_out") == ["block_00.mlp_out", "block_01.mlp_out"]
    assert select_layers(names, "all") == names  # never the points inside blocks unless named
    assert (
        relative_depth(names, "block_00")
        < relative_depth(names, "block_01.attn_out")
        < relative_depth(names, "block_01.resid_mid")
        < relative_depth(names, "block_01.mlp_out")
        < relative_depth(names, "block_01")
    )
    for bad in ("block_07.mlp_out", "1.ffn_out", "embed.mlp_out"):
        with pytest.raises(RaygeomError, match="not found"):
            select_layers(names, bad)


def test_an_unknown_family_says_which_families_have_points_inside_blocks():
    model = tiny_causal_lm("llama")
    model.config.model_type = "mystery"
    with pytest.raises(RaygeomError, match="sub-layers of 'mystery'"):
        model_surgery.block_points(model)


def test_token_level_statistics_take_points_inside_blocks():
    """dispersion's token-level pass captures them through the same hooks."""
    from raygeom.replica.tokens import chunk_statistics

    model = tiny_causal_lm("gpt_neox")
    ids = torch.randint(1, 300, (3, 12), generator=torch.Generator().manual_seed(1))
    stats = chunk_statistics(model, ids, ["block_01.resid_mid", "block_01.mlp_out", "block_01", "attn_last"])
    assert set(stats.pooled) == {"block_01.resid_mid", "block_01.mlp_out", "block_01", "attn_last"}
    torch.testing.assert_close(
        torch.from_numpy(stats.pooled["block_01.resid_mid"] + stats.pooled["block_01.mlp_out"]),
        torch.from_numpy(stats.pooled["block_01"]),
        rtol=1e-4,
        atol=1e-4,
    )
