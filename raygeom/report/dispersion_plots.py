"""The dispersion paper's plots (Representation dispersion): perplexity groups, layer profiles, models, the gap
ranking, kNN-LM by layer, and push-away training, each from its analysis's rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raygeom.extras import has, note_missing
from raygeom.report.figures import drawn_once, format_interval, pyplot, save_figure
from raygeom.store.tree import read_table


@drawn_once
def plot_groups(groups: list[dict], layers_rows: list[dict], model: str, layers: list[str], path: Path) -> Path:
    """The authors' figure: per selected layer, group mean dispersion against group mean perplexity."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(layers), figsize=(3.6 * len(layers), 3.3), dpi=110, squeeze=False)
    stats = {r["layer"]: r for r in layers_rows if r["model"] == model}
    for ax, layer in zip(axes[0], layers):
        pts = [g for g in groups if g["model"] == model and g["layer"] == layer]
        ax.plot([g["mean_perplexity"] for g in pts], [g["mean_dispersion"] for g in pts], "o", ms=4)
        s = stats.get(layer, {})
        ax.set_title(
            f"{layer}\nSpearman {format_interval(s, 'group_spearman')}\nPearson {format_interval(s, 'group_pearson')}", fontsize=7
        )
        ax.set_xlabel("group mean perplexity", fontsize=8)
    axes[0][0].set_ylabel("group mean token dispersion", fontsize=8)
    fig.suptitle(model, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


@drawn_once
def plot_layer_profile(rows: list[dict], path: Path) -> Path:
    """Per model, by relative depth: token dispersion, sample dispersion and the group Spearman with its interval."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), dpi=110)
    for model in dict.fromkeys(r["model"] for r in rows):
        part = sorted((r for r in rows if r["model"] == model and r["layer"] != "attn_last"), key=lambda r: r["relative_depth"])
        x = [r["relative_depth"] for r in part]
        for ax, field_name in zip(axes, ("token_dispersion", "sample_dispersion", "group_spearman")):
            (line,) = ax.plot(x, [r[field_name] for r in part], marker="o", ms=3, label=model)
        lo = [r.get("group_spearman_lo", float("nan")) for r in part]
        hi = [r.get("group_spearman_hi", float("nan")) for r in part]
        axes[2].fill_between(x, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
    for ax, title in zip(
        axes,
        (
            "token-level dispersion (mean over chunks)",
            "sample-level dispersion (pooled chunks)",
            "Spearman(group perplexity, group dispersion), 95 % band",
        ),
    ):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("relative depth (embed = 0, final norm = 1)", fontsize=8)
    axes[2].axhline(0, color="black", lw=0.7)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


@drawn_once
def plot_models(points: list[dict], path: Path) -> Path:
    """Per domain, dispersion against perplexity and against bits per byte (comparable across tokenizers)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=110)
    for ax, x_name, label in (
        (axes[0], "perplexity", "perplexity (exp mean token NLL)"),
        (axes[1], "bits_per_byte", "bits per byte (tokenizer-free)"),
    ):
        for model in dict.fromkeys(p["model"] for p in points):
            part = [p for p in points if p["model"] == model]
            sc = ax.scatter([p.get(x_name, float("nan")) for p in part], [p["token_dispersion"] for p in part], label=model, s=25)
            for p in part:
                ax.annotate(
                    p["domain"], (p.get(x_name, float("nan")), p["token_dispersion"]), fontsize=6, color=sc.get_facecolor()[0]
                )
        ax.set_xlabel(label)
        ax.set_ylabel(f"token dispersion at {points[0]['layer'] if points else ''}")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


