"""What every section of the report draws with: the Section a page is made of, figures and traces, one colour per
model or revision and one dash and marker per setting, short legend labels with the full settings in the hover,
interval bands, tables and the settings of each run."""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from raygeom.report.rows import SETTING_COLUMNS, VARIANT_COLUMNS, _num, _revision_order, _setting_key, _step

VISIBLE_REVISIONS = 8  # per model, evenly spaced over training; the others start hidden ("legendonly")
MAX_TABLE_ROWS = 400
# px: the smallest tick label a reader reads; plotly turns labels only where they would overlap (tickangle "auto")
TICK_SIZE = 10
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


@dataclass
class Section:
    anchor: str
    title: str
    intro: str = ""
    figures: list = field(default_factory=list)  # plotly Figures
    tables: list[str] = field(default_factory=list)  # HTML fragments
    files: list[Path] = field(default_factory=list)  # Parquet files the section was built from


def _fig(title: str, height: int = 420, **layout):
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.update_layout(
        title={"text": title, "x": 0.01, "font": {"size": 14}},
        height=height,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        hovermode="closest",
        legend={"font": {"size": 10}, "groupclick": "togglegroup"},
        **layout,
    )
    return fig


def _trace(kind: str):
    """A trace as a dict for ``fig.add_trace``: plotly validates it once there (a ``go.Scatter`` is validated when
    made and again when added)."""
    return lambda **properties: {"type": kind, **properties}


_scatter, _heatmap, _bar = _trace("scatter"), _trace("heatmap"), _trace("bar")


def _colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _variants(rows: list[dict], extra: tuple[str, ...] = (), base: tuple[str, ...] = ()) -> list[str]:
    """The setting columns (VARIANT_COLUMNS, then ``extra``; none of ``base``) that take more than one value across
    ``rows``."""
    return [
        c for c in dict.fromkeys((*VARIANT_COLUMNS, *extra)) if c not in base and len({_setting_key(r.get(c)) for r in rows}) > 1
    ]


def setting_text(column: str, value) -> str:
    """How one setting reads in a legend or title: CCR-5, k=100, k/d=0.1, 100 nulls; a store by its short name."""
    if column == "r":
        return f"CCR-{value}"
    if column == "store":
        return str(value)
    if column == "n_null":
        return f"{value} nulls"
    if column == "k_per_d":
        return f"k/d={value:g}" if isinstance(value, float) else f"k/d={value}"
    return f"{column}={value}"


def _variant_label(row: dict, columns: list[str]) -> str:
    return ", ".join(setting_text(c, row.get(c)) for c in columns)


def series(
    rows: list[dict], base: tuple[str, ...] = ("model", "revision"), extra: tuple[str, ...] = (), x: str = "relative_depth"
) -> dict[str, list[dict]]:
    """Rows split into lines that never join two settings: one per combination of ``base`` and of every setting
    column (VARIANT_COLUMNS and ``extra``) that varies across ``rows``; each line sorted by ``x``. A line that
    would still hold two rows at one x (a setting no column names) is split by its unit key."""
    varying = _variants(rows, extra, base)
    lines: dict[str, list[dict]] = {}
    for row in rows:
        label = "@".join(str(row.get(c)) for c in base if row.get(c) is not None)
        if varying:
            label += f" ({_variant_label(row, varying)})"
        lines.setdefault(label, []).append(row)
    out = {}
    for label, line in lines.items():
        positions = [r.get(x) for r in line]
        if len(set(positions)) < len(positions):  # same settings, same position: separate runs, kept apart
            for key in dict.fromkeys(r.get("unit_key") or id(r) for r in line):
                part = [r for r in line if (r.get("unit_key") or id(r)) == key]
                out[f"{label} [{str(key)[:8]}]"] = sorted(part, key=lambda r: (r.get(x) is None, r.get(x)))
        else:
            out[label] = sorted(line, key=lambda r: (r.get(x) is None, r.get(x)))
    return out


def _visible_revisions(revisions: list[str], keep: int = VISIBLE_REVISIONS) -> set[str]:
    if len(revisions) <= keep:
        return set(revisions)
    picks = np.unique(np.round(np.linspace(0, len(revisions) - 1, keep)).astype(int))
    return {revisions[i] for i in picks}


