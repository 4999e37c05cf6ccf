"""The HTML report from synthetic stores: one file, plotly's JavaScript once, links only to the store's
Parquet files, the values a reader hovers are the rows' values, intervals drawn only where they exist."""

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from raygeom.errors import RaygeomError
from raygeom.report import html as report
from raygeom.report.profiles import _step_layer_heatmaps
from raygeom.store.tree import atomic_write_table
from tests.synthetic import pythia_grid_rows, write_pythia_grid_store

SIZES, REVISIONS = ["14m", "70m"], ["step0", "step512", "step1000", "step143000"]


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    root = write_pythia_grid_store(tmp_path_factory.mktemp("grid"), sizes=SIZES, revisions=REVISIONS, seed=3)
    return root, report.write_report(root)


def figures_of(root):
    return {s.anchor: s for s in report.build_sections(root)}


def heatmaps(section):
    """The (revision x layer) heatmaps of a section (after its depth profiles)."""
    return [fig for fig in section.figures if fig.data and fig.data[0].type == "heatmap"]


def test_one_file_with_plotly_inlined_once_and_no_outside_links(grid):
    import plotly.offline

    root, path = grid
    assert path == root / "report.html"
    text = path.read_text()
    assert text.count(plotly.offline.get_plotlyjs()[:300]) == 1
    text = text.replace(plotly.offline.get_plotlyjs(), "")  # the library's own strings (map attributions) are not links
    assert not re.search(r"<script[^>]+src=", text) and "<link" not in text and "<iframe" not in text
    assert text.count("Plotly.newPlot(") == len(SIZES) + 1 + len(SIZES)  # z by depth per model, all models, heatmaps
    hrefs = re.findall(r"href='([^']*)'", text)
    assert hrefs
    for href in hrefs:
        if href.startswith("#"):
            assert f"id='{href[1:]}'" in text, href
        else:
            assert href.endswith(".parquet") and "://" not in href and (path.parent / href).is_file(), href


def test_heatmap_cells_and_interval_marks_are_the_rows_values(grid):
    root, _ = grid
    rows = pythia_grid_rows(sizes=SIZES, revisions=REVISIONS, seed=3)
    sweep = heatmaps(figures_of(root)["pga"])
    assert len(sweep) == len(SIZES)
    for size, fig in zip(SIZES, sweep):
        heat = fig.data[0]
        expected = [r for r in rows if r["size"] == size]
        assert list(heat.x) == REVISIONS  # ordered by training step
        for r in expected:
            i, j = list(heat.y).index(r["layer"]), list(heat.x).index(r["revision"])
            assert heat.z[i][j] == r["z"]
            assert heat.customdata[i][j][0] == r["z_lo"] and heat.customdata[i][j][1] == r["z_hi"]
        marks = next(t for t in fig.data if t.name == "interval contains 0")
        crossing = {(r["revision"], r["layer"]) for r in expected if r["z_lo"] <= 0 <= r["z_hi"]}
        assert crossing and set(zip(marks.x, marks.y)) == crossing


def test_depth_profiles_have_a_band_per_line_when_intervals_exist(grid):
    root, _ = grid
    pga = figures_of(root)["pga"]
    first = pga.figures[0]
    lines = [t for t in first.data if t.mode == "lines+markers"]
    bands = [t for t in first.data if t.fill == "toself"]
    assert [t.name for t in lines] == REVISIONS
    assert len(bands) == len(lines) and {b.legendgroup for b in bands} == set(REVISIONS)  # one legend click hides both
    band = next(b for b in bands if b.legendgroup == "step1000")
    rows = sorted(
        (
            r
            for r in pythia_grid_rows(sizes=SIZES, revisions=REVISIONS, seed=3)
            if r["size"] == "14m" and r["revision"] == "step1000"
        ),
        key=lambda r: r["relative_depth"],
    )
    assert list(band.y) == pytest.approx([r["z_hi"] for r in rows] + [r["z_lo"] for r in rows][::-1])


def test_without_interval_columns_nothing_pretends_to_be_one(tmp_path):
    root = write_pythia_grid_store(tmp_path, sizes=["14m"], revisions=REVISIONS, intervals=False)
    sections = figures_of(root)
    assert not [t for fig in sections["pga"].figures for t in fig.data if getattr(t, "fill", None) == "toself"]
    assert not [t for fig in heatmaps(sections["pga"]) for t in fig.data if t.name == "interval contains 0"]
    assert "no interval columns" in sections["pga"].intro
    report.write_report(root)


