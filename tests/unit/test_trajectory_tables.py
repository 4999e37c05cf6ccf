"""The trajectory job's pure parts: the checkpoint schedule (against Pythia's published one), the checkpoint
table and select-vs-perplexity agreement on planted values, layer picks and the organisation summary."""

import numpy as np
import pytest
from scipy.stats import spearmanr

from raygeom.analyses.train import checkpoint_steps
from raygeom.errors import RaygeomError
from raygeom.jobs.trajectory import agreement, checkpoint_table, organisation_summary, pick_layers
from raygeom.sources.revisions import PYTHIA_STEPS


def test_schedule_scaled_to_pythia_is_pythias_schedule():
    assert checkpoint_steps(143_000, 1000) == PYTHIA_STEPS  # step0, 1, 2, 4, ..., 512, then every 1000


def test_schedule_of_a_short_run():
    assert checkpoint_steps(2000, 250) == (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 750, 1000, 1250, 1500, 1750, 2000)
    assert checkpoint_steps(100, 30) == (0, 1, 2, 4, 8, 16, 32, 64, 90, 100)  # the last step is always saved
    assert checkpoint_steps(5, 1, log_until=2) == (0, 1, 2, 3, 4, 5)
    with pytest.raises(RaygeomError):
        checkpoint_steps(100, 0)


def _ranking(gaps, perplexities):
    rows = [
        {
            "model": "m",
            "revision": f"step{s}",
            "gap": g,
            "domain_dispersion": 0.5,
            "generic_dispersion": 0.5 - g,
            "n_domain": 10,
            "perplexity": p,
        }
        for s, g, p in zip((0, 1, 2, 4, 8, 600, 700), gaps, perplexities)
    ]
    for rank, row in enumerate(sorted(rows, key=lambda r: -r["gap"]), 1):
        row["rank"] = rank
    return rows


def test_checkpoint_table_ranks_by_the_trainers_perplexity_and_agreement_matches_scipy():
    gaps = [0.01, 0.05, 0.03, 0.08, 0.07, 0.10, 0.09]
    chunk_ppl = [900, 500, 300, 200, 150, 100, 110]
    trainer = [
        {"revision": f"step{s}", "heldout_perplexity": p}
        for s, p in zip((0, 1, 2, 4, 8, 600, 700), (950, 520, 310, 190, 160, 95, 120))
    ]
    steps = {f"step{s}": s for s in (0, 1, 2, 4, 8, 600, 700)}
    rows = checkpoint_table(_ranking(gaps, chunk_ppl), trainer, steps, {"step700": "same weights as step600"}, {"corpus": "x"})
    assert [r["step"] for r in rows] == [0, 1, 2, 4, 8, 600, 700]
    assert {r["perplexity_source"] for r in rows} == {"trainer"}
    assert [r["perplexity_rank"] for r in rows] == [7, 6, 5, 4, 3, 1, 2]
    assert rows[-1]["weights_flag"] == "same weights as step600" and rows[0]["corpus"] == "x"
    summary = agreement(rows, late_from=4, n_boot=300, seed=0)
    ppl = np.array([950, 520, 310, 190, 160, 95, 120])
    assert summary[0]["spearman"] == pytest.approx(spearmanr(gaps, -ppl)[0])
    assert summary[1]["n"] == 4 and summary[1]["spearman"] == pytest.approx(spearmanr(gaps[3:], -ppl[3:])[0])
    assert summary[0]["select_pick"] == "step600" and summary[0]["pick_is_best"] and summary[0]["pick_perplexity_rank"] == 1
    # 7 checkpoints: no interval (too few points), the exact permutation p-value instead, from an enumeration here
    import itertools
    import math

    assert all(math.isnan(summary[0][k]) for k in ("fisher_lo", "fisher_hi", "boot_lo", "boot_hi"))
    observed = abs(spearmanr(gaps, -ppl)[0])
    perms = [abs(spearmanr(gaps, -ppl[list(o)])[0]) for o in itertools.permutations(range(7))]
    assert summary[0]["p_perm"] == pytest.approx(np.mean(np.array(perms) >= observed - 1e-9))


def test_without_trainer_evaluations_the_chunk_perplexity_is_the_target():
    rows = checkpoint_table(_ranking([0.1, 0.2, 0.3, 0.4], [40, 30, 20, 10]), [], {}, {}, {})
    assert {r["perplexity_source"] for r in rows} == {"chunks"} and [r["perplexity_rank"] for r in rows] == [4, 3, 2, 1]


def test_layer_picks_and_when_organisation_appears():
    layers = ["embed", *[f"block_{i:02d}" for i in range(6)], "final_norm"]
    picked = pick_layers(layers)
    assert picked == {"early": "block_00", "middle": "block_03", "late": "block_05", "final": "final_norm"}
    z = [{"layer": "block_03", "step": s, "z": v} for s, v in zip((0, 1, 2, 4, 8), (0.1, 1.0, 4.0, 8.0, 6.0))]
    (summary,) = organisation_summary(z, {"middle": "block_03"})
    assert summary["first_organised_step"] == 2
    assert (summary["peak_step"], summary["half_peak_step"], summary["z_last"], summary["drop_from_peak"]) == (4, 2, 6.0, 2.0)