def _band(fig, x, lo, hi, colour: str, group: str, visible, opacity: float = 0.18, **where) -> None:
    """A filled interval behind a line, in the line's legend group so one click hides both (``where``: row/col)."""

    keep = np.isfinite(lo) & np.isfinite(hi)
    if not keep.any():
        return
    x, lo, hi = np.asarray(x)[keep], lo[keep], hi[keep]
    fig.add_trace(
        _scatter(
            x=np.concatenate([x, x[::-1]]),
            y=np.concatenate([hi, lo[::-1]]),
            fill="toself",
            mode="lines",
            line={"width": 0},
            fillcolor=colour,
            opacity=opacity,
            hoverinfo="skip",
            showlegend=False,
            legendgroup=group,
            visible=visible,
        ),
        **where,
    )


def _interval(rows: list[dict], column: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(lo, hi) of ``column`` where the rows carry one: ``<column>_lo``/``_hi``, or z at CCR-r ± its half-width."""
    if any(f"{column}_lo" in r for r in rows):
        return _num(rows, f"{column}_lo"), _num(rows, f"{column}_hi")
    if column.startswith("z_ccr") and any(f"z_half_width_ccr{column[5:]}" in r for r in rows):
        centre, half = _num(rows, column), _num(rows, f"z_half_width_ccr{column[5:]}")
        return centre - half, centre + half
    return None


def _hover(template: str, label: str) -> str:
    """A hover template with ``label`` (escaped) as the trace's name box."""
    return f"{template}<extra>{html.escape(label)}</extra>"


def _zero_lines(fig, levels=(-2.0, 2.0)) -> None:
    fig.add_hline(y=0, line={"color": "black", "width": 1})
    for level in levels:
        fig.add_hline(y=level, line={"color": "grey", "width": 0.8, "dash": "dash"})


def table_order(rows: list[dict]) -> list[dict]:
    """Rows as every table of the report lists them: by model (smallest first, then by name), revision by training
    step, layer from the embedding down (relative depth, else layer index, attn_last inside the last block);
    otherwise in the order given."""
    size: dict = {}
    last_block: dict = {}  # per model: the last block's layer index (attn_last is inside that block)
    for row in rows:
        model = str(row.get("model"))
        params = row.get("params") if _finite_number(row.get("params")) else math.inf
        size[model] = min(size.get(model, math.inf), params)
        if str(row.get("layer", "")).startswith("block_") and _finite_number(row.get("layer_index")):
            last_block[model] = max(last_block.get(model, -math.inf), row["layer_index"])

    def key(row: dict):
        revision = row.get("revision")
        step = _step(str(revision)) if revision is not None else None
        depth = row.get("relative_depth")
        index = row.get("layer_index")
        if row.get("layer") == "attn_last" and str(row.get("model")) in last_block:
            index = last_block[str(row.get("model"))] - 0.5
        return (
            size.get(str(row.get("model")), math.inf),
            str(row.get("model")),
            step is None,
            step or 0,
            depth if _finite_number(depth) else math.inf,
            index if _finite_number(index) else math.inf,
        )

    return sorted(rows, key=key) if any("model" in r for r in rows) else list(rows)


def _finite_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and math.isfinite(value)


def _table_html(rows: list[dict], columns: list[str] | None = None, limit: int = MAX_TABLE_ROWS, ordered: bool = True) -> str:
    """An HTML table of ``rows`` (``columns``: which, in that order); in :func:`table_order` unless ``ordered`` is
    False (a ranking keeps its own)."""
    if not rows:
        return ""
    if ordered:
        rows = table_order(rows)
    columns = columns or list(dict.fromkeys(c for r in rows for c in r))

    def cell(value) -> str:
        if isinstance(value, float):
            return "-" if not math.isfinite(value) else f"{value:.4g}"
        if isinstance(value, (dict, list)):
            value = json.dumps(value, default=str)
        return html.escape("" if value is None else str(value))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(r.get(c))}</td>" for c in columns) + "</tr>" for r in rows[:limit])
    more = f"<p class='note'>{len(rows) - limit:,} more rows in the Parquet file.</p>" if len(rows) > limit else ""
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>{more}"


