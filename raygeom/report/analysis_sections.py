"""The sections of the analyses that raygeom.report.renderers draws their own way, each drawn from a store root for the one analysis that names it: what its rows need beyond the generic section of
raygeom.report.profiles (PGA's three tables and collapse zones, dispersion's perplexity groups and domains, the gap's
ranking, convergence's layer x layer grids, kNN-LM's perplexity beside dispersion). The page heads each with its
analysis's title (raygeom.report.html)."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from raygeom.analyses import registry
from raygeom.analyses.registry import Metric
from raygeom.report.profiles import _profile_figures, analysis_section
from raygeom.report.rows import _analysis_rows, _finite, _num, _read, _read_dir, pga_rows
from raygeom.report.styling import (
    PALETTE,
    TICK_SIZE,
    Section,
    _bar,
    _colour,
    _depth_colour,
    _depth_colour_bar,
    _fig,
    _heatmap,
    _hover,
    _scatter,
    _settings_block,
    _table_html,
    table_order,
)


def pga_section(root: Path) -> Section | None:
    """Subspace PGA from every table that holds it (unit files, results/pga.parquet; a sweep's revisions table adds
    sizes, steps and weights flags), as any
    analysis's section, with the sweep's collapse zones. Rows at several CCR ranks r are its restoration view: each
    rank its own dash and marker in every panel."""
    results = root / "results"
    rows = pga_rows(root)
    section = analysis_section(registry.get("pga"), rows, [results / "pga.parquet", results / "revisions.parquet"])
    if section is None:
        return None
    ranks = sorted({r["r"] for r in rows if isinstance(r.get("r"), int)})
    if len(ranks) > 1:
        section.intro += (
            f" CCR restoration: z after mean-centring and projecting out the top r principal directions (r = 0: "
            f"centring only), r = {', '.join(map(str, ranks))}; one dash and marker per r."
        )
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


def converge_section(root: Path) -> Section | None:
    from plotly.subplots import make_subplots

    path = root / "results" / "converge.parquet"
    rows = _read(path) or _read_dir(root / "results" / "converge")
    if not rows:
        return None
    section = Section(
        "convergence",
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
            fig.update_xaxes(title_text=f"{mb}@{rb} layer", tickfont={"size": TICK_SIZE}, row=row, col=col)
            fig.update_yaxes(title_text=f"{ma}@{ra} layer", tickfont={"size": TICK_SIZE}, row=row, col=col)
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


DISPERSION_TABLES = ("layers", "groups", "domains", "slices")
GAP_GROUP = ("store", "layer", "domain_tokens", "chunk_len", "chunks_per_domain", "corpus_fingerprint", "n_boot", "seed")


def token_dispersion_section(root: Path) -> Section | None:
    """Token-level dispersion: its declared metrics by depth (the generic section), the gap G of each layer, the
    perplexity groups and domains (the side tables of its units) and every layer's numbers."""
    results = root / "results"
    layers, files = _analysis_rows(root, registry.get("token_dispersion"))
    section = analysis_section(registry.get("token_dispersion"), layers, files)
    if section is None:
        return None
    groups = _read(results / "dispersion_groups.parquet")
    domains = _read(results / "dispersion_domains.parquet")
    section.files = [f for f in (results / f"dispersion_{n}.parquet" for n in DISPERSION_TABLES) if f.is_file()]
    section.intro += (
        " Mean pairwise cosine distance of hidden states against perplexity; the gap G of each layer (domain-token "
        "minus generic positions), then perplexity groups and domains."
    )
    deep = [r for r in layers if r["layer"] != "attn_last" and _finite(r.get("relative_depth"))]
    if any(_finite(r.get("gap")) for r in deep):
        section.figures += _profile_figures(
            deep,
            Metric("gap", "dispersion gap G (domain minus generic positions)", "gap_lo", "gap_hi"),
            registry.get("token_dispersion").series,
        )
    depth = {(r["model"], r["layer"]): r["relative_depth"] for r in layers if _finite(r.get("relative_depth"))}
    for model in dict.fromkeys(r["model"] for r in groups):
        section.figures.append(_groups_figure(model, [r for r in groups if r["model"] == model], depth))
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
    columns = ["model", "revision", "step", "layer", *(c for m in chunk_layer_columns(layers) for c in m), "perplexity"]
    section.tables.insert(0, "<h4>Per layer</h4>" + _table_html(layers, [c for c in columns if any(c in r for r in layers)]))
    return section


