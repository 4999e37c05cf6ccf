"""The report's sections of what is not a registered analysis: push-away training runs, a trained trajectory's
checkpoints, a width ladder and the store's extractions. A registered
analysis's section comes from its declaration (raygeom.report.profiles, raygeom.report.analysis_sections)."""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from raygeom.analyses.train import RUN_COLUMNS
from raygeom.report.rows import _OVERLAY, _depth_order, _finite, _num, _read, _read_dir, _step
from raygeom.report.styling import (
    DASHES,
    MARKERS,
    PALETTE,
    SCALE_END,
    Section,
    _band,
    _colour,
    _colours,
    _fig,
    _heatmap,
    _hover,
    _scale_bar,
    _scatter,
    _settings_block,
    _table_html,
    _visible_revisions,
    _zero_lines,
)


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
        intro="Per run (lambda, seed): training LM loss, D_batch and held-out perplexity against step; colour by "
        "lambda, dash and marker by seed. Each run's per-step history is train/history-<run key>.parquet.",
    )
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=["training LM loss (nats)", "D_batch", "held-out perplexity"], horizontal_spacing=0.07
    )
    lams = sorted({r["lam"] for r in runs.values()})
    seeds = sorted({r["seed"] for r in runs.values()})
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
                    line={"color": colour, "width": 1, "dash": DASHES[seeds.index(run["seed"]) % len(DASHES)]},
                    marker={"size": 4, "symbol": MARKERS[seeds.index(run["seed"]) % len(MARKERS)]},
                    name=label,
                    legendgroup=label,
                    showlegend=c == 1,
                    hovertemplate="step %{x}: %{y:.4g}<extra>" + html.escape(label) + "</extra>",
                ),
                row=1,
                col=c,
            )
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
            [c for c in (*RUN_COLUMNS, "key") if any(c in r for r in runs.values())],
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
        colour_of = _colours(layers, ordered=True)  # layers by depth on the sequential scale: a palette would repeat
        for layer in layers:
            line = sorted((r for r in by_step if r["layer"] == layer), key=lambda r: r["step"])
            fig.add_trace(
                _scatter(
                    x=_num(line, "step") + 1,
                    y=_num(line, "token_dispersion"),
                    mode="lines+markers",
                    marker={"size": 4},
                    line={"color": colour_of[layer]},
                    name=layer,
                    visible=True if layer in shown else "legendonly",
                    text=[r["revision"] for r in line],
                    hovertemplate="%{text}: %{y:.4f}<extra>" + html.escape(layer) + "</extra>",
                )
            )
        if len(layers) > len(PALETTE):
            ends = sorted({0, len(layers) // 2, len(layers) - 1})
            _scale_bar(fig, "layer (by depth)", [SCALE_END * i / (len(layers) - 1) for i in ends], [layers[i] for i in ends])
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
                    "kind": "pooled",
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
        found += [{**({"store": label} if label else {}), **row} for row in _token_extractions(Path(store))]
        rows += sorted(found, key=lambda r: (r["model"], _step(r["revision"]) or 0, r["revision"], r["kind"], str(r["key"])))
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
        intro="One row per extraction in the store, of every kind: 'pooled' (one vector per text: PGA and the "
        "per-layer analyses), 'chunks' (token states of fixed-length chunks: token dispersion, slices, the gap) and "
        "'knn' (token states with next-token targets: kNN-LM). A (model, revision) has one per kind and set of "
        "extraction settings, each with its own key. 'layers stored' counts the layer files still there "
        "('raygeom gc' frees those no unit needs).",
    )
    if manifest:
        section.tables.append("<h4>Sweep corpus (sweep/manifest.json)</h4>" + _table_html([manifest]))
    if rows:
        section.tables.append(_table_html(rows, limit=2000))
    return section


def _token_extractions(store: Path) -> list[dict]:
    """The chunk extractions (``dispersion/``: each one's per-layer summary) and kNN-LM's (``knn/``: each one's
    completion marker) of one store, a row each."""
    from raygeom.store.tree import read_table

    rows = []
    for summary in sorted(store.glob("dispersion/model=*/revision=*/summary-*.parquet")):
        try:
            layers = read_table(summary).to_pylist()
        except Exception:  # noqa: BLE001 - a damaged file: the row of what its path says
            layers = []
        first = layers[0] if layers else {}
        rows.append(
            {
                "model": first.get("model") or summary.parent.parent.name.split("=", 1)[1],
                "revision": first.get("revision") or summary.parent.name.split("=", 1)[1],
                "kind": "chunks",
                "corpus": first.get("corpus"),
                **{c: first.get(c) for c in ("chunk_len", "chunks_per_domain", "domain_tokens", "n_chunks") if c in first},
                "d": first.get("d"),
                "layers extracted": len(layers),
                "fingerprint": (first.get("fingerprint") or "")[:12],
                "key": first.get("key") or summary.stem.split("-", 1)[1],
            }
        )
    for marker in sorted(store.glob("knn/model=*/revision=*/*/_COMPLETE.json")):
        try:
            info = json.loads(marker.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        settings = info.get("settings") or {}
        rows.append(
            {
                "model": info.get("model") or marker.parent.parent.parent.name.split("=", 1)[1],
                "revision": info.get("revision") or marker.parent.parent.name.split("=", 1)[1],
                "kind": "knn",
                **{c: settings.get(c) for c in ("chunk_len", "train_chunks", "test_chunks", "batch_size") if c in settings},
                "layers extracted": len(info.get("layers", [])),
                "key": info.get("key"),
            }
        )
    return rows
