"""One self-contained, interactive HTML report of everything a store holds.

``write_report(store_root)`` reads the store's Parquet tables (never its activations), builds plotly
figures and writes ``<store>/report.html``: plotly's JavaScript is inlined once, every figure is
interactive (hover values, click a legend entry to show or hide a model or revision), and the only
links out of the file are relative links to the store's own Parquet files. Sections appear only for
what the store holds:

- PGA z against depth per model (one trace per revision and setting; an uncertainty band where the
  rows carry ``z_lo``/``z_hi``);
- sweep heatmaps, z over (revision x layer), with cells whose interval crosses 0 marked;
- diagnostics panels and CCR restoration; linear probes;
- convergence heatmaps per pair of models;
- dispersion profiles, perplexity groups, domains and the gap ranking; kNN-LM layers;
- training curves of the push-away runs; a trained trajectory's checkpoints (dispersion and G over steps);
- a settings table per run (each distinct combination of the settings columns).

Big grids stay a file a browser opens: a model's revisions beyond ``VISIBLE_REVISIONS`` start hidden
(one click shows them; the data is all there), and hover text is built by plotly templates from
numeric arrays rather than stored per point as strings.
"""

from __future__ import annotations

import html
import json
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from raygeom.errors import RaygeomError
from raygeom.params import canonical_value

# pyarrow, plotly and the store are imported where used: every CLI command imports this module.

REPORT_NAME = "report.html"
VISIBLE_REVISIONS = 8  # per model, evenly spaced over training; the others start hidden ("legendonly")
MAX_TABLE_ROWS = 400

# Columns that say how a row was produced (the rest are measurements or identifiers). A "run" is one
# distinct combination of the ones a table has; provenance columns added later are picked up by name.
SETTING_COLUMNS = (
    "store",
    "corpus",
    "corpus_fingerprint",
    "n_samples",
    "sample_seed",
    "n",
    "seq_len",
    "pool",
    "skip_first",
    "max_words",
    "batch_size",
    "k",
    "k_per_d",
    "r",
    "n_null",
    "seed",
    "ccr_ranks",
    "sample_ccr",
    "chunk_len",
    "domain_tokens",
    "steps",
    "lr",
    "over",
    "push_layer",
    "workers",
    "raygeom_version",
    "version",
    "settings_key",
    "extraction_key",
)
# Settings that split one model's z profiles into separate traces when a store holds several.
VARIANT_COLUMNS = (
    "store",
    "k",
    "k_per_d",
    "r",
    "n",
    "n_null",
    "seed",
    "pool",
    "seq_len",
    "skip_first",
    "max_words",
    "corpus",
    "corpus_fingerprint",
)

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


# ----------------------------------------------------------------------------------- reading

# Files a report could not read (corrupt, unverified, being rewritten): shown at the top of the report, never
# silently dropped. Reset by build_sections.
_UNREADABLE: list[tuple[Path, str]] = []


# `raygeom report A B ...`: the first store is read as usual and every table is read from the others too, each row
# tagged with its store, which is then one more setting that tells series apart. Set by write_report.
_OVERLAY: dict = {}  # {"primary": Path, "label": str, "others": [(Path, label), ...]} while overlaying


def _overlaid(read):
    def both(path: Path) -> list[dict]:
        if not _OVERLAY:
            return read(path)
        try:
            relative = Path(path).relative_to(_OVERLAY["primary"])
        except ValueError:
            return read(path)
        rows = [{**row, "store": _OVERLAY["label"]} for row in read(path)]
        for other, label in _OVERLAY["others"]:
            rows += [{**row, "store": label} for row in read(other / relative)]
        return rows

    return both


def _read_one(path: Path) -> list[dict]:
    from raygeom.store.tree import read_table

    if not path.is_file():
        return []
    try:
        return read_table(path).to_pylist()
    except RaygeomError as error:
        _UNREADABLE.append((path, str(error)))
        return []


def _read_dir_one(directory: Path) -> list[dict]:
    import pyarrow as pa

    from raygeom.store.tree import Store, read_table

    # A unit directory's files are read as units: one copied over another unit's name is not shown twice.
    store = Store(directory.parent.parent)
    read = (lambda path: store.read_unit_file(path, strict=False)) if directory.parent.name == "results" else read_table
    paths = sorted(directory.glob("*.parquet")) if directory.is_dir() else []
    tables = []
    for path in paths:
        try:
            tables.append(read(path))
        except RaygeomError as error:  # a unit being rewritten or a damaged file: the report shows the rest and says so
            _UNREADABLE.append((path, str(error)))
    if not tables:
        return []
    return pa.concat_tables(tables, promote_options="permissive").to_pylist()


def _canonical(read):
    """Rows as the report groups them, every setting in its one canonical form (params.canonical_value: a k_per_d
    absent, None or 0 is 0.0 in a row with a k), so rows that spell a setting differently or not at all are one setting, never two lines."""

    def rows(path: Path) -> list[dict]:
        # k_per_d qualifies k: only rows with a k carry it
        return [
            {**row, "k_per_d": canonical_value("k_per_d", row.get("k_per_d"))} if "k" in row or "k_per_d" in row else row
            for row in read(path)
        ]

    return rows


_read = _canonical(_overlaid(_read_one))
_read_dir = _canonical(_overlaid(_read_dir_one))


def _step(revision: str) -> int | None:
    from raygeom.sources.revisions import step_of

    return step_of(revision)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _depth_order(rows: list[dict]) -> list[str]:
    """The rows' layers from the embedding down: by relative_depth where every row has it (the points inside a block
    share the block's layer_index, so that alone would order them by name), else by layer_index."""
    deep = all(_finite(r.get("relative_depth")) for r in rows)
    order = sorted({(r["relative_depth"] if deep else r.get("layer_index", 0), r["layer"]) for r in rows})
    return list(dict.fromkeys(name for _, name in order))


def _num(rows: list[dict], column: str) -> np.ndarray:
    return np.array([r.get(column) if _finite(r.get(column)) else np.nan for r in rows], dtype=float)


def _revision_order(revisions) -> list[str]:
    return sorted(set(revisions), key=lambda v: (_step(v) is None, _step(v) or 0, v))


def _setting_key(value):
    """A setting's value as a set or dict key that tells apart what its JSON tells apart (1 from 1.0 and True, NaN
    equal to NaN), without encoding every scalar: reports of the full Pythia grid key a million cells."""
    if isinstance(value, float):
        return (float, "nan") if value != value else (float, value)
    if value is None or isinstance(value, (str, int)):
        return (type(value), value)
    if isinstance(value, np.integer):
        return (int, int(value))
    return json.dumps(value, default=str)


def pga_rows(root: Path) -> list[dict]:
    """Every PGA row the store holds: the per-unit rows, the job table and the sweep's tidy table, one row
    per measurement (the sweep table's row wins: it adds step, size and the weights flag). Two units with the
    same settings and the same rho (e.g. `pga` and `diagnose` on one extraction) are one measurement."""
    merged: dict = {}
    sources = [
        _read_dir(root / "results" / "pga"),
        _read(root / "results" / "pga.parquet"),
        _read(root / "results" / "sweep_pga.parquet"),
    ]
    for rows in sources:
        for row in rows:
            if row.get("z") is None and row.get("rho_readout") is None:
                continue
            rho = row.get("rho_readout")
            key = (
                *(_setting_key(canonical_value(c, row.get(c))) for c in ("model", "revision", "layer", *VARIANT_COLUMNS)),
                round(rho, 9) if _finite(rho) else row.get("unit_key"),
            )
            merged[key] = {**merged.get(key, {}), **{k: v for k, v in row.items() if v is not None}}
    return list(merged.values())


