"""Pure helpers of push-away training: data preparation and the over-seeds summary."""

import numpy as np
import pytest

from raygeom.analyses import train
from raygeom.testing import TINY_TEXT


def test_tokenizer_is_deterministic_and_sequences_are_full_and_eos_joined():
    texts = [TINY_TEXT, "the team won . " * 3, "new phones 42"]
    first, second = train.train_tokenizer(texts, 300), train.train_tokenizer(texts, 300)
    assert first.get_vocab() == second.get_vocab()
    seqs = train.sequences(first, texts, 16)
    stream = []
    for ids in first(texts, add_special_tokens=False)["input_ids"]:
        stream += ids + [first.eos_token_id]
    assert seqs.shape == (len(stream) // 16, 16)
    np.testing.assert_array_equal(seqs.reshape(-1), stream[: seqs.size])


def test_summary_pairs_each_seed_with_its_plain_run():
    rows = [{"lam": 0.0, "seed": s, "heldout_perplexity": 10.0 + s, "heldout_dispersion": 0.3} for s in range(3)]
    rows += [{"lam": 0.1, "seed": s, "heldout_perplexity": 9.5 + s + 0.1 * s, "heldout_dispersion": 0.5} for s in range(3)]
    plain, pushed = train.summarise(rows)
    assert plain["paired_delta_mean"] == 0.0 and plain["heldout_perplexity_mean"] == pytest.approx(11.0)
    assert pushed["paired_delta_mean"] == pytest.approx(np.mean([-0.5, -0.4, -0.3]))
    assert pushed["paired_delta_std"] == pytest.approx(np.std([-0.5, -0.4, -0.3], ddof=1))
    assert pushed["heldout_dispersion_mean"] == pytest.approx(0.5) and pushed["n_seeds"] == 3


def test_run_key_ignores_placement_but_not_the_objective():
    base = train.TrainSettings()
    assert base.key() == train.TrainSettings(cpus_per_worker=0.5).key()
    assert base.key() != base.with_run(lam=0.1, seed=0).key()
    assert base.key() != train.TrainSettings(workers=2).key()
