import numpy as np
import pytest

from raygeom.analyses.converge import depth_matched
from raygeom.analyses.diagnose import diagnostics_markdown
from raygeom.analyses.diagnostics import DiagnosticsParams
from raygeom.errors import RaygeomError
from raygeom.sources.corpus import Corpus, truncate_words


def test_truncate_words_cuts_texts_not_labels_and_changes_the_fingerprint():
    corpus = Corpus("c", ["one two three four", "five six"], ["x", "y"])
    cut = truncate_words(corpus, 3)
    assert cut.texts == ["one two three", "five six"] and cut.labels == ["x", "y"]
    assert cut.fingerprint() != corpus.fingerprint()
    assert truncate_words(corpus, None) is corpus
    with pytest.raises(RaygeomError):
        truncate_words(corpus, 0)


def cell(a, b, depth_a, depth_b):
    return {
        "layer_a": a,
        "layer_b": b,
        "relative_depth_a": depth_a,
        "relative_depth_b": depth_b,
        "layer_index_a": int(depth_a * 4),
        "layer_index_b": int(depth_b * 2),
    }


def test_depth_matching_pairs_each_layer_of_the_shallower_model_with_the_nearest_depth():
    depths_a, depths_b = [0, 0.25, 0.5, 0.75, 1.0], [0, 0.5, 1.0]
    rows = [cell(f"a{i}", f"b{j}", da, db) for i, da in enumerate(depths_a) for j, db in enumerate(depths_b)]
    picked = [(r["layer_a"], r["layer_b"]) for r in depth_matched(rows)]
    assert picked == [("a0", "b0"), ("a2", "b1"), ("a4", "b2")]


def test_markdown_counts_restoration_and_probe_split():
    rows = []
    for i, (z0, z1) in enumerate([(-5.0, 3.0), (-3.0, -4.0), (1.0, 2.5)]):
        rows.append(
            {
                "model": "m",
                "revision": "main",
                "layer": f"l{i}",
                "layer_index": i,
                "relative_depth": i / 2,
                "n": 10,
                "d": 8,
                "k": 2,
                "z_ccr0": z0,
                "z_ccr1": z1,
                "rankme": 5.0 + i,
                "alpha_req": 1.0,
                "condition_number": 10.0,
                "isotropy": 0.9,
                "pc1_readout_share": 0.5,
                "pc1_readout_chance": 0.25,
                "pc1_variance_fraction": 0.3,
                "probe_accuracy": [0.9, 0.8, 0.6][i],
                "probe_chance": 0.2,
                "loss_share_spearman": np.nan,
            }
        )
    text = diagnostics_markdown(rows, (0, 1), DiagnosticsParams(k=2, ccr_ranks=(0, 1)))
    assert "| 0 | 0 | 2 | -3.0 | -5.0 (l0) | +1.0 (l2) |" in text
    assert "| 1 | 2 | 1 | +2.5 | -4.0 (l1) | +3.0 (l0) |" in text
    assert "mean 0.800 over the 1 layers with z < -2 at CCR-1, 0.750 over the other 2" in text
