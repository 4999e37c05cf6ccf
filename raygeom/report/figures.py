"""What users look at: rich tables and PNG plots."""

from __future__ import annotations

import math
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from raygeom.extras import need
from raygeom.report.figure_keys import FIGURE_KEY, drawing_key, drawn_key, drawn_once, figure_key, figure_to_draw  # noqa: F401
from raygeom.store.tree import atomic_write_table, write_rows  # noqa: F401 - where the report's callers find it


def interval_bounds(row: dict, name: str = "z") -> tuple[float, float] | None:
    """(lo, hi) of column ``name`` from the row's ``<name>_lo`` and ``<name>_hi``; None unless it has both, not NaN."""
    lo, hi = row.get(f"{name}_lo"), row.get(f"{name}_hi")
    return (lo, hi) if lo is not None and hi is not None and lo == lo and hi == hi else None


def format_interval(row: dict, name: str, digits: int = 2, separator: str = ", ") -> str:
    """``value [lo, hi]`` of column ``name`` with its interval columns, signed, for tables and titles: ``nan`` where
    the row has no value, the value alone where it has no interval."""
    value, bounds = row.get(name), interval_bounds(row, name)
    if not isinstance(value, float) or value != value:
        return "nan"
    if bounds is None:
        return f"{value:+.{digits}f}"
    return f"{value:+.{digits}f} [{bounds[0]:+.{digits}f}{separator}{bounds[1]:+.{digits}f}]"


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, never a window): the one way raygeom gets it. Without the
    [report] extra, :class:`raygeom.extras.MissingExtra`."""
    matplotlib = need("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pga_table(rows: list[dict], title: str) -> Table:
    """z with the 95 % half-width of its Monte-Carlo interval (from the finite null) and the empirical p-value;
    where a z carries no interval, why (fewer nulls than can support one, or degenerate draws)."""
    from raygeom.numerics.uncertainty import interval_note

    table = Table(title=title, title_justify="left")
    for name in ("layer", "rho_readout", "null mean", "null std", "z ± 95%", "p (upper)", "nulls"):
        table.add_column(name, justify="left" if name == "layer" else "right")
    for row in rows:
        z = row["z"]
        interval = interval_bounds(row)
        # Coloured only when the whole interval is past +-2, not just the point.
        low, high = interval or (z, z)
        style = "green" if low > 2 else "red" if high < -2 else ""
        text = f"{z:+.2f}" + (f" ± {(high - low) / 2:.2f}" if interval else "")
        if not interval and not math.isnan(z) and row.get("n_null") is not None:
            text += f" ({interval_note(int(row['n_null']))})"
        p = row.get("p_upper")
        table.add_row(
            row["layer"],
            f"{row['rho_readout']:.4f}",
            f"{row['null_mean']:.4f}",
            f"{row['null_std']:.4f}",
            f"[{style}]{text}[/]" if style else text,
            "" if p is None else f"{p:.3g}",
            str(row.get("n_null", "")),
        )
    return table


def sweep_table(rows: list[dict], zones: list[dict], limit: int = 40) -> Table:
    """One line per (model, revision) of a sweep: where z peaks and dips, with intervals, and the collapse verdict."""
    from rich.markup import escape

    collapsed = {(z["model"], z["revision"]): z["collapsed"] for z in zones}
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if row.get("z") is not None and row["z"] == row["z"]:
            groups.setdefault((row["model"], row["revision"]), []).append(row)
    table = Table(title=f"Subspace PGA over the sweep ({counted(len(groups), 'model revision')})", title_justify="left")
    for name in ("model", "revision", "step", "layers", "max z ± 95%", "at", "min z ± 95%", "at", "collapse zone"):
        # held to 120 columns in a log: a long name wraps whole inside its cell, never cut to "…"
        table.add_column(name, justify="left" if name in ("model", "revision", "at") else "right", overflow="fold")

    def cell(row: dict) -> str:
        interval = interval_bounds(row)
        return f"{row['z']:+.2f}" + (f" ± {(interval[1] - interval[0]) / 2:.2f}" if interval else "")

    keys = list(groups)
    shown = keys if len(keys) <= limit else [keys[round(i * (len(keys) - 1) / (limit - 1))] for i in range(limit)]
    for key in shown:
        group = groups[key]
        high, low = max(group, key=lambda r: r["z"]), min(group, key=lambda r: r["z"])
        step = group[0].get("step")
        table.add_row(
            escape(key[0]),
            escape(key[1]),
            "" if step is None else str(step),
            str(len(group)),
            cell(high),
            high["layer"],
            cell(low),
            low["layer"],
            "yes" if collapsed.get(key) else "",
        )
    if len(shown) < len(keys):
        table.caption = f"{len(shown)} of {len(keys)} revisions shown, evenly spaced; all are in the tidy table"
    return table


def counted(count: int, noun: str) -> str:
    """``1 model``, ``5 models``."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def print_pga(console: Console, rows: list[dict]) -> None:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:  # one table per setting: rows of two CCR ranks or k never share a table
        groups.setdefault((row["model"], row["revision"], row.get("k"), row.get("r")), []).append(row)
    for (model, revision, _, _), group in groups.items():
        first = group[0]
        title = f"Subspace PGA  {escape(model)}@{escape(revision)}  (N={first['n']}, d={first['d']}, k={first['k']}, CCR-{first['r']}, {first['n_null']} nulls, seed {first['seed']})"
        console.print(pga_table(sorted(group, key=lambda r: (r["layer_index"], r.get("relative_depth") or 0.0)), title))