# ----------------------------------------------------------------------------------- building blocks


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


def _table_html(rows: list[dict], columns: list[str] | None = None, limit: int = MAX_TABLE_ROWS) -> str:
    if not rows:
        return ""
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


# ----------------------------------------------------------------------------------- sections


def _tick_positions(steps: list[int | None], most: int = 24) -> list[int]:
    """Column indices worth a tick label: at most ``most``, evenly spaced."""
    n = len(steps)
    if n <= most:
        return list(range(n))
    return sorted(set(np.round(np.linspace(0, n - 1, most)).astype(int).tolist()))


# ----------------------------------------------------------------------------------- one section per analysis

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


def _colours(keys: list) -> dict:
    """One colour per key: the palette's ten, or evenly spaced on Viridis for more."""
    if len(keys) <= len(PALETTE):
        return {key: _colour(i) for i, key in enumerate(keys)}
    from plotly.colors import sample_colorscale

    return dict(zip(keys, sample_colorscale("Viridis", list(np.linspace(0, 1, len(keys))))))


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


def _profile_figure(rows: list[dict], metric, extra: tuple[str, ...], colour_by: str, title: str):
    """``metric`` against depth: a line per colour key (model or revision) and setting, its interval as a band, its
    chance level dotted; a model's revisions beyond VISIBLE_REVISIONS start hidden."""
    fig = _fig(title, xaxis_title=DEPTH_AXIS, yaxis_title=metric.title)
    lines = _styled_lines(rows, colour_by, extra)
    colour_of = _colours(list(dict.fromkeys(key for _, key, _, _ in lines)))
    visible = _visible_revisions(_revision_order(r["revision"] for r in rows)) if colour_by == "revision" else None
    hover_extra = [h for h in HOVER_COLUMNS.get(metric.column, ()) if any(h[0] in r for r in rows)]
    has_interval = bool(metric.lo and metric.hi) and any(_finite(r.get(metric.lo)) for r in rows)
    opacity = 0.18 if len(lines) <= 3 else 0.09  # overlapping bands of many lines would hide the lines
    for label, key, style, line in lines:
        colour, shown = colour_of[key], True if visible is None or key in visible else "legendonly"
        legend = _short(label)
        x = _num(line, "relative_depth")
        if has_interval:
            _band(fig, x, _num(line, metric.lo), _num(line, metric.hi), colour, legend, shown, opacity)
        columns = [metric.lo, metric.hi] if has_interval else []
        columns += [h[0] for h in hover_extra]
        hover = "<b>%{text}</b><br>" + html.escape(metric.title) + " = %{y:.4g}"
        if has_interval:
            hover += " [%{customdata[0]:.4g}, %{customdata[1]:.4g}]"
        offset = 2 if has_interval else 0
        hover += "".join(f"<br>{name} = %{{customdata[{offset + i}]:{fmt}}}" for i, (_, name, fmt) in enumerate(hover_extra))
        hover += f"<br>{html.escape(line[0]['model'])}@{html.escape(str(line[0]['revision']))}<br>{_settings_text(line[0])}"
        fig.add_trace(
            _scatter(
                x=x,
                y=_num(line, metric.column),
                mode="lines+markers",
                name=legend,
                legendgroup=legend,
                visible=shown,
                line={"color": colour, "dash": style["dash"], "width": 1.6},
                marker={"size": 6, "symbol": style["symbol"], "color": colour},
                text=[r["layer"] for r in line],
                meta={"series": label},
                customdata=np.stack([_num(line, c) for c in columns], axis=1) if columns else None,
                hovertemplate=_hover(hover, label),
            )
        )
        if metric.chance and any(_finite(r.get(metric.chance)) for r in line):
            fig.add_trace(
                _scatter(
                    x=x,
                    y=_num(line, metric.chance),
                    mode="lines",
                    legendgroup=legend,
                    showlegend=False,
                    visible=shown,
                    name=f"{legend} chance",
                    hoverinfo="skip",
                    meta={"series": label, "role": "chance"},
                    line={"color": colour, "dash": "dot", "width": 1},
                )
            )
    if _is_z(metric):
        _zero_lines(fig)
    return fig


def _profile_figures(rows: list[dict], metric, extra: tuple[str, ...]) -> list:
    """One panel per model, colour by revision, where a model has several revisions (and every model at its last
    revision, colour by model); else one panel with every model, colour by model."""
    models = _model_order(rows)
    revisions = {m: _revision_order(r["revision"] for r in rows if r["model"] == m) for m in models}
    if all(len(v) == 1 for v in revisions.values()):
        return [_profile_figure(rows, metric, extra, "model", f"{metric.title} by depth")]
    figures = [
        _profile_figure([r for r in rows if r["model"] == m], metric, extra, "revision", f"{m}: {metric.title} by depth")
        for m in models
    ]
    if len(models) > 1:
        last = [r for r in rows if r["revision"] == revisions[r["model"]][-1]]
        figures.append(
            _profile_figure(last, metric, extra, "model", f"{metric.title} by depth: every model at its last revision")
        )
    return figures


def _step_layer_heatmaps(rows: list[dict], metric, extra: tuple[str, ...]) -> list:
    """(revision x layer) heatmaps of one metric, one per model and setting that has several revisions. A z-score
    is drawn on a diverging scale centred on 0, with the cells whose interval contains 0 ringed, and a diamond over
    a revision whose weights are flagged as another's."""
    figures = []
    groups: dict = {}
    varying = _variants(rows, extra, base=("model", "revision"))
    for row in rows:
        groups.setdefault((row["model"], _variant_label(row, varying)), []).append(row)
    z_score = _is_z(metric)
    order = {m: i for i, m in enumerate(_model_order(rows))}
    for (model, variant), group in sorted(groups.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        revisions = _revision_order(r["revision"] for r in group)
        if len(revisions) < 2:
            continue
        layers = _depth_order(group)
        ci, li = {v: i for i, v in enumerate(revisions)}, {v: i for i, v in enumerate(layers)}
        values = np.full((len(layers), len(revisions)), np.nan)
        bounds = np.full((len(layers), len(revisions), 2), np.nan)
        for r in group:
            values[li[r["layer"]], ci[r["revision"]]] = r.get(metric.column) if _finite(r.get(metric.column)) else np.nan
            if metric.lo and metric.hi:
                bounds[li[r["layer"]], ci[r["revision"]]] = [
                    r.get(c) if _finite(r.get(c)) else np.nan for c in (metric.lo, metric.hi)
                ]
        has_interval = bool(np.isfinite(bounds).any())
        title = f"{model}: {metric.title} over training" + (f" ({variant})" if variant else "")
        fig = _fig(
            title, height=max(320, 14 * len(layers) + 140), xaxis_title="revision (ordered by training step)", yaxis_title="layer"
        )
        hover = "%{y} @ %{x}<br>" + html.escape(metric.title) + " = %{z:.4g}"
        if has_interval:
            hover += " [%{customdata[0]:.4g}, %{customdata[1]:.4g}]"
        colours = {"colorscale": "Viridis"}
        if z_score:
            finite = values[np.isfinite(values)]
            bound = float(np.abs(finite).max()) if finite.size else 1.0
            colours = {"colorscale": "RdBu", "reversescale": True, "zmid": 0, "zmin": -bound, "zmax": bound}
        fig.add_trace(
            _heatmap(
                z=values,
                x=revisions,
                y=layers,
                customdata=bounds,
                **colours,
                colorbar={"title": {"text": metric.title if not z_score else "z"}},
                hovertemplate=hover + "<extra></extra>",
                hoverongaps=False,
                name=metric.column,
            )
        )
        if z_score and has_interval:
            crossing = np.isfinite(bounds[..., 0]) & (bounds[..., 0] <= 0) & (bounds[..., 1] >= 0)
            ii, jj = np.nonzero(crossing)
            fig.add_trace(
                _scatter(
                    x=[revisions[j] for j in jj],
                    y=[layers[i] for i in ii],
                    mode="markers",
                    marker={"symbol": "circle-open", "size": 6, "color": "black", "line": {"width": 1}},
                    name="interval contains 0",
                    hoverinfo="skip",
                    showlegend=True,
                )
            )
        flags = {r["revision"]: r.get("weights_flag") for r in group if r.get("weights_flag")}
        if flags:
            fig.add_trace(
                _scatter(
                    x=list(flags),
                    y=[layers[-1]] * len(flags),
                    mode="markers",
                    name="weights flagged",
                    marker={"symbol": "diamond", "size": 9, "color": "gold", "line": {"color": "black", "width": 1}},
                    text=list(flags.values()),
                    hovertemplate="%{x}: %{text}<extra></extra>",
                )
            )
        fig.update_xaxes(
            type="category",
            categoryorder="array",
            categoryarray=revisions,
            tickangle=-60,
            tickfont={"size": 8},
            tickvals=[revisions[i] for i in _tick_positions([_step(v) for v in revisions])],
        )
        fig.update_yaxes(type="category", categoryorder="array", categoryarray=layers, tickfont={"size": 8})
        fig.update_layout(
            legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0},
            margin={"l": 60, "r": 20, "t": 70, "b": 50},
        )
        figures.append(fig)
    return figures


