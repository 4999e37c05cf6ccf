"""The report layer's shared helpers: one interval formatter, one way to get pyplot and save a figure."""

import math

from raygeom.report.figures import format_interval, interval_bounds, pyplot, save_figure


def test_format_interval_as_the_console_and_the_plot_titles_print_it():
    row = {"gap": 0.1234, "gap_lo": -0.05, "gap_hi": 0.3}
    assert format_interval(row, "gap", 3, ",") == "+0.123 [-0.050,+0.300]"  # the dispersion commands' tables
    assert format_interval(row, "gap") == "+0.12 [-0.05, +0.30]"  # the dispersion plots' titles
    assert format_interval({"gap": 0.5, "gap_lo": math.nan, "gap_hi": math.nan}, "gap") == "+0.50"
    assert format_interval({"gap": 0.5}, "gap") == "+0.50"
    assert format_interval({"gap": math.nan, "gap_lo": 0.0, "gap_hi": 1.0}, "gap") == "nan"
    assert format_interval({}, "gap") == "nan"


def test_interval_bounds_need_both_ends():
    assert interval_bounds({"z": 1.0, "z_lo": 0.5, "z_hi": 1.5}) == (0.5, 1.5)
    assert interval_bounds({"z_lo": 0.5}) is None
    assert interval_bounds({"z_lo": math.nan, "z_hi": 1.0}) is None
    assert interval_bounds({"rho_lo": 0.1, "rho_hi": 0.2}, "rho") == (0.1, 0.2)


def test_pyplot_draws_off_screen_and_save_figure_replaces_atomically(tmp_path):
    plt = pyplot()
    assert plt.get_backend().lower() == "agg"
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    path = save_figure(fig, tmp_path / "plots" / "line.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["line.png"]