def pga_figures(rows: list[dict], directory: Path) -> list[Path]:
    """PGA's figure of a run: z by depth, a line per (model, revision, k, CCR rank)."""
    plot = plot_z_vs_depth(rows, Path(directory) / "pga_z_vs_depth.png")
    return [plot] if plot is not None else []


@drawn_once
def plot_z_vs_depth(rows: list[dict], path: Path, title: str = "Subspace PGA by depth") -> Path:
    plt = pyplot()
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(f"{row['model']}@{row['revision']} (k={row['k']}, CCR-{row['r']})", []).append(row)
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    for label, group in sorted(groups.items()):
        group = sorted(group, key=lambda r: r["relative_depth"])
        depth = [r["relative_depth"] for r in group]
        (line,) = ax.plot(depth, [r["z"] for r in group], marker="o", ms=3, label=label)
        intervals = [interval_bounds(r) for r in group]
        if all(intervals):
            ax.fill_between(depth, [i[0] for i in intervals], [i[1] for i in intervals], color=line.get_color(), alpha=0.2, lw=0)
    ax.axhline(0, color="black", lw=0.8)
    for level in (-2, 2):
        ax.axhline(level, color="grey", lw=0.6, ls="--")
    ax.set_xlabel("relative depth (embedding = 0, final norm = 1)")
    ax.set_ylabel("z = (rho_readout - null mean) / null std\n(band: 95 % interval from the finite null)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def save_figure(fig, path: Path, key: str | None = None) -> Path:
    """Write a PNG under a temporary name and rename it, so a plot is never half-written; close the figure. ``key``
    (or that of the :func:`drawn_once` call drawing it): what it was drawn from, kept in the PNG's text."""
    plt = pyplot()

    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp.png")
    key = key or drawing_key()
    fig.savefig(temporary, metadata={FIGURE_KEY: key} if key else None)
    plt.close(fig)
    temporary.replace(path)
    return path


def save_text(text: str, path: Path) -> Path:
    """Write a page or a small file for people and other tools (no checksum sidecar, unlike the store's files),
    under a temporary name renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    temporary.replace(path)
    return path


def write_csv(rows: list[dict], path: Path, columns: list[str] | None = None) -> Path:
    """Rows as CSV, floats to 5 significant digits: the copies of tables that the docs cite. Written under a
    temporary name and renamed (no checksum sidecar: these are for people, not for resuming)."""
    import csv
    import io
    import math
    import os

    columns = columns or list(dict.fromkeys(name for row in rows for name in row))

    def cell(value):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        return f"{value:.5g}" if isinstance(value, float) else value

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([cell(row.get(name)) for name in columns])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(buffer.getvalue())
    os.replace(temporary, path)
    return path