def analysis_section(analysis, rows: list[dict], files: list[Path], anchor: str | None = None) -> Section | None:
    """The section of one registered analysis, from its declaration: each declared metric against depth (a panel per
    model; colour by revision, dash and marker by setting), then a (revision x layer) heatmap per model and setting
    where a model has several revisions; and a table of the settings of each run."""
    rows = [r for r in rows if _finite(r.get("relative_depth"))]
    metrics = [m for m in analysis.metrics if any(_finite(r.get(m.column)) for r in rows)]
    if not metrics:
        return None
    banded = [m.title for m in metrics if m.lo and any(_finite(r.get(m.lo)) for r in rows)]
    section = Section(
        anchor or analysis.name,
        analysis.title,
        files=[f for f in files if f.is_file()],
        intro=f"'{analysis.name}' (version {analysis.version}). One panel per model where a model has several "
        "revisions: colour by revision, dash and marker by the setting that varies; with one revision "
        "each, colour by model. The legend names what varies; hover a point for every setting. "
        + (
            f"Bands are 95 % intervals ({', '.join(banded)}). "
            if banded
            else "These rows carry no interval columns, so no band is drawn. "
        )
        + f"A model's revisions beyond {VISIBLE_REVISIONS} start hidden (one legend click shows one).",
    )
    for metric in metrics:
        section.figures += _profile_figures(rows, metric, analysis.series)
    for metric in metrics:
        section.figures += _step_layer_heatmaps(rows, metric, analysis.series)
    section.tables.append(_settings_block(rows))
    return section


def _analysis_rows(root: Path, analysis) -> tuple[list[dict], list[Path]]:
    """An analysis's rows: its unit files (``results/<dir>/``), and the rows of its table (``results/<dir>.parquet``,
    which hand-written commands write alone) that no unit file holds."""
    table = root / "results" / f"{analysis.results_dir}.parquet"
    units = _read_dir(root / "results" / analysis.results_dir)
    keys = {(r.get("store"), r.get("unit_key")) for r in units if r.get("unit_key")}  # (store: when overlaying)
    rows = units + [
        r for r in _read(table) if ((r.get("store"), r.get("unit_key")) not in keys if r.get("unit_key") else not units)
    ]
    return rows, [table]


def pga_section(root: Path) -> Section | None:
    """Subspace PGA from every table that holds it (unit files, the job's table, the sweep's tidy table), as any
    analysis's section, with the sweep's collapse zones."""
    from raygeom.analyses import registry

    results = root / "results"
    section = analysis_section(
        registry.get("pga"), pga_rows(root), [results / "pga.parquet", results / "sweep_pga.parquet"], anchor="pga"
    )
    if section is None:
        return None
    if any(t.name == "interval contains 0" for f in section.figures for t in f.data):
        section.intro += (
            " In the heatmaps, a ring marks a cell whose interval [z_lo, z_hi] contains 0 (z not "
            "distinguishable from the null there), and a diamond a revision whose weights duplicate another's."
        )
    collapse = _read(results / "collapse.parquet")
    if collapse:
        zones = [c for c in collapse if c.get("collapsed")]
        section.files.append(results / "collapse.parquet")
        section.tables.insert(
            0,
            f"<h4>Collapse zones: {len(zones)} of {len(collapse)} (model, revision) profiles</h4>"
            + _table_html(
                zones,
                ["model", "revision", "step", "zone_layers", "zone_start_depth", "zone_end_depth", "zone_min_z", "early_max_z"],
            ),
        )
    return section


def analysis_sections(root: Path) -> list[Section]:
    """A section per registered analysis the store holds rows of, drawn from its declaration (those that name a
    section of their own are drawn by it, in declared_sections)."""
    from raygeom.analyses import registry

    sections = []
    for name, analysis in sorted(registry.analyses().items()):
        if name == "pga" or analysis.section:
            continue
        rows, files = _analysis_rows(root, analysis)
        section = analysis_section(analysis, rows, files)
        if section is not None:
            sections.append(section)
    return sections