def settings_runs(rows: list[dict], by: tuple[str, ...] = ("model", "revision")) -> list[dict]:
    """One row per run: each distinct combination of the settings columns ``rows`` have, with what it covers."""
    columns = [c for c in SETTING_COLUMNS if any(c in r for r in rows)]
    runs: dict = {}
    for row in rows:
        key = tuple(_setting_key(row.get(c)) for c in columns)
        run = runs.setdefault(key, {"settings": {c: row.get(c) for c in columns}, "rows": 0, "cover": {b: set() for b in by}})
        run["rows"] += 1
        for b in by:
            if row.get(b) is not None:
                run["cover"][b].add(str(row[b]))
    out = []
    for run in runs.values():
        cover = {}
        for b, values in run["cover"].items():
            values = _revision_order(values) if b.startswith("revision") else sorted(values)
            cover[b] = ", ".join(values) if len(values) <= 4 else f"{len(values)}: {values[0]} .. {values[-1]}"
        out.append({**cover, **run["settings"], "rows": run["rows"]})
    return out


def _settings_block(rows: list[dict], by: tuple[str, ...] = ("model", "revision"), title: str = "Settings per run") -> str:
    runs = settings_runs(rows, by)
    if not runs:
        return ""
    return f"<h4>{html.escape(title)}</h4>" + _table_html(runs)


def _tick_positions(steps: list[int | None], most: int = 12) -> list[int]:
    """Column indices worth a tick label: at most ``most``, evenly spaced (12 revision names fit a page's width
    unturned at TICK_SIZE)."""
    n = len(steps)
    if n <= most:
        return list(range(n))
    return sorted(set(np.round(np.linspace(0, n - 1, most)).astype(int).tolist()))


DEPTH_AXIS = "relative depth (embedding = 0, final norm = 1)"
# A line's style: its colour says which model (or which revision, in one model's panel), its dash and marker which
# setting (CCR rank, k, pool...). 6 dashes and 7 markers: the first 42 settings of a panel each get their own pair.
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
MARKERS = ("circle", "square", "diamond", "triangle-up", "x", "cross", "star")
LEGEND_LABEL_MAX = 40  # characters: the legend stays a column beside the plot; the full settings are in the hover
HOVER_COLUMNS = {
    "z": (
        ("rho_readout", "rho_readout", ".4f"),
        ("null_mean", "null mean", ".4f"),
        ("null_std", "null std", ".4f"),
        ("n", "N", "d"),
    )
}
NOT_IN_HOVER = ("corpus_fingerprint", "settings_key", "extraction_key", "raygeom_version", "version")


def _is_z(metric) -> bool:
    """A z-score against a null: 0 is the null, drawn with guides at 0 and ±2 and a diverging heatmap."""
    return metric.column == "z" or metric.column.startswith("z_")


def _order(value):
    """A sort key for setting values of any type: numbers by value, then the rest by text, None last."""
    if value is None:
        return (2, 0.0, "")
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


DEPTH_SCALE = "Viridis"  # an ordered kind (layers by depth, revisions by step): one sequential scale
SCALE_END = 0.8  # Viridis's last yellows are unreadable on white


def _colours(keys: list, ordered: bool = False) -> dict:
    """One colour per key: for unordered keys (models) the palette's ten, or evenly spaced on Viridis for more; for
    ordered ones (revisions by step) evenly spaced on the sequential scale, so a colour reads as a place in the order
    rather than repeating a palette."""
    if len(keys) <= len(PALETTE) and not ordered:
        return {key: _colour(i) for i, key in enumerate(keys)}
    return dict(zip(keys, _scale_colours(len(keys))))


def _scale_colours(n: int) -> list[str]:
    from plotly.colors import sample_colorscale

    return sample_colorscale(DEPTH_SCALE, [SCALE_END * i / max(1, n - 1) for i in range(n)])