def _groups_figure(model: str, part: list[dict], depth: dict):
    """One model's perplexity groups, a trace per layer coloured by its depth on one sequential scale (a model has 20-40
    layers: a palette of ten would repeat), with a colour bar where a legend could not tell the colours apart; the
    middle and last layers shown, the rest a click away in the legend."""
    names = sorted(dict.fromkeys(r["layer"] for r in part), key=lambda n: (depth.get((model, n), 2.0), n))
    shown = {names[len(names) // 2], names[-1], *(n for n in names if n in ("final_norm", "attn_last"))}
    fig = _fig(
        f"{model}: perplexity groups (mean dispersion against mean perplexity)",
        xaxis_title="group mean perplexity",
        yaxis_title="group mean token dispersion",
        xaxis_type="log",
    )
    for layer in names:
        colour = _depth_colour(depth.get((model, layer), 1.0))
        line = sorted((r for r in part if r["layer"] == layer), key=lambda r: r["mean_perplexity"])
        fig.add_trace(
            _scatter(
                x=_num(line, "mean_perplexity"),
                y=_num(line, "mean_dispersion"),
                mode="markers",
                marker={"size": 6, "color": colour},
                name=layer,
                visible=True if layer in shown else "legendonly",
                hovertemplate=_hover("perplexity %{x:.2f}, dispersion %{y:.4f}", layer),
            )
        )
    if len(names) > len(PALETTE):  # more than a legend's colours tell apart: the scale says the depth
        _depth_colour_bar(fig)
    return fig


def chunk_layer_columns(rows: list[dict]) -> list[tuple[str, ...]]:
    """The per-layer numbers of the chunk analyses (token dispersion, slices) and the gap, with their intervals."""
    declared = [
        *registry.get("token_dispersion").metrics,
        *registry.get("slices").metrics,
        Metric("gap", "G", "gap_lo", "gap_hi"),
    ]
    return [tuple(c for c in (m.column, m.lo, m.hi) if c) for m in declared if any(m.column in r for r in rows)]


def gap_section(root: Path) -> Section | None:
    """The gap G of each candidate at one layer, ranked largest first with its 95 % bootstrap interval: one chart per
    setting (layer, domain tokens, chunks, corpus), from every stored gap unit and the last ranking of `raygeom select`."""
    results = root / "results"
    units, files = _analysis_rows(root, registry.get("gap"))
    select = _read(results / "dispersion_select.parquet")
    keys = {(r.get("store"), r.get("unit_key")) for r in select if r.get("unit_key")}
    rows = [r for r in [*select, *(r for r in units if (r.get("store"), r.get("unit_key")) not in keys)] if _finite(r.get("gap"))]
    if not rows:
        return None
    section = Section(
        "gap",
        "Dispersion gap G",
        files=[f for f in (*files, results / "dispersion_select.parquet") if f.is_file()],
        intro="Candidates (models or checkpoints) ranked by the dispersion gap G, largest first: the mean cosine distance "
        "among the representations that predict a domain token minus that among the rest. Bars are 95 % bootstrap "
        "intervals over chunks; one chart per setting (layer, domain tokens, chunks, corpus), never joined.",
    )
    settings: dict = {}
    for row in rows:
        settings.setdefault(tuple(str(row.get(c)) for c in GAP_GROUP), []).append(row)
    ranked = []
    for group in settings.values():
        group = sorted(group, key=lambda r: (-r["gap"], r["model"], str(r["revision"])))
        ranked += [{**r, "rank": i} for i, r in enumerate(group, start=1)]
        first = group[0]
        where = f" in {first['store']}" if first.get("store") else ""
        fig = _fig(
            f"Dispersion gap at {first.get('layer')}{where} (domain tokens: {first.get('domain_tokens')}, "
            f"chunk_len={first.get('chunk_len')}, {first.get('chunks_per_domain')} chunks per domain)",
            xaxis_title="candidate",
            yaxis_title="gap G (domain minus generic dispersion)",
        )
        gap = _num(group, "gap")
        fig.add_trace(
            _bar(
                x=[f"{r['model']}@{r['revision']}" for r in group],
                y=gap,
                name="gap",
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": np.nan_to_num(_num(group, "gap_hi") - gap),
                    "arrayminus": np.nan_to_num(gap - _num(group, "gap_lo")),
                },
                customdata=np.stack([_num(group, "gap_lo"), _num(group, "gap_hi"), _num(group, "perplexity")], axis=1),
                hovertemplate="%{x}<br>G %{y:.4f} [%{customdata[0]:.4f}, %{customdata[1]:.4f}]"
                "<br>perplexity %{customdata[2]:.2f}<extra></extra>",
            )
        )
        section.figures.append(fig)
    columns = ["rank", "model", "revision", "step", "layer", "gap", "gap_lo", "gap_hi", "gap_se", "perplexity", "bits_per_byte"]
    section.tables.append(
        "<h4>Candidates by the gap</h4>"
        + _table_html(ranked, [c for c in (*columns, "gap_warning") if any(c in r for r in ranked)], ordered=False)
    )
    section.tables.append(_settings_block(ranked))
    return section


def knn_section(root: Path) -> Section | None:
    from plotly.subplots import make_subplots

    directory = root / "results" / "knn"
    if not directory.is_dir():
        directory = root / "results" / "knn_layers"  # stores written before kNN-LM ran on the unit engine
    table = root / "results" / "knn.parquet"
    rows = table_order(_read_dir(directory) or _read(table))
    if not rows:
        return None
    section = Section(
        "knn_lm",
        "kNN-LM layer selection",
        files=[table],  # the tidy table, not its unit files
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
        fig.update_xaxes(type="category", tickfont={"size": TICK_SIZE})
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
