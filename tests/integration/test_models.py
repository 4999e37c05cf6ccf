"""Loading through the real hub path, offline, and parity with plain Hugging Face outputs."""

import numpy as np
import pytest
import torch

from raygeom.errors import RaygeomError
from raygeom.replica.extract import ExtractionSettings, extract_batch
from raygeom.sources import model_surgery
from raygeom.sources.models import load_model, resolve_model, weight_fingerprint
from tests.conftest import TINY_REVISIONS

pytestmark = pytest.mark.integration
TEXTS = ["the market rose as investors bought shares", "the team won the final after a late goal in extra time ."]


@pytest.mark.parametrize("revision", TINY_REVISIONS)
def test_pythia_revisions_load_offline_through_the_hub_path(hub_cache, revision):
    spec = resolve_model("EleutherAI/pythia-14m", revision)
    assert spec.kind == "hub" and spec.revision == revision
    model, tokenizer = load_model(spec)
    assert model.config.model_type == "gpt_neox"
    assert model_surgery.unembedding(model) is model.get_output_embeddings().weight
    assert not model_surgery.is_tied(model)


def test_revisions_serve_different_weights(hub_cache):
    prints = {r: weight_fingerprint(load_model(resolve_model("EleutherAI/pythia-14m", r))[0]) for r in TINY_REVISIONS}
    assert len(set(prints.values())) == len(TINY_REVISIONS)


@pytest.mark.parametrize(
    "source, revision, message",
    [
        ("EleutherAI/pythia-14m", "step2000", "revision 'step2000'"),
        ("EleutherAI/pythia-9000b", "main", "cannot load model 'EleutherAI/pythia-9000b'"),
    ],
)
def test_missing_model_or_revision_offline_is_one_clear_error(hub_cache, source, revision, message):
    with pytest.raises(RaygeomError, match=message):
        load_model(resolve_model(source, revision))


def test_unknown_model_name_is_rejected_before_loading():
    with pytest.raises(RaygeomError, match="unknown model 'no-such-model'"):
        resolve_model("no-such-model")


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_layers_match_hugging_face_hidden_states(hub_cache, padding_side):
    model, tokenizer = load_model(resolve_model("EleutherAI/pythia-14m", "step1000"))
    tokenizer.padding_side = padding_side
    got = extract_batch(model, tokenizer, TEXTS, ExtractionSettings(seq_len=32, pool="last"))
    names = model_surgery.layer_names(model)
    assert names == ["embed", "block_00", "block_01", "block_02", "final_norm"]
    for row, text in enumerate(TEXTS):
        encoded = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            out = model(**encoded, labels=encoded["input_ids"], output_hidden_states=True)
        hidden = [h[0, -1].numpy() for h in out.hidden_states]
        # HF: hidden_states[0] = embeddings, [i] = block i-1 output, last = after the final norm.
        np.testing.assert_allclose(got.pooled["embed"][row], hidden[0], atol=1e-4)
        np.testing.assert_allclose(got.pooled["block_00"][row], hidden[1], atol=1e-4)
        np.testing.assert_allclose(got.pooled["block_01"][row], hidden[2], atol=1e-4)
        np.testing.assert_allclose(got.pooled["final_norm"][row], hidden[3], atol=1e-4)
        # The last block's raw output is the final norm's input.
        normed = model.gpt_neox.final_layer_norm(torch.from_numpy(got.pooled["block_02"][row])).detach().numpy()
        np.testing.assert_allclose(normed, hidden[3], atol=1e-4)
        assert got.nll[row] == pytest.approx(out.loss.item(), rel=1e-4)


def test_mean_pool_skips_the_first_token(hub_cache):
    model, tokenizer = load_model(resolve_model("EleutherAI/pythia-14m", "step0"))
    encoded = tokenizer(TEXTS[1], return_tensors="pt")
    with torch.no_grad():
        hidden = model(**encoded, output_hidden_states=True).hidden_states[2][0]
    with_first = extract_batch(model, tokenizer, TEXTS[1:], ExtractionSettings(pool="mean", skip_first=False))
    without = extract_batch(model, tokenizer, TEXTS[1:], ExtractionSettings(pool="mean", skip_first=True))
    np.testing.assert_allclose(with_first.pooled["block_01"][0], hidden.mean(0).numpy(), atol=1e-4)
    np.testing.assert_allclose(without.pooled["block_01"][0], hidden[1:].mean(0).numpy(), atol=1e-4)
