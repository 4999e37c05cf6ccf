"""A plot is drawn again only when what it is drawn from changed: a rerun that computes nothing redraws nothing."""

import math

import pytest

from raygeom.report.figures import FIGURE_KEY, drawn_key, plot_z_vs_depth


def pga_rows(z_last: float = -3.0) -> list[dict]:
    return [
        {"model": "m", "revision": "main", "k": 8, "r": 1, "relative_depth": depth, "z": z, "z_lo": z - 0.5, "z_hi": z + 0.5}
        for depth, z in ((0.0, 1.0), (0.5, 2.5), (1.0, z_last))
    ]


def stamp(path):
    stat = path.stat()
    return stat.st_ino, stat.st_mtime_ns


def test_the_same_rows_do_not_redraw_and_other_rows_do(tmp_path):
    path = tmp_path / "z.png"
    assert plot_z_vs_depth(pga_rows(), path) == path
    first, key = stamp(path), drawn_key(path)
    assert key and len(key) == 64
    assert plot_z_vs_depth(pga_rows(), path) == path
    assert stamp(path) == first  # not written again
    plot_z_vs_depth(pga_rows(-4.0), path)
    assert stamp(path) != first and drawn_key(path) not in (None, key)
    plot_z_vs_depth(pga_rows(-4.0), path, title="another title")  # every argument but the path is in the key
    assert drawn_key(path) not in (None, key)
    # NaN equals itself in the key: rows read back with a NaN do not redraw
    nan_rows = pga_rows(math.nan)
    plot_z_vs_depth(nan_rows, path)
    again = stamp(path)
    plot_z_vs_depth(pga_rows(math.nan), path)
    assert stamp(path) == again


@pytest.mark.parametrize("damage", ["truncated", "foreign"])
def test_a_damaged_or_foreign_png_is_drawn_again(tmp_path, damage):
    from raygeom.report.figures import pyplot, save_figure

    path = tmp_path / "z.png"
    plot_z_vs_depth(pga_rows(), path)
    key = drawn_key(path)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    else:  # a PNG another tool wrote there
        fig, _ = pyplot().subplots()
        save_figure(fig, path)
    assert drawn_key(path) is None
    plot_z_vs_depth(pga_rows(), path)
    assert drawn_key(path) == key


def test_each_metric_plot_of_an_analysis_is_keyed_by_its_rows(tmp_path):
    from raygeom.analyses.registry import get
    from raygeom.report.tables import plot_analysis

    analysis = get("spectral")  # four metrics
    rows = [
        {
            "model": "m",
            "revision": "main",
            "layer": f"block_0{i}",
            "relative_depth": i / 2,
            "k": 8,
            **{metric.column: 0.1 * i for metric in analysis.metrics},
        }
        for i in range(3)
    ]
    paths = plot_analysis(analysis, rows, tmp_path)
    assert len(paths) == 4 and all(drawn_key(p) for p in paths)
    before = [stamp(p) for p in paths]
    assert plot_analysis(analysis, rows, tmp_path) == paths
    assert [stamp(p) for p in paths] == before
    rows[0][analysis.metrics[0].column] = 0.9
    plot_analysis(analysis, rows, tmp_path)
    assert stamp(paths[0]) != before[0]
    assert [stamp(p) for p in paths[1:]] == before[1:], "another metric's column changed: its plot stays"
    assert FIGURE_KEY == "raygeom-inputs"


def test_the_key_covers_the_raygeom_modules_a_plot_imports_from():
    from raygeom.report.figure_keys import _raygeom_sources
    from tools import width_page

    sources = _raygeom_sources(width_page.plot_depth)  # a page builder's plot, outside the package
    for module in (
        "tools/width_page.py",
        "raygeom/jobs/width.py",
        "raygeom/report/figures.py",
        "raygeom/report/pga_sweep.py",
        "raygeom/numerics/uncertainty.py",
    ):
        assert any(s.endswith(module) for s in sources), module
    assert not any("site-packages" in s for s in sources)


def sweep_table(z_shift: float = 0.0):
    import pyarrow as pa

    rows = [
        {
            "model": model,
            "revision": f"step{step}",
            "step": step,
            "layer": layer,
            "layer_index": index,
            "relative_depth": index / 2,
            "z": index - step / 1000 + z_shift,
            "z_lo": None,
            "z_hi": None,
            "weights_flag": False,
            "params": params,
            "size": size,
            "d": 64,
        }
        for model, params, size in (("EleutherAI/pythia-14m", 14, "14m"), ("EleutherAI/pythia-31m", 31, "31m"))
        for step in (0, 1000, 2000)
        for index, layer in enumerate(("embed", "block_00", "final_norm"))
    ]
    return pa.Table.from_pylist(rows)


def test_a_sweep_redraws_only_the_heatmaps_and_profiles_whose_rows_changed(tmp_path):
    import pyarrow.compute as pc

    from raygeom.report.sweep_plots import plot_depth_profiles, plot_heatmaps

    table = sweep_table()
    heatmaps, profiles = plot_heatmaps(table, tmp_path), plot_depth_profiles(table, tmp_path)
    assert len(heatmaps) == 2 and len(profiles) == 3 and all(drawn_key(p) for p in heatmaps + profiles)
    before = {p: stamp(p) for p in heatmaps + profiles}
    assert plot_heatmaps(table, tmp_path) == heatmaps and plot_depth_profiles(table, tmp_path) == profiles
    assert {p: stamp(p) for p in before} == before
    # one revision of one model changes: that model's heatmap and that revision's profile are drawn again, no other
    changed = pc.if_else(
        pc.and_(pc.equal(table["model"], "EleutherAI/pythia-31m"), pc.equal(table["step"], 1000)),
        pc.add(table["z"], 1.0),
        table["z"],
    )
    table = table.set_column(table.schema.get_field_index("z"), "z", changed)
    plot_heatmaps(table, tmp_path), plot_depth_profiles(table, tmp_path)
    redrawn = {p.name for p in before if stamp(p) != before[p]}
    assert redrawn == {"heatmap_EleutherAI--pythia-31m.png", "z_vs_depth_step1000.png"}


def test_every_plot_function_that_takes_a_path_is_keyed():
    import ast
    import importlib
    from pathlib import Path

    import raygeom

    found = []
    for root in (Path(raygeom.__file__).parent, Path(raygeom.__file__).parents[1] / "tools"):  # the package; the page builders
        for source in sorted(root.rglob("*.py")):
            for node in ast.parse(source.read_text()).body:
                if (
                    isinstance(node, ast.FunctionDef)
                    and node.name.startswith("plot_")
                    and "path" in [a.arg for a in node.args.args]
                ):
                    module = importlib.import_module(".".join((root.name, *source.relative_to(root).with_suffix("").parts)))
                    found.append((module.__name__, node.name, hasattr(getattr(module, node.name), "__wrapped__")))
    assert len(found) >= 16
    assert [f"{m}.{n}" for m, n, keyed in found if not keyed] == []
