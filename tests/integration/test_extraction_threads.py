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
        ("gemma3_text", tiny_bos_tokenizer("left"), lambda n: tiny_causal_lm("gemma3_text", n, seed=1)),
    ]:
        model(len(tokenizer)).save_pretrained(root / family)
        tokenizer.save_pretrained(root / family)
        made[family] = root / family
    return made


def texts():
    from raygeom.testing import varied_text

    # the sweep tests' lines (on which a tiny GPT-NeoX's z moved), and longer ones
    return [f"number {i} {varied_text(i)}" for i in range(N_TEXTS // 2)] + [
        f"number {i} {varied_text(i)} " * (1 + i % 3) for i in range(N_TEXTS // 2)
    ]


def pooled_with(directory, threads: int):
    from raygeom.replica.replica import Replica
    from raygeom.replica.settings import ExtractionSettings
    from raygeom.sources.models import resolve_model

    replica = Replica(resolve_model(str(directory)), threads=threads)
    settings = ExtractionSettings(seq_len=32, batch_size=TEXTS_PER_BATCH)
    parts = [texts()[i : i + TEXTS_PER_BATCH] for i in range(0, N_TEXTS, TEXTS_PER_BATCH)]
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
                        np.testing.assert_array_equal(
                            batch.pooled[layer], want.pooled[layer], err_msg=f"{threads} threads, batch {index}, {layer}"
                        )
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


def token_work_with(directory, threads: int):
    from raygeom.replica.replica import Replica
    from raygeom.sources.models import resolve_model

    replica = Replica(resolve_model(str(directory)), threads=threads)
    layers = replica.describe()["token_layers"]
    chunks = np.random.default_rng(0).integers(1, replica.describe()["vocab_size"], (4 * TEXTS_PER_BATCH, 24))
    parts = [chunks[i : i + TEXTS_PER_BATCH] for i in range(0, len(chunks), TEXTS_PER_BATCH)]
    statistics = replica.statistics_batches(parts, layers, None)
    return (
        statistics,
        [replica.statistics_batches([part], layers, None)[0] for part in parts[:2]],
        replica.features_batches(parts, layers),
        [replica.features_batches([part], layers)[0] for part in parts[:2]],
    )


def assert_same(got, want, where: str) -> None:
    if isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for key in want:
            assert_same(got[key], want[key], f"{where}/{key}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for index, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, f"{where}[{index}]")
    else:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=where)


@pytest.mark.parametrize("family", ["gpt_neox", "gemma3_text"])
def test_token_level_work_gives_the_same_bits_with_any_number_of_threads(model_dirs, family):
    """Dispersion (token dispersion, pooled vectors, NLL) and kNN-LM features, a batch at a time or several at once."""
    import torch

    before = torch.get_num_threads()
    try:
        statistics, one_by_one, features, features_one_by_one = token_work_with(model_dirs[family], 1)
        assert_same(one_by_one, statistics[:2], "statistics one by one")
        assert_same(features_one_by_one, features[:2], "features one by one")
        for threads in (2, 3):
            got = token_work_with(model_dirs[family], threads)
            assert_same(got[0], statistics, f"statistics, {threads} threads")
            assert_same(got[2], features, f"features, {threads} threads")
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("family", ["gpt_neox", "llama"])
def test_the_readout_basis_is_the_same_with_any_number_of_threads(model_dirs, family, monkeypatch):
    import torch

    from raygeom.replica import replica as replica_module
    from raygeom.replica.replica import Replica
    from raygeom.sources import model_surgery
    from raygeom.sources.models import resolve_model

    monkeypatch.setattr(replica_module, "READOUT_BLOCK_ROWS", 64)  # several blocks of the tiny vocabulary
    before = torch.get_num_threads()
    try:
        bases = []
        for threads in (1, 2, 3):
            replica = Replica(resolve_model(str(model_dirs[family])), threads=threads)
            bases.append(replica.readout_basis(8))
        for basis, values in bases[1:]:
            np.testing.assert_array_equal(basis, bases[0][0])
            np.testing.assert_array_equal(values, bases[0][1])
        # and it is W_U's top right singular vectors (numpy's SVD of the float64 matrix, signs aligned)
        w_u = model_surgery.unembedding(replica.model).detach().double().numpy()
        _, singular, vt = np.linalg.svd(w_u, full_matrices=False)
        np.testing.assert_allclose(bases[0][1], singular[:8], rtol=1e-10)
        np.testing.assert_allclose(np.abs(np.sum(bases[0][0] * vt[:8].T, axis=0)), 1.0, atol=1e-8)
    finally:
        torch.set_num_threads(before)


def test_extracting_leaves_torch_threads_as_they_were_for_threads_started_later(model_dirs):
    import threading

    import torch

    import raygeom
    from raygeom.replica.settings import ExtractionSettings

    model, tokenizer = raygeom.load_model(str(model_dirs["llama"]))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        raygeom.layer_activations(model, tokenizer, texts()[:16], ExtractionSettings(seq_len=32, batch_size=8))
        seen = []
        later = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        later.start()
        later.join()
        assert torch.get_num_threads() == 2 and seen == [2]
    finally:
        torch.set_num_threads(before)
