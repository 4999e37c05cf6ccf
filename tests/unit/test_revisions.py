"""Pythia revisions and sizes as data, integrity checks, collapse zones and sweep sizing: pure logic."""

import math

import pytest

from raygeom.errors import RaygeomError
from raygeom.report.pga_sweep import collapse_zones
from raygeom.report.sweep_plots import step_edges as _step_edges
from raygeom.sources import revisions as pythia
from raygeom.sources.layers import layer_names, select_layers


def test_the_154_pythia_revisions():
    revs = pythia.PYTHIA_REVISIONS
    assert len(revs) == 154 and len(set(revs)) == 154
    assert revs[:12] == (
        "step0",
        "step1",
        "step2",
        "step4",
        "step8",
        "step16",
        "step32",
        "step64",
        "step128",
        "step256",
        "step512",
        "step1000",
    )
    assert revs[-1] == "step143000" and revs[-2] == "step142000"
    steps = [pythia.step_of(r) for r in revs]
    assert steps == sorted(steps)
    assert all(b - a == 1000 for a, b in zip(steps[11:], steps[12:]))
    assert pythia.step_of("main") == 143_000 and pythia.step_of("v0") is None


def test_sizes_table_matches_the_pythia_architectures():
    table = {name: (s.d, s.n_blocks) for name, s in pythia.PYTHIA_SIZES.items()}
    assert table == {
        "14m": (128, 6),
        "31m": (256, 6),
        "70m": (512, 6),
        "160m": (768, 12),
        "410m": (1024, 24),
        "1b": (2048, 16),
        "1.4b": (2048, 24),
        "2.8b": (2560, 32),
        "6.9b": (4096, 32),
        "12b": (5120, 36),
    }
    params = [s.params for s in pythia.PYTHIA_SIZES.values()]
    assert params == sorted(params)
    assert pythia.size_of("EleutherAI/pythia-1.4b-deduped").name == "1.4b"
    assert pythia.size_of("EleutherAI/pythia-70m").n_layers == 8
    assert pythia.size_of("EleutherAI/gpt-j-6b") is None
    assert pythia.repo_id("410m", deduped=True) == "EleutherAI/pythia-410m-deduped"
    with pytest.raises(RaygeomError, match="unknown Pythia size"):
        pythia.repo_id("7b")


@pytest.mark.parametrize(
    "selection, count, first, last",
    [
        ("all", 154, "step0", "step143000"),
        ("log", 11, "step0", "step512"),
        ("linear", 143, "step1000", "step143000"),
        ("step1000:step3000", 3, "step1000", "step3000"),
        ("step0:step4", 4, "step0", "step4"),
        ("main", 1, "main", "main"),
    ],
)
def test_revision_selections(selection, count, first, last):
    chosen = pythia.expand_revisions(selection)
    assert (len(chosen), chosen[0], chosen[-1]) == (count, first, last)


def test_every_n_keeps_the_log_steps_and_the_final_one():
    chosen = pythia.expand_revisions("every:10")
    assert chosen[:11] == [f"step{s}" for s in pythia.LOG_STEPS]
    assert chosen[11:] == [f"step{s}" for s in range(10_000, 143_000, 10_000)] + ["step143000"]
    assert pythia.expand_revisions(["log", "step512", "step1000"])[-2:] == ["step512", "step1000"]


@pytest.mark.parametrize("bad", ["every:0", "every:x", "step5000:step1000", "latest", "stepX:step1"])
def test_bad_revision_selections_fail_with_a_message(bad):
    with pytest.raises(RaygeomError):
        pythia.expand_revisions(bad)


def test_gpus_per_replica():
    sizes = pythia.PYTHIA_SIZES
    assert pythia.gpus_per_model(sizes["1b"].params, 80, 8) == 0.5  # two revisions share a GPU: one loads, one runs
    assert pythia.gpus_per_model(sizes["12b"].params, 80, 8) == 0.5
    assert pythia.gpus_per_model(sizes["6.9b"].params, 24, 8) == 1.0
    assert pythia.gpus_per_model(sizes["12b"].params, 24, 8) == 2.0  # sharded with device_map="auto"
    assert pythia.gpus_per_model(sizes["12b"].params, 16, 4) == 2.0
    with pytest.raises(RaygeomError, match="more than"):
        pythia.gpus_per_model(sizes["12b"].params, 8, 2)


def test_duplicate_groups_find_revisions_serving_the_same_weights():
    fingerprints = {"step0": "a", "step1": "a", "step2": "b", "step143000": "f", "step4": "f", "step8": "f", "step16": "c"}
    assert pythia.duplicate_groups(fingerprints) == [["step0", "step1"], ["step4", "step8", "step143000"]]
    assert pythia.duplicate_groups({"step0": "a", "step1": "b"}) == []