def test_a_long_training_run_starts_with_a_few_revisions_shown_and_all_in_the_legend(tmp_path):
    from raygeom.sources.revisions import PYTHIA_REVISIONS

    root = write_pythia_grid_store(tmp_path, sizes=["14m"], intervals=False)
    lines = [t for t in figures_of(root)["pga"].figures[0].data if t.mode == "lines+markers"]
    assert len(lines) == len(PYTHIA_REVISIONS) == 154
    shown = [t.name for t in lines if t.visible is True]
    assert len(shown) == report.VISIBLE_REVISIONS and shown[0] == "step0" and shown[-1] == "step143000"
    assert all(t.visible == "legendonly" for t in lines if t.name not in shown)


def test_settings_table_has_one_run_per_distinct_setting():
    rows = [
        {"model": "m", "revision": f"step{s}", "layer": "embed", "k": k, "n_null": 100, "seed": 0, "z": 1.0}
        for k in (50, 100)
        for s in (0, 1000, 2000)
    ]
    runs = report.settings_runs(rows)
    assert sorted((r["k"], r["rows"], r["revision"]) for r in runs) == [
        (50, 3, "step0, step1000, step2000"),
        (100, 3, "step0, step1000, step2000"),
    ]


def test_two_settings_of_one_model_are_separate_lines(tmp_path):
    rows = pythia_grid_rows(sizes=["14m"], revisions=["step1000"], intervals=False)
    both = rows + [{**r, "k": 50, "unit_key": r["unit_key"] + "-k50", "z": r["z"] - 1} for r in rows]
    atomic_write_table(pa.Table.from_pylist(both), tmp_path / "results" / "pga.parquet")
    lines = [t for t in figures_of(tmp_path)["pga"].figures[0].data if t.mode == "lines+markers"]
    assert sorted(t.name for t in lines) == ["EleutherAI--pythia-14m, k=100", "EleutherAI--pythia-14m, k=50"]
    assert len({(t.line.dash, t.marker.symbol) for t in lines}) == 2  # one colour (one model): told apart by dash and marker


def test_unit_rows_and_the_job_table_are_merged_per_unit(tmp_path):
    rows = pythia_grid_rows(sizes=["14m"], revisions=["step1000"], intervals=False)
    for r in rows:
        atomic_write_table(pa.Table.from_pylist([r]), tmp_path / "results" / "pga" / f"{r['unit_key']}.parquet")
    atomic_write_table(pa.Table.from_pylist(rows[:3]), tmp_path / "results" / "pga.parquet")  # last job: 3 of them
    merged = report.pga_rows(tmp_path)
    assert len(merged) == len(rows)
    assert np.allclose(sorted(r["z"] for r in merged), sorted(r["z"] for r in rows))


def test_a_unit_file_copied_over_another_units_name_is_not_reported_twice(tmp_path):
    from raygeom.store.tree import Store, checksum_path

    rows = pythia_grid_rows(sizes=["14m"], revisions=["step1000"], intervals=False)
    store = Store(tmp_path)
    for r in rows:
        store.write_result("pga", r["unit_key"], r)
    a, b = (store.result_path("pga", r["unit_key"]) for r in rows[:2])
    b.write_bytes(a.read_bytes())
    checksum_path(b).write_bytes(checksum_path(a).read_bytes())
    merged = report.pga_rows(tmp_path)
    assert sorted(r["unit_key"] for r in merged) == sorted(r["unit_key"] for r in rows if r["unit_key"] != rows[1]["unit_key"])


def test_bad_stores_are_one_clear_error(tmp_path):
    with pytest.raises(RaygeomError, match="not a directory"):
        report.write_report(tmp_path / "missing")
    with pytest.raises(RaygeomError, match="nothing to report"):
        report.write_report(tmp_path)


def test_report_command_writes_the_file_and_fails_cleanly(grid, tmp_path):
    from typer.testing import CliRunner

    from raygeom.cli.root import app

    root, _ = grid
    done = CliRunner().invoke(app, ["report", str(root), "--out", str(tmp_path / "r.html")], env={"COLUMNS": "300"})
    assert done.exit_code == 0 and "r.html" in done.output and (tmp_path / "r.html").stat().st_size > 4_000_000
    # Links are relative to where the file is written, so they still reach the store's Parquet files.
    assert "href='../" in (tmp_path / "r.html").read_text() or str(Path(tmp_path).parent) in (tmp_path / "r.html").read_text()
    failed = CliRunner().invoke(app, ["report", str(tmp_path / "nowhere")])
    assert failed.exit_code == 2 and "Traceback" not in failed.output


