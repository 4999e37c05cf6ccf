"""The one tokenize path: special tokens as trained (BOS kept) on every path, and padding on either side
gives each text the vectors it has alone. References are plain Hugging Face forwards of single texts."""

import numpy as np
import pytest
import torch

from raygeom.replica import tokenize
from raygeom.replica.extract import ExtractionSettings
from raygeom.replica.replica import Replica
from raygeom.sources.models import resolve_model
from raygeom.testing import TINY_TEXT, tiny_bos_tokenizer, tiny_tokenizer, write_tiny_bos_model

TEXTS = [TINY_TEXT[:20], TINY_TEXT[30:110], TINY_TEXT[5:60], "the team won"]


def _long_texts():
    sentences = TINY_TEXT.split(" . ")
    return [" . ".join(sentences[(i + j) % len(sentences)] for j in range(6)) for i in range(6)]


@pytest.fixture(scope="module")
def bos_model_dir(tmp_path_factory):
    return write_tiny_bos_model(tmp_path_factory.mktemp("bos") / "tiny-bos-llama", padding_side="left")


@pytest.fixture(scope="module")
def replica(bos_model_dir):
    return Replica(resolve_model(str(bos_model_dir)), threads=1)


def test_special_prefix_is_what_the_tokenizer_adds():
    bos = tiny_bos_tokenizer()
    assert tokenize.special_prefix(bos) == [bos.convert_tokens_to_ids("<bos>")]
    assert tokenize.special_prefix(tiny_tokenizer()) == []


@pytest.mark.parametrize("side", ["left", "right"])
def test_encode_keeps_bos_on_every_row_and_pads_on_the_asked_side(side):
    tokenizer = tiny_bos_tokenizer()
    bos = tokenizer.convert_tokens_to_ids("<bos>")
    encoded = tokenize.encode(tokenizer, TEXTS, seq_len=12, padding_side=side)
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    assert ids.dtype == np.int64 and ids.shape[1] <= 12
    for row, text in enumerate(TEXTS):
        real = ids[row][mask[row] == 1]
        alone = tokenizer(text, truncation=True, max_length=12)["input_ids"]
        assert real.tolist() == alone and real[0] == bos
        padded = np.flatnonzero(mask[row] == 0)
        if len(padded):
            assert (
                (padded < np.flatnonzero(mask[row])[0]).all()
                if side == "left"
                else (padded > np.flatnonzero(mask[row])[-1]).all()
            )
    assert tokenizer.padding_side == "right"  # asking for a side does not change the tokenizer


def test_chunks_start_with_bos_and_carry_the_stream_without_special_tokens():
    tokenizer = tiny_bos_tokenizer()
    bos = tokenizer.convert_tokens_to_ids("<bos>")
    texts = _long_texts()
    chunks, domains = tokenize.make_chunks(tokenizer, texts, None, 16, 4, seed=0)
    assert chunks.shape == (4, 16) and domains == ["all"] * 4
    assert (chunks[:, 0] == bos).all() and not (chunks[:, 1:] == bos).any()
    # Without BOS the same texts give the same stream, cut 16 at a time instead of 15.
    plain, _ = tokenize.make_chunks(tiny_tokenizer(), texts, None, 16, 4, seed=0)
    np.testing.assert_array_equal(chunks[:, 1:].reshape(-1), plain.reshape(-1)[:60])


def _hf_alone(model, ids: list[int]) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return [h[0].numpy() for h in out.hidden_states]