@drawn_once
def plot_select(rows: list[dict], path: Path) -> Path:
    """G per candidate (model@revision, in rank order) with its 95 % bootstrap interval; thin ones hollow."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4.5, 0.6 * len(rows) + 2), 3.8), dpi=110)
    x = np.arange(len(rows))
    gap = np.array([r["gap"] for r in rows])
    err = np.array([[r["gap"] - r["gap_lo"], r["gap_hi"] - r["gap"]] for r in rows]).T
    ax.errorbar(x, gap, yerr=np.nan_to_num(err), fmt="none", ecolor="grey", capsize=3)
    thin = np.array([bool(r.get("gap_warning")) for r in rows])
    if (~thin).any():
        ax.plot(x[~thin], gap[~thin], "o", color="C0", label="G")
    if thin.any():
        ax.plot(x[thin], gap[thin], "o", mfc="none", color="C3", label="few domain positions")
    ax.axhline(0, color="black", lw=0.7)
    ax.set_xticks(x, [f"{r['model']}@{r['revision']}" for r in rows], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(f"dispersion gap G at {rows[0]['layer'] if rows else ''}")
    ax.set_title("G with 95 % bootstrap interval over chunks", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


@drawn_once
def plot_layers(rows: list[dict], path: Path, title: str) -> Path:
    """kNN-LM held-out perplexity per candidate layer with its 95 % bootstrap interval, beside the datastore dispersion."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.8), dpi=110)
    names = [r["layer"] for r in rows]
    x = np.arange(len(rows))
    ppl = np.array([r["knn_perplexity"] for r in rows])
    base = np.array([r["base_perplexity"] for r in rows])
    low = np.array([r.get("delta_lo", np.nan) for r in rows], dtype=float) + base
    high = np.array([r.get("delta_hi", np.nan) for r in rows], dtype=float) + base
    known = np.isfinite(low) & np.isfinite(high)
    ax.plot(x, ppl, "o-", color="tab:blue", label="kNN-LM perplexity (held-out)")
    if known.any():
        ax.errorbar(
            x[known],
            ppl[known],
            yerr=[ppl[known] - low[known], high[known] - ppl[known]],
            fmt="none",
            ecolor="tab:blue",
            elinewidth=0.8,
            capsize=2,
            label="95 % bootstrap interval (base + difference)",
        )
    ax.axhline(rows[0]["base_perplexity"], color="tab:blue", ls="--", lw=0.8, label="base LM perplexity")
    ax.set_ylabel("perplexity", color="tab:blue")
    ax.set_xticks(x, names, rotation=60, fontsize=7)
    other = ax.twinx()
    other.plot(x, [r["dispersion"] for r in rows], "s-", color="tab:red", ms=3, label="datastore dispersion")
    other.set_ylabel("dispersion of datastore keys", color="tab:red")
    ax.set_title(title, fontsize=9)
    lines = ax.get_legend_handles_labels()
    more = other.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper center")
    fig.tight_layout()
    return save_figure(fig, path)


def gap_figures(rows: list[dict], directory: Path) -> list[Path]:
    """The gap analysis's plot: G of every candidate of this run, in rank order (raygeom.analyses.gap)."""
    return [plot_select(sorted(rows, key=lambda r: r.get("rank", 0)), directory / "select_gap.png")] if rows else []