def test_a_trajectory_store_gets_its_checkpoint_plots(tmp_path):
    from raygeom.jobs.trajectory import agreement, checkpoint_table, dispersion_by_step

    steps = {f"step{s}": s for s in (0, 1, 2, 4, 8, 16, 100, 200)}
    ranking = [
        {
            "model": "tiny",
            "revision": rev,
            "gap": 0.01 * i,
            "rank": len(steps) - i,
            "domain_dispersion": 0.5,
            "generic_dispersion": 0.5 - 0.01 * i,
            "n_domain": 9,
            "perplexity": 300.0 / (i + 1),
        }
        for i, rev in enumerate(steps)
    ]
    rows = checkpoint_table(ranking, [], steps, {}, {"corpus": "c", "seed": 0})
    layers = [
        {
            "model": "tiny",
            "revision": rev,
            "layer": layer,
            "layer_index": j,
            "relative_depth": j / 3,
            "token_dispersion": 0.1 * j + 0.001 * s,
            "sample_dispersion": 0.2,
            "perplexity": 10.0,
            "n_chunks": 6,
            "gap": 0.0,
        }
        for rev, s in steps.items()
        for j, layer in enumerate(["embed", "block_00", "block_01", "final_norm"])
    ]
    for name, table in (
        ("checkpoints", rows),
        ("agreement", agreement(rows, 8, 50, 0)),
        ("dispersion", dispersion_by_step(layers, steps)),
    ):
        atomic_write_table(pa.Table.from_pylist(table), tmp_path / "results" / f"trajectory_{name}.parquet")
    section = figures_of(tmp_path)["trajectory"]
    dispersion_fig, gap_fig = section.figures
    assert [t.name for t in dispersion_fig.data] == ["embed", "block_00", "block_01", "final_norm"]
    final = next(t for t in dispersion_fig.data if t.name == "final_norm")
    assert list(final.x) == [s + 1 for s in steps.values()]  # log axis: step + 1
    assert list(final.y) == pytest.approx([0.3 + 0.001 * s for s in steps.values()])
    assert list(gap_fig.data[0].y) == pytest.approx([r["gap"] for r in ranking])
    assert "spearman" in "".join(section.tables)
    report.write_report(tmp_path)


def test_an_unreadable_table_is_named_in_the_report_not_silently_dropped(tmp_path):
    from typer.testing import CliRunner

    from raygeom.cli.root import app

    root = write_pythia_grid_store(tmp_path, sizes=["14m"], revisions=REVISIONS, intervals=False)
    damaged = root / "results" / "pga.parquet"
    damaged.write_bytes(b"not parquet, and no checksum")
    path = report.write_report(root)
    assert "could not be read and are not in this report" in path.read_text() and "results/pga.parquet" in path.read_text()
    (root / "results" / "revisions.parquet").write_bytes(b"damaged too")
    (root / "sweep" / "manifest.json").unlink()
    with pytest.raises(RaygeomError, match="2 file\\(s\\) could not be read"):
        report.write_report(root)
    done = CliRunner().invoke(app, ["report", str(root)])
    assert done.exit_code == 2 and "Traceback" not in done.output


def test_a_diagnose_store_is_drawn_by_its_analyses_sections_each_once_with_the_intervals_its_rows_carry(tmp_path):
    """`raygeom diagnose` leaves unit rows of pga (one per CCR rank), spectral and probe, its loss-geometry rows and a
    merged diagnostics_layers table: each analysis is drawn once, in its own declared section; the diagnostics
    analysis's section holds what only it measures (loss beside readout share)."""
    from raygeom.store.tree import Store

    store = Store(tmp_path)
    where = [{"model": "m", "revision": "main", "layer": f"L{i}", "layer_index": i, "relative_depth": i / 3} for i in range(4)]
    for i, at in enumerate(where):
        store.write_result("pga", f"p1-{i}", {**at, "k": 8, "r": 1, "n_null": 20, "z": 1.0 + i, "z_lo": 0.5 + i, "z_hi": 1.5 + i})
        store.write_result("pga", f"p0-{i}", {**at, "k": 8, "r": 0, "n_null": 20, "z": -1.0})  # no interval
        store.write_result("spectral", f"s{i}", {**at, "k": 8, "rankme": 3.0 + i, "alpha_req": 1.0})
        store.write_result("sample_geometry", f"g{i}", {**at, "k": 8, "r": 1, "loss_share_spearman": 0.1 * i})
    merged = [
        {**at, "z_ccr1": 1.0 + i, "rankme": 3.0 + i, "probe_accuracy": 0.5, "loss_share_spearman": 0.1 * i}
        for i, at in enumerate(where)
    ]
    probes = [{**at, "accuracy": 0.5, "accuracy_lo": 0.3, "accuracy_hi": 0.7, "chance": 0.2} for at in where]
    atomic_write_table(pa.Table.from_pylist(merged), tmp_path / "results" / "diagnostics_layers.parquet")
    atomic_write_table(pa.Table.from_pylist(probes), tmp_path / "results" / "probe.parquet")  # as `raygeom probe` writes it
    sections = report.build_sections(tmp_path)
    assert [s.anchor for s in sections] == ["pga", "diagnostics", "probe", "spectral"]
    by_anchor = {s.anchor: s for s in sections}
    (pga,) = by_anchor["pga"].figures  # one revision: one panel, CCR restoration as one dash and marker per rank
    bands = [t for t in pga.data if t.fill == "toself"]
    assert len(bands) == 1  # CCR-1 carries z_lo/z_hi, CCR-0 nothing: no band
    assert list(bands[0].y) == pytest.approx([1.5, 2.5, 3.5, 4.5, 3.5, 2.5, 1.5, 0.5])
    lines = [t for t in pga.data if t.fill != "toself"]
    assert sorted(t.name for t in lines) == ["m, CCR-0", "m, CCR-1"]
    assert len({(t.line.dash, t.marker.symbol) for t in lines}) == 2
    assert "CCR restoration" in by_anchor["pga"].intro
    (probe,) = by_anchor["probe"].figures
    assert list(next(t for t in probe.data if t.fill == "toself").y) == pytest.approx([0.7] * 4 + [0.3] * 4)
    assert [f.layout.title.text for f in by_anchor["spectral"].figures] == ["RankMe by depth", "alpha-ReQ by depth"]
    (link,) = by_anchor["diagnostics"].figures  # its merged rows carry no PC1 share: loss beside readout share alone
    assert list(link.data[0].y) == pytest.approx([0.0, 0.1, 0.2, 0.3])


