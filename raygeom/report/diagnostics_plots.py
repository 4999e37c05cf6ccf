"""The plots of `raygeom diagnose` (the diagnostics analysis's figures): z beside each spectral or probe metric per
(model, revision), and the CCR restoration of z across ranks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raygeom.analyses.diagnose import Z_METRICS
from raygeom.report.figures import drawn_once, pyplot, save_figure


@drawn_once
def plot_diagnostics(rows: list[dict], path: Path, title: str, z_rank: int = 1) -> Path:
    """z (CCR-``z_rank``) on every panel's right axis; one spectral or probe metric per panel on the left."""
    plt = pyplot()
    rows = sorted(rows, key=lambda r: r["layer_index"])
    depth = [r["relative_depth"] for r in rows]
    z = [r.get(f"z_ccr{z_rank}", np.nan) for r in rows]
    metrics = [m for m in Z_METRICS if any(m[0] in r for r in rows)]
    fig, axes = plt.subplots(len(metrics) + 1, 1, figsize=(7.5, 2.0 * (len(metrics) + 1)), dpi=110, sharex=True)
    axes[0].plot(depth, z, color="black", marker="o", ms=3)
    axes[0].axhline(0, color="black", lw=0.6)
    for level in (-2, 2):
        axes[0].axhline(level, color="grey", lw=0.5, ls="--")
    axes[0].set_ylabel(f"z (CCR-{z_rank})")
    axes[0].set_title(title, fontsize=10)
    for ax, (column, label, log) in zip(axes[1:], metrics):
        ax.plot(depth, [r.get(column, np.nan) for r in rows], color="tab:blue", marker="o", ms=3)
        if column == "pc1_readout_share":
            ax.plot(depth, [r["pc1_readout_chance"] for r in rows], color="tab:blue", ls=":", lw=1, label="chance k/d")
            ax.legend(fontsize=7, loc="upper left")
        if column == "probe_accuracy":
            ax.plot(depth, [r.get("probe_chance", np.nan) for r in rows], color="tab:blue", ls=":", lw=1, label="majority class")
            ax.legend(fontsize=7, loc="lower left")
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(label, color="tab:blue", fontsize=8)
        twin = ax.twinx()
        twin.plot(depth, z, color="grey", ls="--", lw=1)
        twin.set_ylabel("z", color="grey", fontsize=8)
    axes[-1].set_xlabel("relative depth (embedding = 0, final norm = 1)")
    fig.tight_layout()
    return save_figure(fig, path)


@drawn_once
def plot_restoration(rows: list[dict], ranks: tuple[int, ...], path: Path, title: str) -> Path:
    plt = pyplot()
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(f"{row['model']}@{row['revision']}", []).append(row)
    fig, axes = plt.subplots(1, len(groups), figsize=(6.0 * len(groups), 4.2), dpi=110, squeeze=False)
    for ax, (label, group) in zip(axes[0], sorted(groups.items())):
        group = sorted(group, key=lambda r: r["layer_index"])
        for r in ranks:
            ax.plot(
                [g["relative_depth"] for g in group],
                [g.get(f"z_ccr{r}", np.nan) for g in group],
                marker="o",
                ms=3,
                label=f"CCR-{r}",
            )
        ax.axhline(0, color="black", lw=0.6)
        for level in (-2, 2):
            ax.axhline(level, color="grey", lw=0.5, ls="--")
        ax.set_title(f"{label} (d={group[0]['d']}, k={group[0]['k']}, N={group[0]['n']})", fontsize=9)
        ax.set_xlabel("relative depth")
        ax.set_ylabel("Subspace PGA z")
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def figures(rows: list[dict], directory: Path) -> list[Path]:
    """The diagnostics analysis's plots of this run's merged rows: one panel set per (model, revision), then the
    restoration of z at every CCR rank the rows carry."""
    from raygeom.store.tree import encode_segment

    if not rows:
        return []
    ranks = sorted({int(c[len("z_ccr") :]) for row in rows for c in row if c.startswith("z_ccr")})
    z_rank = 1 if 1 in ranks else ranks[0]
    written = []
    for label in dict.fromkeys(f"{r['model']}@{r['revision']}" for r in rows):
        part = [r for r in rows if f"{r['model']}@{r['revision']}" == label]
        written.append(
            plot_diagnostics(
                part,
                directory / f"diagnostics_{encode_segment(label)}.png",
                f"{label}: Subspace PGA z beside spectral metrics and probes",
                z_rank,
            )
        )
    written.append(plot_restoration(rows, tuple(ranks), directory / "ccr_restoration.png", "CCR restoration: z at CCR-r"))
    return [path for path in written if path is not None]