def diagnostics_section(root: Path) -> Section | None:
    from plotly.subplots import make_subplots

    path = root / "results" / "diagnostics_layers.parquet"
    rows = _read(path)
    if not rows:
        return None
    section = Section(
        "diagnostics",
        "Diagnostics (raygeom diagnose): z beside spectral metrics, PC1 and probes",
        files=[path],
        intro="z beside the spectral metrics of each layer; one colour per model and revision "
        "(a legend click hides it in every panel). The linear probes of `raygeom probe` and of jobs "
        "are in their own section.",
    )
    metrics = [
        ("rankme", "RankMe"),
        ("alpha_req", "alpha-ReQ"),
        ("condition_number", "condition number"),
        ("isotropy", "isotropy"),
        ("pc1_readout_share", "PC1 readout share"),
        ("pc1_variance_fraction", "PC1 variance"),
        ("probe_accuracy", "probe accuracy"),
        ("loss_share_spearman", "loss ~ share rho"),
    ]
    metrics = [m for m in metrics if any(_finite(r.get(m[0])) for r in rows)]
    ranks = sorted({int(c[len("z_ccr") :]) for r in rows for c in r if c.startswith("z_ccr") and c[len("z_ccr") :].isdigit()})
    z_rank = 1 if 1 in ranks else (ranks[0] if ranks else None)
    panels = ([(f"z_ccr{z_rank}", f"z (CCR-{z_rank})")] if z_rank is not None else []) + metrics
    fig = make_subplots(
        rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.025, subplot_titles=[label for _, label in panels]
    )
    lines = sorted(series(rows).items())
    for i, (label, group) in enumerate(lines):
        for p, (column, name) in enumerate(panels, start=1):
            interval = _interval(group, column)
            if interval is not None:
                _band(fig, _num(group, "relative_depth"), *interval, _colour(i), label, True, row=p, col=1)
            fig.add_trace(
                _scatter(
                    x=_num(group, "relative_depth"),
                    y=_num(group, column),
                    mode="lines+markers",
                    marker={"size": 4},
                    line={"color": _colour(i)},
                    name=_short(label),
                    legendgroup=label,
                    showlegend=p == 1,
                    text=[r["layer"] for r in group],
                    hovertemplate=_hover("%{text}: " + name + " = %{y:.4g}", label),
                ),
                row=p,
                col=1,
            )
            if column == "pc1_readout_share" and any(_finite(r.get("pc1_readout_chance")) for r in group):
                fig.add_trace(
                    _scatter(
                        x=_num(group, "relative_depth"),
                        y=_num(group, "pc1_readout_chance"),
                        mode="lines",
                        line={"color": _colour(i), "dash": "dot", "width": 1},
                        legendgroup=label,
                        showlegend=False,
                        name=f"{label} chance k/d",
                        hoverinfo="skip",
                    ),
                    row=p,
                    col=1,
                )
    if any(m[0] == "condition_number" for m in panels):
        fig.update_yaxes(type="log", row=1 + [m[0] for m in panels].index("condition_number"), col=1)
    fig.update_xaxes(title_text="relative depth", row=len(panels), col=1)
    fig.update_layout(
        title={"text": "Per-layer diagnostics", "x": 0.01},
        height=190 * len(panels) + 120,
        legend={"font": {"size": 10}},
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
    )
    section.figures.append(fig)
    if len(ranks) > 1:
        fig = _fig("CCR restoration: z at CCR-r", xaxis_title="relative depth", yaxis_title="z")
        for i, (label, group) in enumerate(lines):
            for j, rank in enumerate(ranks):  # colour by model and revision, dash and marker by rank
                name = f"{label}, CCR-{rank}"
                interval = _interval(group, f"z_ccr{rank}")
                if interval is not None:
                    _band(fig, _num(group, "relative_depth"), *interval, _colour(i), _short(name), True)
                fig.add_trace(
                    _scatter(
                        x=_num(group, "relative_depth"),
                        y=_num(group, f"z_ccr{rank}"),
                        mode="lines+markers",
                        marker={"size": 6, "symbol": MARKERS[j % len(MARKERS)], "color": _colour(i)},
                        line={"color": _colour(i), "dash": DASHES[j % len(DASHES)]},
                        name=_short(name),
                        legendgroup=_short(name),
                        text=[r["layer"] for r in group],
                        hovertemplate="%{text}: z = %{y:.2f}<extra>" + html.escape(name) + "</extra>",
                    )
                )
        _zero_lines(fig)
        section.figures.append(fig)
    section.tables.append(_settings_block(rows))
    return section


def converge_section(root: Path) -> Section | None:
    from plotly.subplots import make_subplots

    path = root / "results" / "converge.parquet"
    rows = _read(path) or _read_dir(root / "results" / "converge")
    if not rows:
        return None
    section = Section(
        "converge",
        "Cross-model convergence",
        files=[path] if path.is_file() else [],
        intro="Spearman correlation of the two models' distance structures for every pair of layers: in the "
        "full space, each in its own readout subspace, in random subspaces (mean over nulls), and z.",
    )
    pairs: dict = {}
    for row in rows:
        pairs.setdefault((row["model_a"], row["revision_a"], row["model_b"], row["revision_b"]), []).append(row)
    titles = {"rho_full": "full space", "rho_readout": "readout subspaces", "null_mean": "random subspaces (mean)", "z": "z"}
    for (ma, ra, mb, rb), group in pairs.items():
        a_layers = [n for _, n in sorted({(r["layer_index_a"], r["layer_a"]) for r in group})]
        b_layers = [n for _, n in sorted({(r["layer_index_b"], r["layer_b"]) for r in group})]
        ia, ib = {n: i for i, n in enumerate(a_layers)}, {n: j for j, n in enumerate(b_layers)}
        grids = {name: np.full((len(a_layers), len(b_layers)), np.nan) for name in titles}
        for r in group:
            for name in grids:
                grids[name][ia[r["layer_a"]], ib[r["layer_b"]]] = r[name] if _finite(r.get(name)) else np.nan
        fig = make_subplots(rows=2, cols=2, subplot_titles=list(titles.values()), horizontal_spacing=0.14, vertical_spacing=0.14)
        rho = np.concatenate([grids[n][np.isfinite(grids[n])] for n in ("rho_full", "rho_readout", "null_mean")])
        low, high = (float(rho.min()), float(rho.max())) if rho.size else (0.0, 1.0)
        zf = grids["z"][np.isfinite(grids["z"])]
        bound = float(np.abs(zf).max()) if zf.size else 1.0
        for n, (name, label) in enumerate(titles.items()):
            row, col = n // 2 + 1, n % 2 + 1
            is_z = name == "z"
            fig.add_trace(
                _heatmap(
                    z=grids[name],
                    x=b_layers,
                    y=a_layers,
                    colorscale="RdBu" if is_z else "Viridis",
                    reversescale=is_z,
                    zmin=-bound if is_z else low,
                    zmax=bound if is_z else high,
                    showscale=n in (0, 3),
                    name=label,
                    colorbar={"len": 0.42, "y": 0.79 if n == 0 else 0.21, "title": {"text": "z" if is_z else "rho"}},
                    hovertemplate=f"{ma}@{ra} %{{y}} vs {mb}@{rb} %{{x}}<br>{label}: %{{z:.3f}}<extra></extra>",
                ),
                row=row,
                col=col,
            )
            fig.update_xaxes(title_text=f"{mb}@{rb} layer", tickfont={"size": 7}, row=row, col=col)
            fig.update_yaxes(title_text=f"{ma}@{ra} layer", tickfont={"size": 7}, row=row, col=col)
        fig.update_layout(
            title={
                "text": f"{ma}@{ra} vs {mb}@{rb} (k={group[0].get('k')}, CCR-{group[0].get('r')}, "
                f"N={group[0].get('n')}, {group[0].get('n_null')} nulls)",
                "x": 0.01,
            },
            height=820,
            margin={"l": 80, "r": 20, "t": 70, "b": 60},
        )
        section.figures.append(fig)
    section.tables.append(_settings_block(rows, by=("model_a", "model_b")))
    return section


