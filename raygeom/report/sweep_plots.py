"""The sweep's training-dynamics plots: a step x layer heatmap of z per model and setting, and z by depth per
revision, from the sweep's tidy table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from raygeom.extras import has, note_missing
from raygeom.report.figures import figure_to_draw, pyplot, save_figure
from raygeom.store.tree import encode_segment


def step_edges(steps: list[int]) -> np.ndarray:
    """Cell edges on a log(step + 1) axis: geometric midpoints, so log-spaced and linear steps both show."""
    x = np.log(np.asarray(steps, dtype=float) + 1.0)
    if len(x) == 1:
        return np.exp(np.array([x[0] - 0.5, x[0] + 0.5]))
    mid = (x[1:] + x[:-1]) / 2
    return np.exp(np.concatenate([[x[0] - (mid[0] - x[0])], mid, [x[-1] + (x[-1] - mid[-1])]]))


def step_ticks(steps: list[int]) -> list[int]:
    """0, the powers of ten inside the range, and the last step."""
    ticks = [t for t in (0, *(10**i for i in range(9))) if steps[0] <= t <= steps[-1]]
    if steps[-1] not in ticks and (not ticks or np.log(steps[-1] + 1) - np.log(ticks[-1] + 1) > 0.35):
        ticks.append(steps[-1])
    return ticks


def step_label(step: int) -> str:
    return f"{step / 1000:g}k" if step >= 1000 else str(step)


def plot_heatmaps(table: pa.Table, directory: Path) -> list[Path]:
    """Per model: z over (training step x layer); x is log(step + 1), revisions with flagged weights hatched.
    A model with revisions that have no training step gets one column per revision, labelled by name."""
    if not has("matplotlib"):  # the [report] extra
        note_missing("matplotlib", "no plots drawn")
        return []
    plt = pyplot()
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.ticker import NullLocator

    rows = table.to_pylist()
    paths = []
    for model in sorted({r["model"] for r in rows}):
        group = [r for r in rows if r["model"] == model]
        path = directory / f"heatmap_{model.replace('/', '--')}.png"
        key, drawn = figure_to_draw(path, plot_heatmaps, (model, group))
        if drawn:
            paths.append(path)
            continue
        by_step = all(r["step"] is not None for r in group)
        if by_step:
            columns = sorted({r["step"] for r in group})
            column_of = lambda r: r["step"]  # noqa: E731
        else:
            columns = list(dict.fromkeys(r["revision"] for r in group))
            column_of = lambda r: r["revision"]  # noqa: E731
        depth = {r["layer"]: r.get("relative_depth") or 0.0 for r in group}  # points inside a block share its index
        layers = sorted({(r["layer_index"], r["layer"]) for r in group}, key=lambda pair: (pair[0], depth[pair[1]], pair[1]))
        grid = np.full((len(layers), len(columns)), np.nan)
        for r in group:
            grid[layers.index((r["layer_index"], r["layer"])), columns.index(column_of(r))] = r["z"]
        finite = grid[np.isfinite(grid)]
        bound = max(1e-6, float(np.abs(finite).max())) if finite.size else 1.0
        fig, ax = plt.subplots(figsize=(9, max(3.0, 0.22 * len(layers) + 1.5)), dpi=110)
        edges = step_edges(columns) if by_step else np.arange(len(columns) + 1) - 0.5
        mesh = ax.pcolormesh(
            edges, np.arange(len(layers) + 1) - 0.5, grid, cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -bound, bound), shading="flat"
        )
        if by_step:
            ax.set_xscale("log")
            ticks = step_ticks(columns)
            ax.set_xticks([t + 1 for t in ticks], [step_label(t) for t in ticks])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xlabel("training step (log scale; hatched: weights duplicate another revision's)")
        else:
            ax.set_xticks(range(len(columns)), columns, rotation=45, ha="right", fontsize=7)
            ax.set_xlabel("revision (no training step known; hatched: weights duplicate another revision's)")
        ax.set_yticks(range(len(layers)), [name for _, name in layers], fontsize=6)
        for column in sorted({column_of(r) for r in group if r["weights_flag"]}, key=columns.index):
            i = columns.index(column)
            ax.axvspan(edges[i], edges[i + 1], fill=False, hatch="xx", edgecolor="black", lw=0)
        # A dot marks a cell whose 95 % interval of z crosses 0: its sign is not established.
        unsure = [r for r in group if r.get("z_lo") is not None and r.get("z_hi") is not None and r["z_lo"] <= 0 <= r["z_hi"]]
        if unsure:
            centres = [
                (edges[columns.index(column_of(r))] * edges[columns.index(column_of(r)) + 1]) ** 0.5
                if by_step
                else columns.index(column_of(r))
                for r in unsure
            ]
            ax.scatter(
                centres,
                [layers.index((r["layer_index"], r["layer"])) for r in unsure],
                s=4,
                c="black",
                marker="o",
                lw=0,
                label="95 % interval of z crosses 0",
            )
            ax.legend(loc="upper left", bbox_to_anchor=(0, -0.12), fontsize=6, frameon=False)
        ax.set_ylabel("layer")
        ax.set_title(f"Subspace PGA z over training: {model}")
        fig.colorbar(mesh, ax=ax, label="z")
        fig.tight_layout()
        paths.append(save_figure(fig, path, key))
    return paths


def plot_depth_profiles(table: pa.Table, directory: Path) -> list[Path]:
    """Per revision: z against relative depth, one line per model, coloured by size (the paper's figure)."""
    if not has("matplotlib"):  # the [report] extra
        note_missing("matplotlib", "no plots drawn")
        return []
    plt = pyplot()
    rows = table.to_pylist()
    params = sorted({r["params"] or 0 for r in rows})
    colour = plt.get_cmap("viridis")
    paths = []
    steps = {r["revision"]: r["step"] for r in rows}
    for revision in sorted(steps, key=lambda v: (steps[v] if steps[v] is not None else -1, v)):
        group = [r for r in rows if r["revision"] == revision]
        path = directory / f"z_vs_depth_{encode_segment(str(revision))}.png"  # a revision may hold '/' or '..'
        key, drawn = figure_to_draw(path, plot_depth_profiles, (revision, params, group))
        if drawn:
            paths.append(path)
            continue
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
        for model in sorted({r["model"] for r in group}, key=lambda m: next(r["params"] or 0 for r in group if r["model"] == m)):
            line = sorted((r for r in group if r["model"] == model), key=lambda r: r["relative_depth"])
            p = line[0]["params"] or 0
            shade = colour(params.index(p) / max(1, len(params) - 1))
            label = f"{line[0]['size'] or model} (d={line[0]['d']})" + (" [weights flagged]" if line[0]["weights_flag"] else "")
            ax.plot(
                [r["relative_depth"] for r in line],
                [r["z"] for r in line],
                marker="o",
                ms=2.5,
                color=shade,
                label=label,
                ls="--" if line[0]["weights_flag"] else "-",
            )
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xlabel("relative depth (embedding = 0, final norm = 1)")
        ax.set_ylabel("z")
        ax.set_title(f"Subspace PGA by depth at {revision}")
        ax.legend(fontsize=6)
        fig.tight_layout()
        paths.append(save_figure(fig, path, key))
    return paths