def token_dispersion_figures(rows: list[dict], directory: Path) -> list[Path]:
    """The token dispersion analysis's plots of this run's layer rows: per model, the perplexity groups of four
    layers; the layer profiles; per domain, dispersion against perplexity and bits per byte. The groups and domains
    are the rows of the same units in the store's results/ (``directory``'s sibling)."""
    if not rows:
        return []
    results = directory.parent / "results"
    keys = {row.get("unit_key") for row in rows}

    def side(table: str) -> list[dict]:
        path = results / f"dispersion_{table}.parquet"
        return [r for r in read_table(path).to_pylist() if r.get("unit_key") in keys] if path.is_file() else []

    groups, written = side("groups"), []
    for name in dict.fromkeys(r["model"] for r in rows):
        depth = sorted((r for r in rows if r["model"] == name), key=lambda r: r["relative_depth"])
        ordered = list(dict.fromkeys(r["layer"] for r in depth if r["layer"] != "attn_last"))
        if not ordered:
            continue
        picks = list(dict.fromkeys([ordered[len(ordered) // 4], ordered[len(ordered) // 2], *ordered[-2:], "attn_last"]))
        written.append(plot_groups(groups, rows, name, picks, directory / f"groups_{name.replace('/', '--')}.png"))
    written.append(plot_layer_profile(rows, directory / "layer_profile.png"))
    domains = side("domains")
    if domains:
        written.append(plot_models(domains, directory / "models_dispersion_vs_perplexity.png"))
    return [path for path in written if path is not None]


def knn_figures(rows: list[dict], directory: Path) -> list[Path]:
    """The kNN-LM analysis's plots: one per (model, revision) of this run's rows (raygeom.analyses.knn_lm)."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["revision"]), []).append(row)
    return [
        plot_layers(
            sorted(group, key=lambda r: r["layer_index"]),
            directory / f"knn_{model.replace('/', '--')}@{revision}.png",
            f"{model}@{revision}",
        )
        for (model, revision), group in groups.items()
    ]


@drawn_once
def plot_training(rows: list[dict], summary: list[dict], path: Path) -> Path | None:
    """Push-away training: the per-step curves of every run, and each lambda's held-out perplexity minus lambda=0's
    on the same seed, with the paired interval."""
    if not has("matplotlib"):  # the [report] extra
        note_missing("matplotlib", "no plots drawn")
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6), dpi=110)
    lams = sorted({r["lam"] for r in rows})
    colours = {lam: plt.cm.viridis(i / max(1, len(lams) - 1)) for i, lam in enumerate(lams)}
    for r in rows:
        history = read_table(Path(r["history"])).to_pylist()
        steps = [h["step"] for h in history]
        label = f"lambda={r['lam']:g}" if r["seed"] == min(x["seed"] for x in rows if x["lam"] == r["lam"]) else None
        axes[0].plot(steps, [h["lm_loss"] for h in history], color=colours[r["lam"]], lw=0.6, alpha=0.8, label=label)
        axes[1].plot(steps, [h["dispersion"] for h in history], color=colours[r["lam"]], lw=0.6, alpha=0.8)
        evals = [h for h in history if h.get("heldout_perplexity") is not None]
        axes[2].plot(
            [h["step"] for h in evals], [h["heldout_perplexity"] for h in evals], "o-", ms=2, color=colours[r["lam"]], lw=0.8
        )
    plain = {r["seed"]: r["heldout_perplexity"] for r in rows if r["lam"] == 0.0}
    for i, line in enumerate(s for s in summary if s["lam"] != 0.0):
        seeds = [r for r in rows if r["lam"] == line["lam"] and r["seed"] in plain]
        axes[3].plot(
            [i] * len(seeds),
            [r["heldout_perplexity"] - plain[r["seed"]] for r in seeds],
            "o",
            ms=3,
            color=colours[line["lam"]],
            alpha=0.6,
        )
        if np.isfinite(line["paired_delta_lo"]):
            axes[3].errorbar(
                [i + 0.15],
                [line["paired_delta_mean"]],
                yerr=[
                    [line["paired_delta_mean"] - line["paired_delta_lo"]],
                    [line["paired_delta_hi"] - line["paired_delta_mean"]],
                ],
                fmt="s",
                color="black",
                ms=4,
                capsize=3,
            )
    differences = [s for s in summary if s["lam"] != 0.0]
    axes[3].axhline(0, color="grey", lw=0.8)
    axes[3].set_xticks(range(len(differences)), [f"lambda={s['lam']:g}\np={s['paired_p']:.2g}" for s in differences], fontsize=7)
    axes[0].set_title("training LM loss (nats)", fontsize=9)
    axes[1].set_title("D_batch (training batches)", fontsize=9)
    axes[2].set_title("held-out perplexity", fontsize=9)
    axes[3].set_title("held-out perplexity minus lambda=0, same seed\n(dots: seeds; square: mean, 95 % t-interval)", fontsize=8)
    axes[2].set_yscale("log")
    for ax in axes[:3]:
        ax.set_xlabel("step", fontsize=8)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)
