"""An extraction's numbers do not depend on the CPUs its replica got.

A sweep gives a lone CPU replica every CPU of its node and several replicas one each, so the same revision was
extracted with 1 or 2 torch threads depending on how many revisions were queued. Torch's CPU kernels split one
batch across threads in ways that change its last bits (measured here: the tiny GPT-NeoX's attention, the tiny
Llama's and Gemma's blocks), so the z of a layer changed in its 7th digit with the split of the sweep. Batches now run
on one torch thread each, several at once."""

import numpy as np
import pytest

pytestmark = pytest.mark.integration
TEXTS_PER_BATCH, N_TEXTS = 8, 80


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from raygeom.testing import tiny_bos_tokenizer, tiny_causal_lm, tiny_gpt_neox, tiny_tokenizer

    root = tmp_path_factory.mktemp("threads")
    made = {}
    for family, tokenizer, model in [
            ("gpt_neox", tiny_tokenizer(), lambda n: tiny_gpt_neox(n, 11, hidden_size=32, layers=2)),
            ("llama", tiny_bos_tokenizer("left"), lambda n: tiny_causal_lm("llama", n, seed=1)),
            ("gemma3_text", tiny_bos_tokenizer("left"), lambda n: tiny_causal_lm("gemma3_text", n, seed=1))]:
        model(len(tokenizer)).save_pretrained(root / family)
        tokenizer.save_pretrained(root / family)
        made[family] = root / family
    return made


def texts():
    from raygeom.testing import varied_text

    # the sweep tests' lines (on which a tiny GPT-NeoX's z moved), and longer ones
    return [f"number {i} {varied_text(i)}" for i in range(N_TEXTS // 2)] + [
        f"number {i} {varied_text(i)} " * (1 + i % 3) for i in range(N_TEXTS // 2)]


def pooled_with(directory, threads: int):
    from raygeom.replica.replica import Replica
    from raygeom.replica.settings import ExtractionSettings
    from raygeom.sources.models import resolve_model

    replica = Replica(resolve_model(str(directory)), threads=threads)
    settings = ExtractionSettings(seq_len=32, batch_size=TEXTS_PER_BATCH)
    parts = [texts()[i:i + TEXTS_PER_BATCH] for i in range(0, N_TEXTS, TEXTS_PER_BATCH)]
    one_by_one = [replica.pooled(part, settings, None, nll=True) for part in parts]
    assert replica.run_batches(0, parts, settings, replica.describe()["layers"], True) == N_TEXTS
    return one_by_one, [replica.held[i] for i in range(len(parts))]


@pytest.mark.parametrize("family", ["gpt_neox", "llama", "gemma3_text"])
def test_a_replica_extracts_the_same_bits_with_any_number_of_threads(model_dirs, family):
    import torch

    before = torch.get_num_threads()
    try:
        reference, _ = pooled_with(model_dirs[family], 1)
        for threads in (2, 3):
            one_by_one, together = pooled_with(model_dirs[family], threads)
            for got in (one_by_one, together):
                for index, (batch, want) in enumerate(zip(got, reference)):
                    for layer in want.pooled:
                        np.testing.assert_array_equal(batch.pooled[layer], want.pooled[layer],
                                                      err_msg=f"{threads} threads, batch {index}, {layer}")
                    np.testing.assert_array_equal(batch.nll, want.nll)
    finally:
        torch.set_num_threads(before)


def test_the_library_extracts_what_the_replica_does_with_any_torch_threads(model_dirs):
    import torch

    import raygeom
    from raygeom.replica.settings import ExtractionSettings

    model, tokenizer = raygeom.load_model(str(model_dirs["llama"]))
    settings = ExtractionSettings(seq_len=32, batch_size=TEXTS_PER_BATCH)
    reference, _ = pooled_with(model_dirs["llama"], 1)
    before = torch.get_num_threads()
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            layers, nll = raygeom.layer_activations(model, tokenizer, texts(), settings)
            for name, vectors in layers.items():
                np.testing.assert_array_equal(vectors, np.concatenate([b.pooled[name] for b in reference]), err_msg=name)
            np.testing.assert_array_equal(nll, np.concatenate([b.nll for b in reference]))
    finally:
        torch.set_num_threads(before)
