"""One canonical form per setting: k_per_d absent or 0 is one value, r given as 1 or [1] is one value, and a store
written before keeps its unit keys (so its rows are found again, not recomputed)."""

import pyarrow as pa
import pytest

from raygeom.analyses import registry
from raygeom.analyses.pga import pga_unit_key
from raygeom.params import PGAParams, canonical_rows

# Unit keys of the default settings on extraction "extraction0", layer block_03, as the code wrote them before settings
# were made canonical (computed from commit ac2569b); a change here would make every existing store recompute.
# pc1 and sample_dispersion have since moved to version 2 (bounded intervals): their keys are checked at version 1.
# spectral gained the settings of its intervals (version 3), so its units are new ones: its old key is not checked.
VERSION_BEFORE = {"pc1": 1, "sample_dispersion": 1}
KEYS_BEFORE = {
    "pc1": "6bfe910275714984957a",
    "pga": "c997b1ae80488007a6ac",
    "probe": "97e107d3a1e02b2597a9",
    "sample_dispersion": "a0a5a4ad4b5707b38505",
    "twonn": "c45b3010423bca2647c9",
}


def test_unit_keys_of_the_default_settings_are_the_ones_stores_hold(monkeypatch):
    for name, version in VERSION_BEFORE.items():
        monkeypatch.setattr(type(registry.get(name)), "version", version)
    pooled = {n: a for n, a in registry.analyses().items() if a.extraction == "pooled" and n in KEYS_BEFORE}
    assert set(pooled) == set(KEYS_BEFORE) and "spectral" in registry.analyses()
    for name, analysis in pooled.items():
        assert analysis.unit_key("extraction0", "block_03", analysis.Params()) == KEYS_BEFORE[name], name
    assert pga_unit_key("extraction0", "block_03", PGAParams()) == KEYS_BEFORE["pga"]


@pytest.mark.parametrize("spelling", [{"k_per_d": None}, {"k_per_d": 0.0}, {"k_per_d": 0}, {}])
def test_k_per_d_absent_or_zero_is_one_setting(spelling):
    params = PGAParams.from_mapping(spelling)
    assert params == PGAParams() and params.k_per_d == 0.0
    assert pga_unit_key("e", "block_01", params) == pga_unit_key("e", "block_01", PGAParams())
    pc1 = registry.get("pc1")
    assert pc1.unit_key("e", "block_01", pc1.Params.from_mapping(spelling)) == pc1.unit_key("e", "block_01", pc1.Params())


def test_r_given_as_one_value_or_a_list_of_one_is_one_setting(tmp_path):
    from raygeom.jobspec import load_job

    assert PGAParams(r=[1]) == PGAParams(r=1) == PGAParams.from_mapping({"r": [1]})
    jobs = {}
    for name, section in (
        ("scalar", "[pga]\nr = 1\n"),
        ("listed", "[pga]\nr = [1]\n"),
        ("grid", "[analyses.pga]\nr = [1]\n"),
        ("grid-scalar", "[analyses.pga]\nr = 1\n"),
    ):
        path = tmp_path / f"{name}.toml"
        path.write_text(f"[[models]]\nid = 'smollm2'\n{section}")
        jobs[name] = [p.params for p in load_job(path).planned()]
    assert all(planned == [PGAParams(r=1)] for planned in jobs.values()), jobs
    with pytest.raises(Exception, match="r must be an integer"):
        PGAParams(r=[0, 1])


def test_rows_from_before_a_setting_and_after_it_are_one_series():
    rows = canonical_rows([{"k": 100, "r": 1}, {"k": 100, "r": 1, "k_per_d": None}, {"k": 100, "r": 1, "k_per_d": 0.0}])
    assert [row["k_per_d"] for row in rows] == [0.0, 0.0, 0.0]
    assert canonical_rows([{"k": 100}]) == [{"k": 100}]  # a table that never had the setting is left as it is


def test_the_report_merges_a_table_without_k_per_d_into_the_unit_rows_and_adds_the_revisions_step(tmp_path):
    from raygeom.report.html import pga_rows
    from raygeom.store.tree import Store, atomic_write_table

    row = {
        "model": "m",
        "revision": "step0",
        "layer": "block_01",
        "k": 8,
        "r": 1,
        "n": 40,
        "n_null": 20,
        "seed": 0,
        "rho_readout": 0.5,
        "z": 3.0,
        "unit_key": "u1",
    }
    Store(tmp_path).write_result("pga", "u1", [{**row, "k_per_d": 0.0}])
    atomic_write_table(pa.Table.from_pylist([row]), tmp_path / "results" / "pga.parquet")  # from before k_per_d
    revision = {"model": "m", "revision": "step0", "step": 0, "weights_flag": "same weights as step1"}
    atomic_write_table(pa.Table.from_pylist([revision]), tmp_path / "results" / "revisions.parquet")  # a sweep's
    merged = pga_rows(tmp_path)
    assert len(merged) == 1 and merged[0]["k_per_d"] == 0.0
    assert merged[0]["step"] == 0 and merged[0]["weights_flag"] == "same weights as step1"