def dispersion_section(root: Path) -> Section | None:
    results = root / "results"
    layers = _read(results / "dispersion_layers.parquet")
    groups = _read(results / "dispersion_groups.parquet")
    domains = _read(results / "dispersion_domains.parquet")
    select = _read(results / "dispersion_select.parquet")
    if not (layers or groups or domains or select):
        return None
    files = [results / f"dispersion_{n}.parquet" for n in ("layers", "groups", "domains", "slices", "select")]
    section = Section(
        "dispersion",
        "Dispersion gap G: by depth, perplexity groups, domains and the ranking",
        files=[f for f in files if f.is_file()],
        intro="Mean pairwise cosine distance of hidden states against perplexity; token and sample dispersion "
        "by depth are in the token-level dispersion section.",
    )
    if layers:
        from raygeom.analyses.registry import Metric

        deep = [r for r in layers if r["layer"] != "attn_last" and _finite(r.get("relative_depth"))]
        if any(_finite(r.get("gap")) for r in deep):
            section.figures += _profile_figures(
                deep,
                Metric("gap", "dispersion gap G (domain minus generic positions)"),
                ("chunk_len", "chunks_per_domain", "domain_tokens"),
            )
        columns = [
            "model",
            "revision",
            "step",
            "layer",
            "token_dispersion",
            "sample_dispersion",
            "perplexity",
            "group_spearman",
            "chunk_spearman",
            "domain_agreement_sample",
            "domain_agreement_token",
            "kmeans_agreement_sample",
            "kmeans_agreement_token",
            "gap",
        ]
        section.tables.append("<h4>Per layer</h4>" + _table_html(layers, [c for c in columns if any(c in r for r in layers)]))
    if groups:
        for model in dict.fromkeys(r["model"] for r in groups):
            part = [r for r in groups if r["model"] == model]
            names = [n for n in dict.fromkeys(r["layer"] for r in part)]
            shown = {names[len(names) // 2], names[-1], *(n for n in names if n in ("final_norm", "attn_last"))}
            fig = _fig(
                f"{model}: perplexity groups (mean dispersion against mean perplexity)",
                xaxis_title="group mean perplexity",
                yaxis_title="group mean token dispersion",
                xaxis_type="log",
            )
            for i, layer in enumerate(names):
                line = sorted((r for r in part if r["layer"] == layer), key=lambda r: r["mean_perplexity"])
                fig.add_trace(
                    _scatter(
                        x=_num(line, "mean_perplexity"),
                        y=_num(line, "mean_dispersion"),
                        mode="markers",
                        marker={"size": 5, "color": _colour(i)},
                        name=layer,
                        visible=True if layer in shown else "legendonly",
                        hovertemplate=_hover("perplexity %{x:.2f}, dispersion %{y:.4f}", layer),
                    )
                )
            section.figures.append(fig)
    if domains:
        fig = _fig("Per domain: dispersion against perplexity", xaxis_title="perplexity", yaxis_title="token dispersion")
        for i, model in enumerate(dict.fromkeys(r["model"] for r in domains)):
            part = [r for r in domains if r["model"] == model]
            fig.add_trace(
                _scatter(
                    x=_num(part, "perplexity"),
                    y=_num(part, "token_dispersion"),
                    mode="markers+text",
                    text=[r.get("domain") for r in part],
                    textposition="top center",
                    marker={"size": 8, "color": _colour(i)},
                    name=model,
                    hovertemplate="%{text}: perplexity %{x:.2f}, dispersion %{y:.4f}<extra>" + html.escape(model) + "</extra>",
                )
            )
        section.figures.append(fig)
    if select:
        select = sorted(select, key=lambda r: r.get("rank", 0))
        labels = [f"{r['model']}@{r['revision']}" for r in select]
        fig = _fig(
            f"Dispersion gap at {select[0].get('layer')} (domain tokens: {select[0].get('domain_tokens')})",
            xaxis_title="candidate",
            yaxis_title="gap G (domain minus generic dispersion)",
        )
        fig.add_trace(
            _bar(
                x=labels,
                y=_num(select, "gap"),
                name="gap",
                customdata=_num(select, "perplexity"),
                hovertemplate="%{x}<br>gap %{y:.4f}<br>perplexity %{customdata:.2f}<extra></extra>",
            )
        )
        section.figures.append(fig)
        section.tables.append("<h4>Checkpoint selection by the gap</h4>" + _table_html(select))
    return section


def knn_section(root: Path) -> Section | None:
    from plotly.subplots import make_subplots

    directory = root / "results" / "knn"
    if not directory.is_dir():
        directory = root / "results" / "knn_layers"  # stores written before kNN-LM ran on the unit engine
    rows = _read_dir(directory) or _read(root / "results" / "knn.parquet")
    if not rows:
        return None
    section = Section(
        "knn",
        "kNN-LM layer selection",
        files=sorted(directory.glob("*.parquet")) if directory.is_dir() else [],
        intro="Held-out perplexity of the kNN-LM built on each layer (lower is better) beside the dispersion "
        "of that layer's datastore keys.",
    )

    def run_label(r: dict) -> str:  # one store can hold several jobs of one model (datastore size, k)
        return f"{r['model']}@{r['revision']} ({r.get('n_keys')} keys, k={r.get('k')})"

    for label in dict.fromkeys(run_label(r) for r in rows):
        part = sorted((r for r in rows if run_label(r) == label), key=lambda r: (r.get("layer_index", 0), r["layer"]))
        names = [r["layer"] for r in part]
        fig = make_subplots(specs=[[{"secondary_y": True}]])
        ppl = _num(part, "knn_perplexity")
        interval = None
        if all("delta_lo" in r for r in part):
            base = _num(part, "base_perplexity")
            interval = {
                "type": "data",
                "symmetric": False,  # 95 % bootstrap interval of the difference to the base LM
                "array": np.nan_to_num(base + _num(part, "delta_hi") - ppl),
                "arrayminus": np.nan_to_num(ppl - base - _num(part, "delta_lo")),
            }
        fig.add_trace(
            _scatter(
                x=names,
                y=ppl,
                mode="lines+markers",
                name="kNN-LM perplexity",
                error_y=interval,
                customdata=np.stack([_num(part, "lam"), _num(part, "temperature")], axis=1),
                hovertemplate="%{x}: %{y:.3f} (lambda %{customdata[0]:.2f}, T %{customdata[1]:.3g})<extra></extra>",
            ),
            secondary_y=False,
        )
        fig.add_trace(
            _scatter(
                x=names,
                y=_num(part, "base_perplexity"),
                mode="lines",
                line={"dash": "dash"},
                name="base LM perplexity",
                hovertemplate="%{y:.3f}<extra>base</extra>",
            ),
            secondary_y=False,
        )
        fig.add_trace(
            _scatter(
                x=names,
                y=_num(part, "dispersion"),
                mode="lines+markers",
                name="datastore dispersion",
                marker={"symbol": "square", "size": 5},
                hovertemplate="%{x}: %{y:.4f}<extra>dispersion</extra>",
            ),
            secondary_y=True,
        )
        fig.update_yaxes(title_text="held-out perplexity", secondary_y=False)
        fig.update_yaxes(title_text="dispersion of keys", secondary_y=True)
        fig.update_xaxes(type="category", tickangle=-60)
        fig.update_layout(title={"text": f"kNN-LM {label}", "x": 0.01}, height=420, margin={"l": 60, "r": 60, "t": 50, "b": 90})
        section.figures.append(fig)
    section.tables.append(
        _table_html(
            rows,
            [
                c
                for c in (
                    "model",
                    "revision",
                    "layer",
                    "dispersion",
                    "temperature",
                    "lam",
                    "knn_perplexity",
                    "base_perplexity",
                    "improvement",
                    "delta_lo",
                    "delta_hi",
                    "n_keys",
                    "n_test",
                    "k",
                )
                if any(c in r for r in rows)
            ],
        )
    )
    section.tables.append(_settings_block(rows))
    return section


def train_section(root: Path) -> Section | None:
    from plotly.subplots import make_subplots

    runs_path = root / "results" / "train_runs.parquet"
    runs = {r.get("key"): r for r in _read_dir(root / "results" / "train_runs") + _read(runs_path) if r.get("key")}
    if not runs:
        return None
    summary_path = root / "results" / "train_summary.parquet"
    section = Section(
        "train",
        "Push-away training",
        files=[p for p in (runs_path, summary_path) if p.is_file()],
        intro="Per run (lambda, seed): training LM loss, D_batch and held-out perplexity against step.",
    )
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=["training LM loss (nats)", "D_batch", "held-out perplexity"], horizontal_spacing=0.07
    )
    lams = sorted({r["lam"] for r in runs.values()})
    for run in sorted(runs.values(), key=lambda r: (r["lam"], r["seed"])):
        history_path = root / "train" / f"history-{run['key']}.parquet"
        history = _read(history_path) if history_path.is_file() else _read(Path(run.get("history", "")))
        if not history:
            continue
        label = f"lambda={run['lam']:g} seed={run['seed']}"
        colour = _colour(lams.index(run["lam"]))
        steps = _num(history, "step")
        evals = [h for h in history if _finite(h.get("heldout_perplexity"))]
        for c, (x, y) in enumerate(
            [
                (steps, _num(history, "lm_loss")),
                (steps, _num(history, "dispersion")),
                (_num(evals, "step"), _num(evals, "heldout_perplexity")),
            ],
            start=1,
        ):
            fig.add_trace(
                _scatter(
                    x=x,
                    y=y,
                    mode="lines+markers" if c == 3 else "lines",
                    line={"color": colour, "width": 1},
                    marker={"size": 4},
                    name=label,
                    legendgroup=label,
                    showlegend=c == 1,
                    hovertemplate="step %{x}: %{y:.4g}<extra>" + html.escape(label) + "</extra>",
                ),
                row=1,
                col=c,
            )
        section.files.append(history_path)
    if not fig.data:
        return None
    fig.update_yaxes(type="log", row=1, col=3)
    fig.update_xaxes(title_text="step")
    fig.update_layout(title={"text": "Training curves", "x": 0.01}, height=420, margin={"l": 60, "r": 20, "t": 60, "b": 50})
    section.figures.append(fig)
    summary = _read(summary_path)
    if summary:
        section.tables.append("<h4>Held-out results over seeds</h4>" + _table_html(summary))
    section.tables.append(
        "<h4>Runs</h4>"
        + _table_html(
            list(runs.values()),
            [
                c
                for c in (
                    "lam",
                    "seed",
                    "steps",
                    "workers",
                    "push_layer",
                    "over",
                    "final_train_loss",
                    "heldout_perplexity",
                    "heldout_dispersion",
                    "wall_s",
                    "key",
                )
                if any(c in r for r in runs.values())
            ],
        )
    )
    return section


def trajectory_section(root: Path) -> Section | None:
    """A trained trajectory's checkpoints: dispersion over steps per layer, the gap G beside held-out perplexity."""
    from plotly.subplots import make_subplots

    results = root / "results"
    by_step = [r for r in _read(results / "trajectory_dispersion.parquet") if r.get("step") is not None]
    checkpoints = [r for r in _read(results / "trajectory_checkpoints.parquet") if r.get("step") is not None]
    agreement = _read(results / "trajectory_agreement.parquet")
    if not (by_step or checkpoints):
        return None
    files = [results / f"trajectory_{n}.parquet" for n in ("dispersion", "checkpoints", "agreement")]
    section = Section(
        "trajectory",
        "Trajectory: checkpoints of a training run",
        files=[f for f in files if f.is_file()],
        intro="Steps on a log axis (step + 1). Dispersion of each layer over training (a few layers start "
        "shown), and the dispersion gap G that `raygeom select` ranks by, beside held-out perplexity.",
    )
    if by_step:
        fig = _fig(
            "Token dispersion over training", xaxis_title="training step + 1", yaxis_title="token dispersion", xaxis_type="log"
        )
        layers = _depth_order([r for r in by_step if r["layer"] != "attn_last"])
        shown = _visible_revisions(layers, 4)
        for i, layer in enumerate(layers):
            line = sorted((r for r in by_step if r["layer"] == layer), key=lambda r: r["step"])
            fig.add_trace(
                _scatter(
                    x=_num(line, "step") + 1,
                    y=_num(line, "token_dispersion"),
                    mode="lines+markers",
                    marker={"size": 4},
                    line={"color": _colour(i)},
                    name=layer,
                    visible=True if layer in shown else "legendonly",
                    text=[r["revision"] for r in line],
                    hovertemplate="%{text}: %{y:.4f}<extra>" + html.escape(layer) + "</extra>",
                )
            )
        section.figures.append(fig)
    if checkpoints:
        checkpoints.sort(key=lambda r: r["step"])
        fig = make_subplots(specs=[[{"secondary_y": True}]])
        x = _num(checkpoints, "step") + 1
        names = [r["revision"] for r in checkpoints]
        fig.add_trace(
            _scatter(
                x=x,
                y=_num(checkpoints, "gap"),
                mode="lines+markers",
                name="gap G",
                text=names,
                customdata=_num(checkpoints, "select_rank"),
                hovertemplate="%{text}: G = %{y:.4f} (select rank %{customdata})<extra></extra>",
            ),
            secondary_y=False,
        )
        fig.add_trace(
            _scatter(
                x=x,
                y=_num(checkpoints, "heldout_perplexity"),
                mode="lines+markers",
                name="held-out perplexity",
                text=names,
                line={"dash": "dot"},
                hovertemplate="%{text}: %{y:.3f}<extra>perplexity</extra>",
            ),
            secondary_y=True,
        )
        fig.update_xaxes(type="log", title_text="training step + 1")
        fig.update_yaxes(title_text="dispersion gap G", secondary_y=False)
        fig.update_yaxes(title_text="held-out perplexity", type="log", secondary_y=True)
        fig.update_layout(
            title={"text": "Checkpoint selection: G against held-out perplexity", "x": 0.01},
            height=420,
            margin={"l": 60, "r": 60, "t": 50, "b": 50},
        )
        section.figures.append(fig)
    if agreement:
        section.tables.append("<h4>Does G rank checkpoints like held-out perplexity?</h4>" + _table_html(agreement))
    section.tables.append(_settings_block(checkpoints or by_step))
    return section


def width_section(root: Path) -> Section | None:
    """A width ladder (``results/width_pga.parquet``, written by a job with [width]): per PGA setting, z over
    step x layer with the widths side by side (a row per seed), and z at the last checkpoint against depth, one line
    per width (the seed mean; the band spans the seeds' 95 % intervals)."""
    from plotly.subplots import make_subplots

    path = root / "results" / "width_pga.parquet"
    rows = [r for r in _read(path) if r.get("width") is not None and _finite(r.get("z"))]
    if not rows:
        return None
    section = Section(
        "width",
        "Width ladder: Subspace PGA by width",
        files=[path],
        intro="Runs that differ only in width d (and seed). Each PGA setting separately: never joined.",
    )
    configs = sorted(
        {(r["k_per_d"], r["k"] if not r["k_per_d"] else None, r["r"]) for r in rows}, key=lambda c: (c[0] == 0, c[2])
    )
    widths = sorted({r["width"] for r in rows})
    seeds = sorted({r["run_seed"] for r in rows})
    limit = max(2.0, float(np.nanmax(np.abs(_num(rows, "z")))))
    for k_per_d, k, rank in configs:
        name = (f"k/d = {k_per_d:g}" if k_per_d else f"k = {k}") + f", CCR-{rank}"
        group = [r for r in rows if r["k_per_d"] == k_per_d and r["r"] == rank and (k_per_d or r["k"] == k)]
        fig = make_subplots(
            rows=len(seeds),
            cols=len(widths),
            shared_yaxes=True,
            subplot_titles=[f"d = {w}, seed {s}" for s in seeds for w in widths],
        )
        for i, seed in enumerate(seeds):
            for j, width in enumerate(widths):
                cell = [r for r in group if r["width"] == width and r["run_seed"] == seed]
                steps = sorted({r["step"] for r in cell})
                layers = _depth_order(cell)
                values = np.full((len(layers), len(steps)), np.nan)
                for r in cell:
                    values[layers.index(r["layer"]), steps.index(r["step"])] = r["z"]
                fig.add_trace(
                    _heatmap(
                        z=values,
                        x=[str(s) for s in steps],
                        y=layers,
                        zmin=-limit,
                        zmax=limit,
                        colorscale="RdBu",
                        reversescale=True,
                        showscale=i == 0 and j == 0,
                        hovertemplate=f"d = {width}, seed {seed}<br>" + "%{y} @ step %{x}: z = %{z:.2f}<extra></extra>",
                    ),
                    row=i + 1,
                    col=j + 1,
                )
        fig.update_layout(
            title={"text": f"z over step x layer by width ({html.escape(name)})", "x": 0.01},
            height=260 * len(seeds) + 80,
            margin={"l": 70, "r": 30, "t": 70, "b": 40},
        )
        section.figures.append(fig)
        depth = _fig(
            f"z at the last checkpoint by depth, one line per width ({name})",
            xaxis_title="relative depth (embedding = 0, final norm = 1)",
            yaxis_title="z",
        )
        for j, width in enumerate(widths):
            at = [r for r in group if r["width"] == width]
            last = [r for r in at if r["step"] == max(x["step"] for x in at if x["run"] == r["run"])]
            x = sorted({r["relative_depth"] for r in last})
            mean = [float(np.mean([r["z"] for r in last if r["relative_depth"] == v])) for v in x]
            lo = [min((r.get("z_lo") if _finite(r.get("z_lo")) else r["z"]) for r in last if r["relative_depth"] == v) for v in x]
            hi = [max((r.get("z_hi") if _finite(r.get("z_hi")) else r["z"]) for r in last if r["relative_depth"] == v) for v in x]
            label = f"d = {width}"
            _band(depth, np.array(x), np.array(lo), np.array(hi), _colour(j), label, True)
            depth.add_trace(
                _scatter(
                    x=x,
                    y=mean,
                    mode="lines+markers",
                    line={"color": _colour(j)},
                    name=label,
                    legendgroup=label,
                    meta={"series": f"{label} {name}"},
                    hovertemplate=_hover("depth %{x:.2f}: mean z over seeds = %{y:.2f}", label),
                )
            )
        _zero_lines(depth)
        section.figures.append(depth)
    section.tables.append(_settings_block(rows, by=("run", "k_per_d", "k", "r")))
    return section


def extraction_section(root: Path) -> Section | None:
    """Settings of every extraction (the completion markers; several per (model, revision) when they were made with
    other settings) and the sweep's corpus manifest."""
    from raygeom.store.tree import COMPLETE_MARKER, EXTRACTION

    rows = []
    stores = [(root, _OVERLAY["label"]), *_OVERLAY["others"]] if _OVERLAY else [(root, None)]
    for store, label in stores:
        found = []
        activations = Path(store) / "activations"
        markers = [
            *activations.glob(f"model=*/revision=*/{COMPLETE_MARKER}"),
            *activations.glob(f"model=*/revision=*/{EXTRACTION}=*/{COMPLETE_MARKER}"),
        ]
        for marker in sorted(markers):
            try:
                info = json.loads(marker.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            revision_dir = marker.parent.parent if marker.parent.name.startswith(f"{EXTRACTION}=") else marker.parent
            settings = info.get("settings") or {}
            layers = info.get("layers", [])
            found.append(
                {
                    **({"store": label} if label else {}),
                    "model": info.get("model") or revision_dir.parent.name.split("=", 1)[1],
                    "revision": info.get("revision") or revision_dir.name.split("=", 1)[1],
                    "corpus": info.get("corpus"),
                    "source": info.get("source"),
                    "n_samples": info.get("n_samples"),
                    **settings,
                    "d": info.get("d"),
                    "n_blocks": info.get("n_blocks"),
                    "layers stored": sum(1 for _ in marker.parent.glob("layer=*")),
                    "layers extracted": len(layers),
                    "params": info.get("params"),
                    "device": info.get("device"),
                    "fingerprint": (info.get("fingerprint") or "")[:12],
                    "key": info.get("key"),
                }
            )
        rows += sorted(found, key=lambda r: (r["model"], _step(r["revision"]) or 0, r["revision"], str(r["key"])))
    manifest_path = root / "sweep" / "manifest.json"
    manifest = None
    if manifest_path.is_file():
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, json.JSONDecodeError):
            manifest = None
    if not rows and not manifest:
        return None
    section = Section(
        "settings",
        "Extractions and their settings",
        intro="One row per extraction in the store, from its completion marker: a (model, revision) has one "
        "per set of extraction settings (pool, seq_len, corpus, n, ...), each with its own settings key. "
        "'layers stored' counts the layer files still there ('raygeom gc' frees those no unit needs).",
    )
    if manifest:
        section.tables.append("<h4>Sweep corpus (sweep/manifest.json)</h4>" + _table_html([manifest]))
    if rows:
        section.tables.append(_table_html(rows, limit=2000))
    return section


# ----------------------------------------------------------------------------------- the page

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1280px;
       padding: 0 18px 40px; color: #222; }
h1 { font-size: 22px; margin: 18px 0 4px; }
h2 { font-size: 18px; margin-top: 34px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h4 { margin: 14px 0 6px; font-size: 14px; } p, li { font-size: 14px; line-height: 1.45; } .note { color: #666; font-size: 12px; }
nav a { margin-right: 14px; font-size: 14px; } .figure { margin: 10px 0 18px; border: 1px solid #eee; }
.scroll { overflow-x: auto; max-height: 420px; overflow-y: auto; border: 1px solid #eee; }
table { border-collapse: collapse; font-size: 12px; }
th, td { padding: 3px 7px; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
th { background: #f6f6f6; position: sticky; top: 0; } td:first-child, th:first-child { text-align: left; }
code { font-size: 12px; } .warning { background: #fff4e5; border: 1px solid #f0b429; padding: 6px 12px; font-size: 13px; }
"""


@contextmanager
def _white_template():
    """Figures made inside start from plotly_white, as plotly's default template. plotly applies its default unvalidated,
    where ``template="plotly_white"`` on each figure deep-copies and validates the template: a third of a report's time.
    The ``default`` setter validates too, each way: plotly's own template names are set past it where the attribute is
    there (a tiny store's sections here: 1.0-1.2 s -> 0.8-1.0 s)."""
    import plotly.io as pio

    templates = pio.templates
    before = templates.default
    _set_default_template(templates, "plotly_white")
    try:
        yield
    finally:
        _set_default_template(templates, before)


def _set_default_template(templates, name) -> None:
    if hasattr(templates, "_default") and (name is None or name in templates):
        templates._default = name
    else:
        templates.default = name


def build_sections(root: Path) -> list[Section]:
    with _white_template():
        return _build_sections(Path(root))


def _build_sections(root: Path) -> list[Section]:
    _UNREADABLE.clear()
    sections = [
        pga_section(root),
        *analysis_sections(root),
        *declared_sections(root),
        diagnostics_section(root),
        train_section(root),
        trajectory_section(root),
        width_section(root),
        extraction_section(root),
    ]
    return [s for s in sections if s is not None]


def declared_sections(root: Path) -> list[Section | None]:
    """The sections registered analyses name (``Analysis.section``, "module:function"), each drawn once."""
    import importlib

    from raygeom.analyses import registry

    named = dict.fromkeys(a.section for _, a in sorted(registry.analyses().items()) if a.section)
    drawn = []
    for name in named:
        module, _, function = name.partition(":")
        drawn.append(getattr(importlib.import_module(module), function)(root))
    return drawn


def _relative(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path.resolve(), start.resolve())).as_posix()


def _file_link(path: Path, root: Path, out: Path) -> str:
    """A relative link from the report to one of the store's files, labelled with its path in the store."""
    return f"<a href='{html.escape(_relative(path, out.parent))}'><code>{html.escape(_relative(path, root))}</code></a>"


def render(sections: list[Section], root: Path, out: Path) -> str:
    import plotly
    import plotly.offline

    from raygeom import __version__

    config = {"displaylogo": False, "responsive": True, "toImageButtonOptions": {"format": "png", "scale": 2}}
    counter = 0
    body = []
    for section in sections:
        parts = [f"<section id='{section.anchor}'><h2>{html.escape(section.title)}</h2>"]
        if section.intro:
            parts.append(f"<p>{html.escape(section.intro)}</p>")
        if section.files:
            links = " ".join(_file_link(f, root, out) for f in dict.fromkeys(section.files) if f.is_file())
            if links:
                parts.append(f"<p class='note'>Data: {links}</p>")
        for fig in section.figures:
            counter += 1
            parts.append(
                "<div class='figure'>"
                + fig.to_html(
                    full_html=False,
                    include_plotlyjs=False,
                    config=config,
                    div_id=f"fig-{counter}",
                    default_width="100%",
                    default_height=f"{fig.layout.height or 420}px",
                )
                + "</div>"
            )
        parts += [t for t in section.tables if t]
        parts.append("</section>")
        body.append("".join(parts))
    results = sorted((root / "results").rglob("*.parquet")) if (root / "results").is_dir() else []
    tables = [p for p in results if p.parent == root / "results"]
    unit_dirs = sorted({p.parent for p in results if p.parent != root / "results"})
    files = "".join(f"<li>{_file_link(p, root, out)}</li>" for p in tables)
    files += "".join(
        f"<li><code>{html.escape(_relative(d, root))}/</code>: {len(list(d.glob('*.parquet'))):,} unit files</li>"
        for d in unit_dirs
    )
    warning = ""
    if _UNREADABLE:
        items = "".join(
            f"<li><code>{html.escape(_relative(p, root))}</code>: {html.escape(reason)}</li>" for p, reason in _UNREADABLE[:50]
        )
        warning = (
            f"<div class='warning'><b>{len(_UNREADABLE)} file(s) in this store could not be read and are not in this "
            f"report:</b><ul>{items}</ul></div>"
        )
    nav = " ".join(f"<a href='#{s.anchor}'>{html.escape(s.title.split(':')[0])}</a>" for s in sections)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>raygeom report: {html.escape(root.name)}</title><style>{STYLE}</style>"
        f"<script type='text/javascript'>{plotly.offline.get_plotlyjs()}</script></head><body>"
        f"<h1>raygeom report: <code>{html.escape(str(root))}</code></h1>"
        f"<p class='note'>Written {stamp} by raygeom {__version__} with plotly {plotly.__version__}; "
        f"{counter} figure{'' if counter == 1 else 's'}. Works offline: everything is in this file.</p>{warning}"
        f"<nav>{nav} <a href='#files'>Files</a></nav>"
        + "".join(body)
        + "<section id='files'><h2>Files</h2><p>The store's Parquet tables, which this report was built from:</p>"
        f"<ul>{files}</ul></section>"
        "</body></html>"
    )


def write_report(store_root: str | Path, out: str | Path | None = None, overlay: list[str | Path] = ()) -> Path:
    """Write the report of everything under ``store_root`` (default ``<store>/report.html``); return its path. With
    ``overlay`` stores, their rows are drawn beside the first store's, each store one more setting of the series.
    Without plotly (the [report] extra), :class:`raygeom.extras.MissingExtra`."""
    from raygeom.extras import need

    need("plotly")
    root = Path(store_root)
    for store in (root, *map(Path, overlay)):
        if not store.is_dir():
            raise RaygeomError(f"store {store} is not a directory")
    out = Path(out) if out is not None else root / REPORT_NAME
    from raygeom.store.tree import atomic_write_text

    labels = _store_labels([root, *map(Path, overlay)])
    if overlay:
        _OVERLAY.update(
            primary=root.absolute(),
            label=labels[0],
            others=[(Path(other).absolute(), label) for other, label in zip(overlay, labels[1:])],
        )
    try:
        sections = build_sections(root.absolute())
    finally:
        _OVERLAY.clear()
    if not sections:
        unreadable = f"; {len(_UNREADABLE)} file(s) could not be read, e.g. {_UNREADABLE[0][1]}" if _UNREADABLE else ""
        raise RaygeomError(
            f"nothing to report in {root}: no readable result tables under {root / 'results'} and no extractions{unreadable}"
        )
    page = render(sections, root, out)
    try:
        atomic_write_text(page, out)
    except OSError as error:
        raise RaygeomError(f"cannot write the report to {out}: {error.strerror or error}") from None
    return out


STORE_LABEL_MAX = 16  # characters: a store's name in a legend, beside the revision and setting


def _store_labels(stores: list[Path]) -> list[str]:
    """Short distinct names of the stores, for legends: their folder names (with the parent's where two share one);
    where one is long, less the words all of them share (``sweep-2024-01-run-a``, ``...-run-b``: ``a``, ``b``), cut to
    STORE_LABEL_MAX characters; ``store 1``, ``store 2``... where that still leaves two alike."""
    import re

    stores = [Path(store).absolute() for store in stores]
    names = [store.name or str(store) for store in stores]
    if len(set(names)) < len(names):
        names = [f"{store.parent.name}/{store.name}" for store in stores]
    if len(names) > 1 and max(map(len, names)) > STORE_LABEL_MAX:
        words = [re.split(r"(?<=[-_./ ])", name) for name in names]  # words keep their separator
        head = 0
        while all(len(w) > head + 1 for w in words) and len({w[head] for w in words}) == 1:
            head += 1
        tail = 0
        while all(len(w) > head + tail + 1 for w in words) and len({w[-1 - tail] for w in words}) == 1:
            tail += 1
        names = ["".join(w[head : len(w) - tail]).strip("-_./ ") or name for w, name in zip(words, names)]
    names = [_short(name, STORE_LABEL_MAX) for name in names]
    return names if len(set(names)) == len(names) else [f"store {i + 1}" for i in range(len(names))]


def _os_text(error: OSError) -> str:
    import errno

    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the disk is full ({error.filename or ''})"
    return f"{error.strerror or error} ({error.filename or ''})"


def announce_report(store_root: str | Path, console) -> Path | None:
    """For the end of a run command: write the report and print its path. The run's results are already
    written by then, so a report that cannot be written is said, not raised."""
    from raygeom.extras import MissingExtra

    try:
        path = write_report(store_root)
    except MissingExtra as error:
        console.print(f"report:  not written: {error}", markup=False, highlight=False)
        return None
    except (OSError, RaygeomError) as error:  # a write that failed (a full disk): the run did not complete its outputs
        raise RaygeomError(
            f"report not written: {error if isinstance(error, RaygeomError) else _os_text(error)}; the "
            f"results are stored, `raygeom report {store_root}` writes it"
        ) from None
    except Exception as error:  # noqa: BLE001 - a report that cannot be drawn must not turn a finished run into a failed one
        console.print(f"[yellow]report: not written ({type(error).__name__}: {error})[/]", highlight=False)
        return None
    console.print(f"report:  {path}", highlight=False)
    if _UNREADABLE:
        console.print(
            f"[yellow]report: {len(_UNREADABLE)} unreadable file(s) left out, listed at the top of the report[/]", highlight=False
        )
    return path