def _scale_bar(fig, title: str, tickvals: list[float], ticktext: list[str]) -> None:
    """A colour bar under the plot for traces coloured on the sequential scale (positions 0..1 of it): an
    invisible trace that carries only the bar, so the legend (beside the plot) still toggles each series."""
    fig.add_trace(
        _scatter(
            x=[None],
            y=[None],
            mode="markers",
            showlegend=False,
            hoverinfo="skip",
            name=title,
            meta={"role": "colour bar"},
            marker={
                "color": [0.0],
                "cmin": 0.0,
                "cmax": 1.0,
                "colorscale": [[p / SCALE_END, c] for p, c in zip(*_scale_points())],
                "showscale": True,
                "colorbar": {
                    "title": {"text": title, "side": "top"},
                    "orientation": "h",
                    "x": 0.5,
                    "xanchor": "center",
                    "y": -0.22,
                    "yanchor": "top",
                    "len": 0.6,
                    "thickness": 10,
                    "tickvals": [v / SCALE_END for v in tickvals],
                    "ticktext": ticktext,
                    "tickfont": {"size": TICK_SIZE},
                },
            },
        )
    )
    fig.update_layout(margin={"b": 130}, height=(fig.layout.height or 420) + 60)


def _scale_points() -> tuple[list[float], list[str]]:
    from plotly.colors import sample_colorscale

    positions = [SCALE_END * i / 10 for i in range(11)]
    return positions, sample_colorscale(DEPTH_SCALE, positions)


def _depth_colour_bar(fig) -> None:
    """The colour bar of traces coloured by relative depth (:func:`_depth_colour`)."""
    _scale_bar(fig, "relative depth (embedding = 0, final norm = 1)", [0.0, SCALE_END / 2, SCALE_END], ["0", "0.5", "1"])


def _depth_colour(depth: float) -> str:
    from plotly.colors import sample_colorscale

    return sample_colorscale(DEPTH_SCALE, [SCALE_END * min(max(depth, 0.0), 1.0)])[0]


def _short(label: str, most: int = LEGEND_LABEL_MAX) -> str:
    return label if len(label) <= most else label[: most - 1] + "…"


def _settings_text(row: dict) -> str:
    """Every setting of a row, for its hover (the legend names only what varies)."""
    parts = [setting_text(c, row[c]) for c in SETTING_COLUMNS if c not in NOT_IN_HOVER and row.get(c) is not None]
    return "<br>".join(html.escape(", ".join(parts[i : i + 5])) for i in range(0, len(parts), 5))


def _model_order(rows: list[dict]) -> list[str]:
    return sorted({r["model"] for r in rows}, key=lambda m: (min((r.get("params") or 0) for r in rows if r["model"] == m), m))


def _styled_lines(rows: list[dict], colour_by: str, extra: tuple[str, ...]) -> list[tuple[str, str, dict, list[dict]]]:
    """Rows split into lines that never join two settings, each ``(legend label, colour key, style, rows by depth)``:
    the colour by ``colour_by`` (model or revision), dash and marker by the settings that vary within one colour
    (the others are constant within it, and in the hover). A line still holding two rows at one depth (a setting no
    column names) is split by unit key."""
    keys = _revision_order(r["revision"] for r in rows) if colour_by == "revision" else _model_order(rows)
    groups: dict = {}
    for row in rows:
        groups.setdefault(row[colour_by], []).append(row)
    candidates = _variants(rows, extra, base=("model", "revision"))
    varying = [c for c in candidates if any(len({_setting_key(r.get(c)) for r in g}) > 1 for g in groups.values())]
    combos = sorted({tuple(r.get(c) for c in varying) for r in rows}, key=lambda combo: [_order(v) for v in combo])
    style = {combo: {"dash": DASHES[i % len(DASHES)], "symbol": MARKERS[i % len(MARKERS)]} for i, combo in enumerate(combos)}
    parts: dict = {}
    for row in rows:
        parts.setdefault((row[colour_by], tuple(row.get(c) for c in varying)), []).append(row)
    lines = []
    for key in keys:
        for combo in combos:
            line = parts.get((key, combo))
            if not line:
                continue
            label = ", ".join([str(key), *(setting_text(c, v) for c, v in zip(varying, combo))])
            depths = [r.get("relative_depth") for r in line]
            if len(set(depths)) < len(depths):  # same settings, same depth: separate runs, kept apart
                for unit in dict.fromkeys(r.get("unit_key") or id(r) for r in line):
                    part = [r for r in line if (r.get("unit_key") or id(r)) == unit]
                    lines.append(
                        (f"{label} [{str(unit)[:8]}]", key, style[combo], sorted(part, key=lambda r: r["relative_depth"]))
                    )
            else:
                lines.append((label, key, style[combo], sorted(line, key=lambda r: r["relative_depth"])))
    return lines
