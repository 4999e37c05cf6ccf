"""The convergence analysis's plots: per pair of models, the four layer x layer heatmaps (full space, readout
subspaces, random subspaces, z). Its declaration names :func:`figures` (raygeom.analyses.convergence)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raygeom.analyses.converge import pairs
from raygeom.report.figures import drawn_once, pyplot, save_figure


@drawn_once
def plot_convergence(rows: list[dict], path: Path) -> Path:
    plt = pyplot()
    a_layers = sorted({(r["layer_index_a"], r["layer_a"]) for r in rows})
    b_layers = sorted({(r["layer_index_b"], r["layer_b"]) for r in rows})
    ia = {name: i for i, (_, name) in enumerate(a_layers)}
    ib = {name: j for j, (_, name) in enumerate(b_layers)}
    panels = {name: np.full((len(a_layers), len(b_layers)), np.nan) for name in ("rho_full", "rho_readout", "null_mean", "z")}
    for r in rows:
        for name in panels:
            panels[name][ia[r["layer_a"]], ib[r["layer_b"]]] = r[name]
    first = rows[0]
    titles = {
        "rho_full": "(a) full space",
        "rho_readout": "(b) each in its readout subspace",
        "null_mean": f"(c) random {first['k']}-dim subspaces (mean)",
        "z": "(b - c mean) / c std; dot: 95% interval crosses 0",
    }
    low = np.nanmin([panels[n] for n in ("rho_full", "rho_readout", "null_mean")])
    high = np.nanmax([panels[n] for n in ("rho_full", "rho_readout", "null_mean")])
    fig, axes = plt.subplots(2, 2, figsize=(11, 9.5), dpi=110)
    for ax, name in zip(axes.flat, panels):
        if name == "z":
            bound = np.nanmax(np.abs(panels[name]))
            image = ax.imshow(panels[name], cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto", origin="lower")
            unsure = [
                (ib[r["layer_b"]], ia[r["layer_a"]]) for r in rows if r.get("z_lo") is not None and r["z_lo"] <= 0 <= r["z_hi"]
            ]
            if unsure:  # cells whose 95% interval of z crosses 0
                ax.scatter(*zip(*unsure), s=4, c="black", marker=".", linewidths=0)
        else:
            image = ax.imshow(panels[name], cmap="viridis", vmin=low, vmax=high, aspect="auto", origin="lower")
        fig.colorbar(image, ax=ax, shrink=0.85)
        ax.set_title(titles[name], fontsize=9)
        step_a, step_b = max(1, len(a_layers) // 10), max(1, len(b_layers) // 10)
        ax.set_yticks(range(0, len(a_layers), step_a), [a_layers[i][1] for i in range(0, len(a_layers), step_a)], fontsize=6)
        ax.set_xticks(
            range(0, len(b_layers), step_b), [b_layers[j][1] for j in range(0, len(b_layers), step_b)], fontsize=6, rotation=60
        )
        ax.set_ylabel(f"{first['model_a']} layer", fontsize=8)
        ax.set_xlabel(f"{first['model_b']} layer", fontsize=8)
    fig.suptitle(
        f"Convergence (Spearman of pairwise cosine distances, CCR-{first['r']}, N={first['n']}, "
        f"k={first['k']}, {first['n_null']} nulls)\n{first['model_a']}@{first['revision_a']} vs "
        f"{first['model_b']}@{first['revision_b']}",
        fontsize=10,
    )
    fig.tight_layout()
    return save_figure(fig, path)


def figures(rows: list[dict], directory: Path) -> list[Path]:
    """One heatmap figure per pair of models of this run's rows."""
    return [
        plot_convergence(group, directory / f"converge_{model_a}@{rev_a}_vs_{model_b}@{rev_b}.png")
        for (model_a, rev_a, model_b, rev_b), group in pairs(rows).items()
    ]