def test_pooled_path_keeps_bos_and_left_padding_changes_nothing(replica):
    model, tokenizer = replica.model, replica.tokenizer
    assert tokenizer.padding_side == "left"
    settings = ExtractionSettings(seq_len=24, pool="last", batch_size=4)
    got = replica.pooled(TEXTS, settings, ["embed", "block_00", "final_norm"], nll=True)
    bos = tokenizer.convert_tokens_to_ids("<bos>")
    for row, text in enumerate(TEXTS):
        ids = tokenizer(text, truncation=True, max_length=24)["input_ids"]
        assert ids[0] == bos
        hidden = _hf_alone(model, ids)
        np.testing.assert_allclose(got.pooled["embed"][row], hidden[0][-1], atol=1e-5)
        np.testing.assert_allclose(got.pooled["block_00"][row], hidden[1][-1], atol=1e-5)
        np.testing.assert_allclose(got.pooled["final_norm"][row], hidden[-1][-1], atol=1e-5)
        with torch.no_grad():
            loss = model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
        assert got.nll[row] == pytest.approx(loss, rel=1e-4)
        without = _hf_alone(model, ids[1:])
        assert not np.allclose(got.pooled["final_norm"][row], without[-1][-1], atol=1e-3)
    assert got.n_tokens.tolist() == [len(tokenizer(t, truncation=True, max_length=24)["input_ids"]) for t in TEXTS]


def test_right_padding_gives_the_same_vectors(replica):
    settings = ExtractionSettings(seq_len=24, pool="mean", batch_size=4)
    left = replica.pooled(TEXTS, settings, ["block_01"])
    tokenizer = replica.tokenizer
    tokenizer.padding_side = "right"
    try:
        right = replica.pooled(TEXTS, settings, ["block_01"])
    finally:
        tokenizer.padding_side = "left"
    np.testing.assert_allclose(left.pooled["block_01"], right.pooled["block_01"], atol=1e-5)


def test_nll_only_when_asked(replica):
    settings = ExtractionSettings(seq_len=24, batch_size=4)
    without = replica.pooled(TEXTS, settings, ["final_norm"])
    with_nll = replica.pooled(TEXTS, settings, ["final_norm"], nll=True)
    assert np.isnan(without.nll).all() and np.isfinite(with_nll.nll).all()
    np.testing.assert_array_equal(without.pooled["final_norm"], with_nll.pooled["final_norm"])


def test_chunk_path_keeps_bos_and_matches_hugging_face(replica):
    chunks, _ = replica.chunks(_long_texts(), None, 16, 3, 0)
    bos = replica.tokenizer.convert_tokens_to_ids("<bos>")
    assert (chunks[:, 0] == bos).all()
    dispersion, pooled, nll, n_predicted, _ = replica.statistics_batches([chunks], ["final_norm"], None)[0]
    assert n_predicted == 15
    for row in range(len(chunks)):
        ids = chunks[row].tolist()
        hidden = _hf_alone(replica.model, ids)
        np.testing.assert_allclose(pooled["final_norm"][row], hidden[-1][1:].mean(0), atol=1e-5)
        with torch.no_grad():
            loss = replica.model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
        assert nll[row] == pytest.approx(loss, rel=1e-4)
    features, next_tokens, logprob = replica.features_batches([chunks], ["final_norm"])[0]
    np.testing.assert_array_equal(next_tokens, chunks[:, 1:].reshape(-1))
    np.testing.assert_allclose(-logprob.reshape(len(chunks), 15).mean(1), nll, atol=1e-5)


def test_replica_describes_its_model_and_the_prefix(replica):
    described = replica.describe()
    assert described["layers"] == ["embed", "block_00", "block_01", "final_norm"]
    assert described["token_layers"] == [*described["layers"], "attn_last"]
    assert described["special_prefix"] == [replica.tokenizer.convert_tokens_to_ids("<bos>")]
    assert described["d"] == 32 and described["tied"] and described["threads"] == torch.get_num_threads()
    basis, singular = replica.readout_basis(8)
    w_u = replica.model.get_input_embeddings().weight.detach().double().numpy()
    reference = np.linalg.svd(w_u, full_matrices=False)
    np.testing.assert_allclose(singular, reference[1][:8], rtol=1e-8)
    np.testing.assert_allclose(np.abs(basis.T @ reference[2][:8].T), np.eye(8), atol=1e-6)


def test_a_model_that_cannot_load_reports_on_first_use(tmp_path):
    from raygeom.errors import RaygeomError
    from raygeom.sources.models import ModelSpec

    broken = Replica(ModelSpec(str(tmp_path), "local"))
    with pytest.raises(RaygeomError, match="cannot load model"):
        broken.describe()