def test_shared_tensors_find_a_mixed_checkpoint_but_not_distinct_ones():
    final = {f"layer{i}.weight": f"final{i}" for i in range(10)}
    mixed = {**{f"layer{i}.weight": f"final{i}" for i in range(3)}, **{f"layer{i}.weight": f"mid{i}" for i in range(3, 10)}}
    other = {f"layer{i}.weight": f"other{i}" for i in range(10)}
    found = pythia.shared_tensors({"step143000": final, "step50000": mixed, "step49000": other})
    assert found["step50000"] == ("step143000", 0.3)
    assert found["step143000"] == ("step50000", 0.3)
    assert "step49000" not in found
    assert pythia.shared_tensors({"step1": final, "step2": dict(final)}) == {}  # identical is duplicate_groups' job


def test_known_bad_notes():
    assert "#83" in pythia.known_bad_note("EleutherAI/pythia-70m", "step1")
    assert "#206" in pythia.known_bad_note("EleutherAI/pythia-12b", "step58000")
    assert "#195" in pythia.known_bad_note("EleutherAI/pythia-2.8b-deduped", "step256")
    assert pythia.known_bad_note("EleutherAI/pythia-2.8b", "step2000") is None
    assert pythia.known_bad_note("EleutherAI/pythia-70m", "step58000") is None


def test_layer_names_and_selection_match_model_surgery():
    assert layer_names(3) == ["embed", "block_00", "block_01", "block_02", "final_norm"]
    assert layer_names(36)[-2:] == ["block_35", "final_norm"] and len(layer_names(36)) == 38
    assert layer_names(120)[1] == "block_000"
    # Integers count blocks (embed and final_norm are named): the old index rule read "0,-1" as embed, final_norm.
    assert select_layers(layer_names(6), "embed,0,-1,2:4,final_norm") == [
        "embed",
        "block_00",
        "block_02",
        "block_03",
        "block_05",
        "final_norm",
    ]


def _profile(z_by_layer, model="m", revision="step1000"):
    n = len(z_by_layer)
    return [
        {"model": model, "revision": revision, "layer": f"L{i}", "layer_index": i, "relative_depth": i / (n - 1), "z": z}
        for i, z in enumerate(z_by_layer)
    ]


def test_collapse_zone_is_late_non_final_layers_below_threshold_after_positive_early_ones():
    # 10 layers: early positive, layers 6 and 7 collapse, the final two recover (as in the paper's small models)
    zones = collapse_zones(_profile([0.5, 5, 6, 7, 6, 3, -1.5, -0.5, 4, 8]))
    assert zones[0]["collapsed"] and zones[0]["zone_layers"] == "L6,L7"
    assert zones[0]["zone_start_depth"] == pytest.approx(6 / 9) and zones[0]["zone_min_z"] == -1.5
    assert not collapse_zones(_profile([0.5, 5, 6, 7, 6, 3, 2, 1, -4, -8]))[0]["collapsed"]  # only the final layers dip
    assert not collapse_zones(_profile([0.5, 1, 1.5, 1, 0, -1, -2, -1, 4, 8]))[0]["collapsed"]  # never positive early
    assert collapse_zones(_profile([0.5, 5, 6, 7, 6, 3, 1.5, 0.5, 4, 8]), threshold=2.0)[0]["zone_layers"] == "L6,L7"


def test_heatmap_cells_on_a_log_step_axis_have_positive_ordered_edges():
    edges = _step_edges([0, 1, 2, 4, 512, 1000, 2000, 143000])
    assert len(edges) == 9 and edges[0] > 0 and all(b > a for a, b in zip(edges, edges[1:]))
    assert math.isclose(edges[1], math.sqrt(1 * 2))  # between step0 (x=1) and step1 (x=2)


def test_collapse_zones_decide_on_the_interval_of_z_not_its_point():
    profile = _profile([0.5, 5, 6, 7, 6, 3, -1.5, -0.5, 4, 8])
    for row in profile:
        row.update(z_lo=row["z"] - 0.3, z_hi=row["z"] + 0.3)
    zones = collapse_zones(profile)[0]
    assert zones["collapsed"] and zones["zone_layers"] == "L6,L7"
    profile[7].update(z_lo=-1.0, z_hi=0.2)  # L7's interval reaches above 0: not shown to be low
    assert collapse_zones(profile)[0]["zone_layers"] == "L6"
    for row in profile[1:6]:
        row.update(z_lo=row["z"] - 10, z_hi=row["z"] + 10)  # no early layer is surely above 2
    assert not collapse_zones(profile)[0]["collapsed"]
