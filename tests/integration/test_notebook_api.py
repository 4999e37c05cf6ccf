"""The notebook loaders are the CLI's loaders, and pga_by_layer takes the --layers rule."""

import numpy as np
import pytest

import raygeom
from raygeom.errors import InputError, RaygeomError
from raygeom.sources.models import load_model, resolve_model

pytestmark = pytest.mark.integration


def test_load_model_is_the_cli_loader(hub_cache):
    model, tokenizer = raygeom.load_model("EleutherAI/pythia-14m", revision="step1000")
    reference, _ = load_model(resolve_model("EleutherAI/pythia-14m", "step1000"))
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert np.array_equal(a.numpy(), b.numpy()), name
    assert tokenizer("the market rose")["input_ids"]


def test_load_builtin_takes_only_built_in_names(hub_cache):
    with pytest.raises(InputError, match="not a built-in model; built in: gemma3-270m, smollm2-135m"):
        raygeom.load_builtin("EleutherAI/pythia-14m")
    with pytest.raises(RaygeomError):
        raygeom.load_builtin("nonsense")


def test_load_texts_is_the_cli_sample(tmp_path):
    from raygeom.sources.corpus import load_corpus

    path = tmp_path / "t.txt"
    path.write_text("\n".join(f"text number {i}" for i in range(20)))
    texts, labels = raygeom.load_texts(str(path), n=5, seed=3)
    assert texts == load_corpus(str(path)).sample(5, 3).texts and labels is None


def test_pga_by_layer_selects_layers_by_the_cli_rule(hub_cache):
    model, tokenizer = raygeom.load_model("EleutherAI/pythia-14m", revision="step143000")
    words = ["shares", "goal", "film", "chips", "report", "week"]
    texts = [f"the market rose {i} times as investors bought {i * 7 % 13} {words[i % 6]}" for i in range(20)]
    every = {r["layer"]: r for r in raygeom.pga_by_layer(model, tokenizer, texts, k=6, n_null=8, seed=1)}
    picked = raygeom.pga_by_layer(model, tokenizer, texts, k=6, n_null=8, seed=1, layers="embed,1,-1")
    assert [r["layer"] for r in picked] == ["embed", "block_01", "block_02"]
    assert [r["relative_depth"] for r in picked] == [0.0, 0.5, 0.75]  # embed, 3 blocks, final_norm: 5 layers
    for row in picked:
        if row["layer"] == "embed":  # the texts end in 6 distinct words: 6 distinct vectors, rank 5 < k + 2
            assert np.isnan(row["z"]) and row["note"].startswith("not scored: rank") and np.isnan(every["embed"]["z"])
        else:
            assert np.isfinite(row["z"]) and row["z"] == every[row["layer"]]["z"]
        assert row["layer_index"] == every[row["layer"]]["layer_index"]