def test_points_inside_a_block_sit_between_its_input_and_output_in_the_heatmaps(tmp_path):
    from raygeom.analyses.registry import Metric
    from raygeom.sources.layers import layer_names, relative_depth

    rows = pythia_grid_rows(sizes=["14m"], revisions=["step1000", "step143000"], intervals=False)
    names = layer_names(6)
    inside = [
        {
            **r,
            "layer": f"block_01.{sub}",
            "unit_key": f"{r['unit_key']}.{sub}",
            "relative_depth": relative_depth(names, f"block_01.{sub}"),
        }  # layer_index stays block_01's
        for r in rows
        if r["layer"] == "block_01"
        for sub in ("mlp_out", "attn_out", "resid_mid")
    ]
    expected = [
        "embed",
        "block_00",
        "block_01.attn_out",
        "block_01.resid_mid",
        "block_01.mlp_out",
        "block_01",
        "block_02",
        "block_03",
        "block_04",
        "block_05",
        "final_norm",
    ]
    atomic_write_table(pa.Table.from_pylist(rows + inside), tmp_path / "results" / "pga.parquet")
    assert list(heatmaps(figures_of(tmp_path)["pga"])[0].data[0].y) == expected
    heatmap = _step_layer_heatmaps(rows + inside, Metric("z", "z"), ())[0]
    assert list(heatmap.data[0].y) == expected


@pytest.mark.parametrize("default", ["plotly", "plotly_dark", None])
def test_figures_start_from_plotly_white_and_the_callers_default_template_is_restored(grid, default):
    import plotly.graph_objects as go
    import plotly.io as pio

    root, _ = grid
    white = pio.templates["plotly_white"].layout.plot_bgcolor
    before = pio.templates.default
    pio.templates.default = default
    try:
        sections = report.build_sections(root)
        assert pio.templates.default == default
        assert go.Figure().layout.template == (pio.templates[default] if default else go.layout.Template())
    finally:
        pio.templates.default = before
    figures = [figure for section in sections for figure in section.figures]
    assert figures and all(figure.layout.template.layout.plot_bgcolor == white for figure in figures)


def test_the_training_runs_table_shows_every_run_column_the_train_analysis_writes(tmp_path):
    """The report's runs table lists train.RUN_COLUMNS (and the run's key) as the rows hold them, not a copy of them
    that misses the sequence counts."""

    from raygeom.analyses.train import RUN_COLUMNS
    from raygeom.report.other_sections import train_section
    from raygeom.store.tree import atomic_write_table

    run = {c: 1.0 for c in RUN_COLUMNS} | {"lam": 0.5, "seed": 0, "key": "abc"}
    atomic_write_table(pa.Table.from_pylist([run]), tmp_path / "results" / "train_runs.parquet")
    history = [{"step": step, "lm_loss": 3.0 - step, "dispersion": 0.5, "heldout_perplexity": 20.0} for step in (0, 1)]
    atomic_write_table(pa.Table.from_pylist(history), tmp_path / "train" / "history-abc.parquet")
    section = train_section(tmp_path)
    runs = next(t for t in section.tables if t.startswith("<h4>Runs"))
    headers = re.findall(r"<th>([^<]+)</th>", runs)
    assert headers == [*RUN_COLUMNS, "key"]
    assert "n_train_sequences" in headers and "n_heldout_sequences" in headers
