"""The section of a registered analysis drawn from its declaration alone: each declared metric against depth (a panel
per model, colour by revision, dash and marker by the setting that varies), a (revision x layer) heatmap per model and
setting where a model has several revisions, and the settings of each run."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from raygeom.report.rows import _depth_order, _finite, _num, _revision_order, _step
from raygeom.report.styling import (
    DEPTH_AXIS,
    HOVER_COLUMNS,
    PALETTE,
    SCALE_END,
    TICK_SIZE,
    VISIBLE_REVISIONS,
    Section,
    _band,
    _colours,
    _fig,
    _heatmap,
    _hover,
    _is_z,
    _model_order,
    _scale_bar,
    _scatter,
    _settings_block,
    _settings_text,
    _short,
    _styled_lines,
    _tick_positions,
    _variant_label,
    _variants,
    _visible_revisions,
    _zero_lines,
)


def _profile_figure(rows: list[dict], metric, extra: tuple[str, ...], colour_by: str, title: str):
    """``metric`` against depth: a line per colour key (model or revision) and setting, its interval as a band, its
    chance level dotted; a model's revisions beyond VISIBLE_REVISIONS start hidden."""
    fig = _fig(title, xaxis_title=DEPTH_AXIS, yaxis_title=metric.title)
    lines = _styled_lines(rows, colour_by, extra)
    keys = list(dict.fromkeys(key for _, key, _, _ in lines))
    colour_of = _colours(keys, ordered=colour_by == "revision")
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
    if colour_by == "revision" and len(keys) > len(PALETTE):  # too many for the legend to tell apart by colour
        ends = sorted({0, len(keys) // 2, len(keys) - 1})
        _scale_bar(fig, "revision (training order)", [SCALE_END * i / (len(keys) - 1) for i in ends], [keys[i] for i in ends])
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
            tickfont={"size": TICK_SIZE},
            tickvals=[revisions[i] for i in _tick_positions([_step(v) for v in revisions])],
        )
        fig.update_yaxes(type="category", categoryorder="array", categoryarray=layers, tickfont={"size": TICK_SIZE})
        fig.update_layout(
            legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0},
            margin={"l": 60, "r": 20, "t": 70, "b": 50},
        )
        figures.append(fig)
    return figures


def analysis_section(analysis, rows: list[dict], files: list[Path]) -> Section | None:
    """The section of one registered analysis, from its declaration: each declared metric against depth (a panel per
    model; colour by revision, dash and marker by setting), then a (revision x layer) heatmap per model and setting
    where a model has several revisions; and a table of the settings of each run."""
    rows = [r for r in rows if _finite(r.get("relative_depth"))]
    metrics = [m for m in analysis.metrics if any(_finite(r.get(m.column)) for r in rows)]
    if not metrics:
        return None
    banded: dict[str, list[str]] = {}  # the interval's level -> the metrics banded at it
    for m in metrics:
        if m.lo and any(_finite(r.get(m.lo)) for r in rows):
            banded.setdefault(m.level_label(rows), []).append(m.title)
    section = Section(
        analysis.name,
        analysis.title,
        files=[f for f in files if f.is_file()],
        intro=f"'{analysis.name}' (version {analysis.version}). One panel per model where a model has several "
        "revisions: colour by revision, dash and marker by the setting that varies; with one revision "
        "each, colour by model. The legend names what varies; hover a point for every setting. "
        + (
            "Bands are " + "; ".join(f"{level} intervals ({', '.join(titles)})" for level, titles in banded.items()) + ". "
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
