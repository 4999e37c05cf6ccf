"""Token-level extraction (pure torch) against Hugging Face outputs and the dispersion numerics."""

import numpy as np
import pytest
import torch

from raygeom.errors import RaygeomError
from raygeom.numerics.dispersion import dispersion, dispersion_gap, token_dispersion
from raygeom.replica import tokens as token_extract
from raygeom.sources import model_surgery
from raygeom.testing import TINY_TEXT, tiny_gpt_neox, tiny_tokenizer


@pytest.fixture(scope="module")
def tiny():
    tokenizer = tiny_tokenizer()
    return tiny_gpt_neox(len(tokenizer), 7), tokenizer


@pytest.fixture(scope="module")
def chunks(tiny):
    _, tokenizer = tiny
    return token_extract.make_chunks(tokenizer, _texts(), ["a", "b", "c"] * 4, 40, 3, seed=1)


def _texts():
    sentences = TINY_TEXT.split(" . ")
    return [f"{i} {2 * i} " + " . ".join(f"{sentences[(i + j) % len(sentences)]} {j}" for j in range(4)) for i in range(12)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gap_accumulator_over_batches_equals_gap_on_all_positions(seed):
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(6, 20, 16)) + rng.normal(size=16) * 3
    next_ids = rng.integers(0, 12, size=(6, 20))
    next_ids[:, -1] = -100
    domain = [1, 2, 3]
    accumulator = token_extract.GapAccumulator(domain)
    for start in range(0, 6, 4):
        accumulator.update(torch.from_numpy(vectors[start : start + 4]), torch.from_numpy(next_ids[start : start + 4]))
    streamed, direct = accumulator.result(), dispersion_gap(vectors, next_ids, domain)
    assert streamed.n_domain == direct.n_domain and streamed.n_generic == direct.n_generic
    assert streamed.gap == pytest.approx(direct.gap, abs=1e-12)
    assert streamed.domain_dispersion == pytest.approx(direct.domain_dispersion, abs=1e-12)


def test_make_chunks_is_deterministic_per_domain_and_refuses_short_domains(tiny, chunks):
    _, tokenizer = tiny
    array, domains = chunks
    assert array.shape == (9, 40) and array.dtype == np.int64
    assert domains == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    again, _ = token_extract.make_chunks(tokenizer, _texts(), ["a", "b", "c"] * 4, 40, 3, seed=1)
    np.testing.assert_array_equal(array, again)
    other, _ = token_extract.make_chunks(tokenizer, _texts(), ["a", "b", "c"] * 4, 40, 3, seed=2)
    assert not np.array_equal(array, other)
    with pytest.raises(RaygeomError, match="fewer than the 50"):
        token_extract.make_chunks(tokenizer, ["short text"] * 3, None, 40, 50, seed=0)


def test_domain_token_ids(tiny):
    _, tokenizer = tiny
    digits = token_extract.domain_token_ids(tokenizer, "digits")
    assert sorted(tokenizer.convert_ids_to_tokens(digits)) == [str(d) for d in range(10)]
    words = sorted(
        {t.lstrip("Ġ") for t in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))) if len(t.lstrip("Ġ")) > 3}
    )[:2]
    chosen = token_extract.domain_token_ids(tokenizer, ",".join(words))
    assert {tokenizer.convert_ids_to_tokens(i).lstrip("Ġ") for i in chosen} == set(words)
    with pytest.raises(RaygeomError, match="not in the vocabulary: zzzq"):
        token_extract.domain_token_ids(tokenizer, "the,zzzq")


def test_chunk_statistics_match_hugging_face_hidden_states_and_loss(tiny, chunks, monkeypatch):
    model, tokenizer = tiny
    monkeypatch.setattr(token_extract, "LOGIT_CHUNK_ELEMENTS", 7 * len(tokenizer))  # many logit slices
    ids = torch.from_numpy(chunks[0][:4])
    layers = token_extract.token_layer_names(model)
    gaps = {name: token_extract.GapAccumulator(token_extract.domain_token_ids(tokenizer)) for name in layers}
    stats = token_extract.chunk_statistics(model, ids, layers, gaps)
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
        attention = {}

        def keep(module, args, output):
            attention["h"] = output[0]

        handle = model_surgery.last_attention(model).register_forward_hook(keep)
        model(input_ids=ids)
        handle.remove()
    hidden = out.hidden_states
    reference = {
        "embed": hidden[0],
        "block_00": hidden[1],
        "block_01": hidden[2],
        "final_norm": hidden[-1],
        "attn_last": attention["h"],
    }
    for name, h in reference.items():
        np.testing.assert_allclose(stats.token_dispersion[name], token_dispersion(h), atol=1e-5)
        np.testing.assert_allclose(stats.pooled[name], h[:, 1:].mean(1).numpy(), atol=1e-5)
    assert stats.n_predicted == 39
    per_chunk = [torch.nn.functional.cross_entropy(out.logits[i, :-1], ids[i, 1:]).item() for i in range(4)]
    np.testing.assert_allclose(stats.nll, per_chunk, atol=1e-5)
    direct = dispersion_gap(hidden[-1][:, :-1], ids[:, 1:], token_extract.domain_token_ids(tokenizer))
    assert gaps["final_norm"].result().gap == pytest.approx(direct.gap, abs=1e-9)


def test_token_features_are_positions_with_a_next_token(tiny, chunks):
    model, _ = tiny
    ids = torch.from_numpy(chunks[0][:2])
    features, next_tokens, logprob = token_extract.token_features(model, ids, ["block_01", "attn_last"])
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    np.testing.assert_allclose(features["block_01"], out.hidden_states[2][:, :-1].reshape(-1, 64).numpy(), atol=1e-5)
    np.testing.assert_array_equal(next_tokens, ids[:, 1:].reshape(-1).numpy())
    expected = torch.log_softmax(out.logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).reshape(-1).double().numpy()
    np.testing.assert_allclose(logprob, expected, atol=1e-4)
    assert dispersion(features["attn_last"]) > 0


def test_attention_sub_layer_path_for_llama_and_gemma():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    small = dict(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    llama = LlamaForCausalLM(LlamaConfig(**small))
    gemma = Gemma3ForCausalLM(Gemma3TextConfig(**small, head_dim=8))
    for model in (llama, gemma):
        assert model_surgery.last_attention(model) is model.model.layers[-1].self_attn
        stats = token_extract.chunk_statistics(model, torch.randint(0, 64, (2, 12)), token_extract.token_layer_names(model))
        assert set(stats.token_dispersion) == set(token_extract.token_layer_names(model))
        assert np.isfinite(stats.nll).all()
