"""docs/results/trajectory.md, built from the tidy rows shipped beside it (``trajectory/*.parquet`` and ``meta.json``):
the tables and figures, and each of the papers' claims held against what this run measured. Nothing here reads a
store: ``raygeom run jobs/trajectory.toml`` exports the rows (raygeom.jobs.trajectory.export_rows) and
``python -m tools.results_pages docs/results/trajectory.md`` rebuilds the page from them."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

from raygeom.jobs.gap_ranking import (
    agreement,  # noqa: F401 - the trajectory's G ranking, re-exported
    claim_verdict,
    correlation_text,
    rank_interval,
    step_name,
)
from raygeom.jobs.trajectory import _layer_names
from raygeom.jobs.trajectory_report import _f, organisation_summary, pick_layers, verdict_early
from raygeom.jobs.width import plot_heatmaps
from raygeom.numerics.uncertainty import spearman_with_ci
from raygeom.report.figure_keys import drawn_once
from raygeom.report.pga_sweep import collapse_zones
from tools.width_page import (
    REGENERATE,
    SPECTRAL_TABLE,
    markdown_table,
    pc1_reading,
    restoration,
    spectral_against_z,
    spectral_reading,
    with_interval,
)


def _log_step_axis(ax, steps: list[int]) -> None:
    from matplotlib.ticker import NullLocator

    from raygeom.report.sweep_plots import step_label, step_ticks

    ax.set_xscale("log")
    ticks = step_ticks(sorted(set(steps)))
    ax.set_xticks([t + 1 for t in ticks], [step_label(t) for t in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("training step (log scale of step + 1)")


@drawn_once
def plot_z_vs_step(z_rows: list[dict], layers: dict[str, str], path, title: str):
    """z against step for the early, middle and late blocks and the final norm; a band where z_lo/z_hi exist."""
    from raygeom.report.figures import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    for role, layer in layers.items():
        series = sorted((r for r in z_rows if r["layer"] == layer), key=lambda r: r["step"])
        x = [r["step"] + 1 for r in series]
        (line,) = ax.plot(x, [r["z"] for r in series], marker="o", ms=3, label=f"{role}: {layer}")
        if series and all(r.get("z_lo") is not None and r.get("z_hi") is not None for r in series):
            ax.fill_between(x, [r["z_lo"] for r in series], [r["z_hi"] for r in series], color=line.get_color(), alpha=0.2, lw=0)
    flagged = sorted({r["step"] for r in z_rows if r.get("weights_flag")})
    for step in flagged:
        ax.axvline(step + 1, color="grey", ls=":", lw=0.8)
    ax.axhline(0, color="black", lw=0.7)
    _log_step_axis(ax, [r["step"] for r in z_rows])
    ax.set_ylabel("Subspace PGA z")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


@drawn_once
def plot_dispersion_vs_step(rows: list[dict], layers: dict[str, str], path, title: str):
    from raygeom.report.figures import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), dpi=110)
    for role, layer in layers.items():
        series = sorted((r for r in rows if r["layer"] == layer), key=lambda r: r["step"])
        for ax, name in zip(axes, ("token_dispersion", "sample_dispersion")):
            ax.plot([r["step"] + 1 for r in series], [r[name] for r in series], marker="o", ms=3, label=f"{role}: {layer}")
    for ax, name in zip(axes, ("token-level dispersion (within chunks)", "sample-level dispersion (pooled chunks)")):
        _log_step_axis(ax, [r["step"] for r in rows])
        ax.set_title(name, fontsize=9)
    axes[0].set_ylabel("mean cosine distance")
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


@drawn_once
def plot_gap_against_perplexity(rows: list[dict], path, title: str):
    from raygeom.report.figures import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), dpi=110)
    steps = [r["step"] + 1 for r in rows]
    axes[0].plot(steps, [r["gap"] for r in rows], marker="o", ms=3, color="tab:blue")
    axes[0].set_ylabel("dispersion gap G", color="tab:blue")
    twin = axes[0].twinx()
    twin.plot(steps, [r["heldout_perplexity"] for r in rows], marker="s", ms=3, color="tab:red")
    twin.set_ylabel("held-out perplexity", color="tab:red")
    _log_step_axis(axes[0], [r["step"] for r in rows])
    axes[1].scatter([r["heldout_perplexity"] for r in rows], [r["gap"] for r in rows], s=18)
    for r in rows:
        axes[1].annotate(str(r["step"]), (r["heldout_perplexity"], r["gap"]), fontsize=6)
    perplexities = [r["heldout_perplexity"] for r in rows]
    if perplexities and max(perplexities) > 10 * min(perplexities):
        from matplotlib.ticker import NullFormatter

        for ax in (twin, axes[1]):
            (ax.set_yscale if ax is twin else ax.set_xscale)("log")
        twin.yaxis.set_minor_formatter(NullFormatter())
        axes[1].xaxis.set_minor_formatter(NullFormatter())
    axes[1].set_xlabel("held-out perplexity (labels: step)")
    axes[1].set_ylabel("dispersion gap G")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def render_page(page: Path) -> str:
    """The trajectory page's text, and its figures, from the rows in ``<page>/`` alone."""
    import json

    import pyarrow.parquet as pq

    page = Path(page)
    data = page.parent / page.stem
    meta = json.loads((data / "meta.json").read_text())
    tables = {
        name: pq.read_table(data / f"{name}.parquet").to_pylist() if (data / f"{name}.parquet").is_file() else []
        for name in ("z", "checkpoints", "dispersion", "pga", "spectral", "pc1", "probe")
    }
    z_rows, rows, by_step = tables["z"], tables["checkpoints"], tables["dispersion"]
    picked = pick_layers(_layer_names(z_rows))
    settings = meta["trajectory"]
    model = f"d = {meta['train']['hidden_size']}" if meta.get("train") else meta["job"]
    shaped = [{**r, "run": "run", "width": 0, "depth": 0, "run_seed": 0} for r in z_rows]
    figures = {
        "heatmap": plot_heatmaps(shaped, {}, data / "heatmap.png", "Subspace PGA z over step x layer"),
        "z_vs_step": plot_z_vs_step(z_rows, picked, data / "z_vs_step.png", f"Subspace PGA z over training: {model}"),
        "dispersion_vs_step": plot_dispersion_vs_step(
            by_step, picked, data / "dispersion_vs_step.png", f"Dispersion over training: {model} (held-out chunks)"
        ),
        "gap_vs_perplexity": plot_gap_against_perplexity(
            rows,
            data / "gap_vs_perplexity.png",
            f"Dispersion gap G ({settings['domain_tokens']}) and held-out perplexity: {model}",
        ),
    }
    links = {name: f"{data.name}/{Path(path).name}" for name, path in figures.items() if path is not None}
    return page_text(meta, tables, links, page.name)


def _lowest_block(z_rows: list[dict]) -> str:
    blocks = [r for r in z_rows if r["layer"].startswith("block_") and r["z"] == r["z"]]
    if not blocks:
        return ""
    low = min(blocks, key=lambda r: r["z"])
    if low["z"] >= 0:
        return f" No block has z below 0 (lowest {_f(low['z'], 2, True)})."
    organised = min((r["step"] for r in blocks if r["z"] > 2), default=None)
    when = (
        "before any block is organised (z > 2 first at step " + str(organised) + ")"
        if organised is None or low["step"] < organised
        else "after organisation had appeared"
    )
    return f" The lowest z of any block is {_f(low['z'], 2, True)} ({low['layer']}, {step_name(low['step'])}), {when}."


def _spearman_reading(s: dict) -> str:
    if s.get("note") or not math.isfinite(s.get("spearman", float("nan"))):
        return correlation_text(s)
    return (
        f"{_f(s['spearman'], 3, True)} (n = {s['n']}; 95% Fisher-z, Bonett-Wright variance [{_f(s['fisher_lo'], 2, True)}, "
        f"{_f(s['fisher_hi'], 2, True)}], bootstrap over checkpoints [{_f(s['boot_lo'], 2, True)}, {_f(s['boot_hi'], 2, True)}])"
    )


def page_text(meta: dict, tables: dict[str, list[dict]], links: dict[str, str], page_name: str) -> str:
    """The page, from the shipped rows: ``tables`` holds z (the sweep's [pga] rows), checkpoints (G and held-out
    perplexity per checkpoint), dispersion (per checkpoint x layer) and the mechanism analyses' rows."""
    train = SimpleNamespace(**meta["train"]) if meta.get("train") else None
    settings = SimpleNamespace(**meta["trajectory"])
    pga_settings = SimpleNamespace(**meta["pga"])
    thresholds = SimpleNamespace(**meta["sweep"])
    z_rows, rows, by_step = tables["z"], tables["checkpoints"], tables["dispersion"]
    steps = sorted({r["step"] for r in z_rows})
    last_step = steps[-1] if steps else 0
    picked = pick_layers([name for _, name in sorted({(r["layer_index"], r["layer"]) for r in z_rows})])
    organisation = organisation_summary(z_rows, picked, thresholds.positive_z)
    summary = agreement(rows, settings.late_from, settings.bootstrap, settings.seed)
    everything, late = summary[0], summary[1]
    zones = collapse_zones(z_rows, thresholds.collapse_threshold, thresholds.positive_z)
    collapsed = [z for z in zones if z["collapsed"]]
    final_layer = picked.get("final")
    final_rows = sorted((r for r in by_step if r["layer"] == final_layer), key=lambda r: r["step"])
    perplexity = {r["revision"]: r["heldout_perplexity"] for r in rows}
    dispersion_agreement = None
    paired = [(r["token_dispersion"], -perplexity[r["revision"]]) for r in final_rows if r["revision"] in perplexity]
    if len(paired) >= 4:
        dispersion_agreement = {**rank_interval(*zip(*paired), settings.bootstrap, settings.seed), "n": len(paired)}
    early_status, early_text = verdict_early(organisation, last_step)
    late_role = next((o for o in organisation if o["role"] == "late"), None)
    flagged = [r["revision"] for r in rows if r.get("weights_flag")]
    data = page_name.removesuffix(".md")

    lines = [
        "# A training trajectory on the laptop: geometry over a small GPT-NeoX's training",
        "",
        f"Regenerated by `{REGENERATE} docs/results/{page_name}` from the tidy rows in [`{data}/`]({data}/) "
        "(`z`, `checkpoints`, `dispersion`, `pga`, `spectral`, `pc1`, `probe` .parquet, and `meta.json`); those rows were "
        f"written by `raygeom run jobs/{meta['job']}.toml` from its store `{meta['store']}`. Every number below can be "
        "recomputed from them with pandas. Edit the job, not this page.",
        "",
        "## What ran",
        "",
    ]
    if meta.get("rerun_note"):
        lines += [f"- **This run**: {meta['rerun_note']}"]
    if train is not None:
        lines += [
            f"- **Model**: GPT-NeoX trained from scratch, d = {train.hidden_size}, {train.n_layers} blocks, {train.n_heads} heads, "
            f"a {train.vocab_size}-token BPE vocabulary trained on the training articles, context {train.seq_len}.",
            f"- **Data**: BBC News, {1 - train.heldout_fraction:.0%} of the articles for training, {train.heldout_fraction:.0%} held out "
            f"(never trained on); {train.steps} steps of {train.batch_size} x {train.seq_len} tokens "
            f"({train.steps * train.batch_size * train.seq_len / 1e6:.2f}M tokens), AdamW lr {train.lr:g}, cosine schedule, "
            f"seed {train.seed}, "
            + ("one Ray task (one worker)." if train.workers == 1 else f"Ray Train ({train.workers} data-parallel workers)."),
            f"- **Checkpoints**: {len(steps)} (`step0`, the random initialisation, then 1, 2, 4, ... {meta['log_until']}, then "
            f"every {meta['save_every']} steps): {', '.join(str(s) for s in steps)}. Each is a `save_pretrained` directory "
            "(model + tokenizer) with its held-out evaluation.",
        ]
    lines += [
        f"- **PGA sweep**: every checkpoint x every layer, N = {meta['n_samples']} held-out articles, last-token pooling, "
        f"k = {pga_settings.k}, CCR-{pga_settings.r}, {pga_settings.n_null} nulls, seed {pga_settings.seed}.",
        f"- **Dispersion**: {settings.chunks_per_domain} chunks of {settings.chunk_len} tokens per topic from the held-out "
        f"articles; the dispersion gap G at `{settings.gap_layer}` with domain tokens `{settings.domain_tokens}` "
        "(what `raygeom select` ranks by).",
    ]
    full = meta.get("wall")
    if full:
        lines.append(
            f"- **Wall time**: the whole job, training included, took {full['wall_s'] / 60:.1f} min (training "
            f"{full['train_wall_s'] / 60:.1f} min; finished {full['finished']}, {full['cpus']} CPUs, 1-minute load "
            f"average {full['load_1min_at_end']:.1f} at the end: other work shared the cores)."
        )
    lines += ["", "## Subspace PGA over step x layer", ""]
    for name, alt in (("heatmap", "z heatmap"), ("z_vs_step", "z against step")):
        if name in links:
            lines += [f"![{alt}]({links[name]})", ""]
    lines += [
        f"| layer | role | z at step 0 (initialisation) | first step with z > {thresholds.positive_z:g} | half of peak by step "
        "| peak z | at step | z at the last step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in organisation:
        first = o.get("first_organised_step")
        lines.append(
            f"| {o['layer']} | {o['role']} | {_f(o['z_first'], 2, True)} | {first if first is not None else 'never'} | "
            f"{o['half_peak_step'] if o['half_peak_step'] is not None else 'n/a'} | {_f(o['z_peak'], 2, True)} | "
            f"{o['peak_step']} | {_f(o['z_last'], 2, True)} |"
        )
    lines += ["", "Bands are the z intervals stored with each unit (`z_lo`, `z_hi` in `z.parquet`).", ""]
    if flagged:
        lines += [f"Checkpoints whose weights duplicate another's: {', '.join(flagged)}.", ""]
    lines += ["## Dispersion over steps", ""]
    if "dispersion_vs_step" in links:
        lines += [f"![dispersion against step]({links['dispersion_vs_step']})", ""]
    lines += ["| step | token dispersion | sample dispersion | held-out perplexity |", "|---|---|---|---|"]
    for r in final_rows:
        lines.append(
            f"| {r['step']} | {_f(r['token_dispersion'], 4)} | {_f(r['sample_dispersion'], 4)} | "
            f"{_f(perplexity.get(r['revision']), 2)} |"
        )
    lines += [
        "",
        f"(layer `{final_layer}`, step 0 is the initialisation; all layers in `{data}/dispersion.parquet`)",
        "",
        "## Does `select` pick the best checkpoints?",
        "",
    ]
    if "gap_vs_perplexity" in links:
        lines += [f"![G and perplexity]({links['gap_vs_perplexity']})", ""]
    source = rows[0]["perplexity_source"] if rows else "n/a"
    lines += [
        f"Held-out perplexity: {'the trainer evaluation saved with each checkpoint' if source == 'trainer' else 'of the held-out chunks G is measured on'}. "
        "Agreement is Spearman(G, -perplexity): +1 when `select`'s order is the perplexity order. Over fewer than 10 "
        "checkpoints, or at |rho| = 1, no interval is honest and the exact permutation p-value stands instead.",
        "",
        "| revision | step | G | select rank | held-out perplexity | perplexity rank |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['revision']} | {r['step']} | {_f(r['gap'], 4, True)} | {r['select_rank']} | {_f(r['heldout_perplexity'], 2)} | "
            f"{r['perplexity_rank']} |"
        )
    lines += [
        "",
        f"- Over all checkpoints: {_spearman_reading(everything)}.",
        f"- Over the late ones ({late['subset']}): {_spearman_reading(late)}.",
    ]
    for s in summary:
        if s.get("select_pick"):
            lines.append(
                f"- {s['subset']}: `select` puts {step_name(s['select_pick_step'])} first (perplexity "
                f"{_f(s['select_pick_perplexity'])}, rank {s['pick_perplexity_rank']} of {s['n']}); the lowest perplexity "
                f"is {s['best_by_perplexity']} ({_f(s['best_perplexity'])}), "
                f"{'inside' if s['best_in_select_top3'] else 'outside'} `select`'s top 3."
            )
    lines += [
        "",
        "## Against the papers' claims",
        "",
        "Each verdict is one of: reproduced, contradicted, undecided (what is missing), or outside the paper's stated "
        "range (the range).",
        "",
    ]
    lines.append(f"- **Organisation is set early** (PGA paper): **{early_status}**: {early_text}.")
    if late_role is not None:
        lines.append(
            f"- **Collapse comes later** (PGA paper: small models lose alignment in late, non-final layers while loss "
            f"keeps improving): **{'reproduced' if collapsed else 'undecided'}**: {len(collapsed)} of {len(zones)} "
            f"checkpoints have a collapse zone (late non-final layers with z < {thresholds.collapse_threshold:g} while "
            f"an earlier layer has z > {thresholds.positive_z:g}, both decided on the 95% interval of z)"
            + (
                f", at {', '.join(step_name(z['step']) for z in collapsed)}"
                if collapsed
                else "; the paper's zones appear late in a long training (Pythia, 300B tokens), and this run has no "
                "checkpoint anywhere near that, so the data cannot decide"
            )
            + f". The last block ({late_role['layer']}) peaks at z = {_f(late_role['z_peak'])} (step "
            f"{late_role['peak_step']}) and ends at {_f(late_role['z_last'])}." + _lowest_block(z_rows)
        )
    if final_rows:
        low = min(final_rows, key=lambda r: r["token_dispersion"])
        lines.append(
            f"- **Dispersion over training**: token-level dispersion at `{final_layer}` starts at "
            f"{_f(final_rows[0]['token_dispersion'], 3)} at step 0 (the initialisation), falls to "
            f"{_f(low['token_dispersion'], 3)} at {step_name(low['step'])} and ends at "
            f"{_f(final_rows[-1]['token_dispersion'], 3)}; sample-level dispersion from "
            f"{_f(final_rows[0]['sample_dispersion'], 3)} to {_f(final_rows[-1]['sample_dispersion'], 3)}. A dip and "
            "recovery makes a single rank correlation over all checkpoints a poor summary."
        )
    lines.append(
        f"- **G tracks quality** (dispersion paper: higher G, lower perplexity): over all checkpoints "
        f"**{claim_verdict(everything)}**: Spearman(G, -perplexity) {correlation_text(everything)}"
        + (f"; `select` puts {step_name(everything['select_pick_step'])} first" if everything.get("select_pick") else "")
        + f". Over the late ones ({late['subset']}): **{claim_verdict(late)}**: {correlation_text(late)}."
    )
    if dispersion_agreement is not None:
        lines.append(
            f"- **Higher dispersion, lower perplexity** (dispersion paper): **{claim_verdict(dispersion_agreement)}**: "
            f"token-level dispersion at `{final_layer}` against -perplexity across checkpoints, Spearman "
            f"{correlation_text(dispersion_agreement)}."
        )
    lines += [""] + mechanism_lines(meta, tables, pga_settings, thresholds, settings)
    lines += [
        "",
        "## What a model this small can and cannot show",
        "",
        "- It can show the *shape* of a trajectory: when z first rises above chance at each depth, whether late",
        "  layers lose it again, and whether G moves with held-out perplexity, on real text and a real optimiser.",
        "- It cannot test the scale claim: the PGA paper's two regimes are about width (d <= 1024 against d >= 2048); one",
        f"  run at d = {train.hidden_size if train else '?'} sits far inside the small regime and has nothing to compare against;",
        f"  its restoration claim is stated for d >= 768, outside this run's d = {train.hidden_size if train else '?'}.",
        f"- k = {pga_settings.k} of d = {train.hidden_size if train else '?'} is a large share of the space (the paper used k = 100",
        "  of d >= 512), so readout and random subspaces overlap more; z values are not comparable in size with the paper's.",
        f"- {len(steps)} checkpoints of one seed are one trajectory: neighbouring checkpoints are not independent samples,",
        "  so both intervals on the Spearman are optimistic; over all checkpoints the comparison mixes the first",
        "  steps' collapse and recovery with the slow late improvement, which is why the late-only figure is the",
        "  sharper test of `select` (and with few late checkpoints it decides little).",
        "- Well under a million tokens is far from convergence (Pythia saw 300B); 'late' here means late in this run, not",
        "  the over-trained regime in which the paper's small models collapse. Learning-rate decay and training time are",
        "  confounded along the step axis.",
        "",
    ]
    return "\n".join(lines)


def mechanism_lines(meta: dict, tables: dict[str, list[dict]], pga_settings, thresholds, settings) -> list[str]:
    """The PGA paper's mechanism read over one run's checkpoints from the job's registered analyses' rows: spectral
    blindness, PC1's readout share against k/d, restoration by CCR rank and probe accuracy against z, each decided on
    its interval. Empty when the job planned none of them."""
    pga, spectral, pc1, probe = (tables.get(name, []) for name in ("pga", "spectral", "pc1", "probe"))
    if not pga:
        return []
    d = meta["train"]["hidden_size"] if meta.get("train") else None
    ranks = sorted({r["r"] for r in pga})
    config = (
        {"k": pga_settings.k, "r": pga_settings.r}
        if any(r["r"] == pga_settings.r and r["k"] == pga_settings.k for r in pga)
        else {"k": pga[0]["k"], "r": ranks[0]}
    )
    decide = SimpleNamespace(collapse_z=thresholds.collapse_threshold, positive_z=thresholds.positive_z)
    steps = sorted({r["step"] for r in pga})
    last = {r["run"]: steps[-1] for r in pga}
    lines = [
        "## The PGA paper's mechanism over training",
        "",
        f"Read from the job's registered analyses at every checkpoint x layer (PGA at CCR {', '.join(map(str, ranks))}, "
        "spectral metrics, PC1 readout share, the topic probe); every number carries its interval.",
        "",
    ]
    if spectral:
        flat = spectral_against_z(pga, spectral, config, settings.seed)
        lines += [
            f"### Spectral blindness: do the spectral metrics move when z moves? (k = {config['k']}, CCR-{config['r']})",
            "",
            "Spearman of z against each metric over every (checkpoint, block) point, 95% Fisher interval.",
            "",
        ]
        lines += markdown_table(flat, SPECTRAL_TABLE)
        lines += [
            "",
            "**Verdict**: **undecided** (the paper's claim is that spectral metrics stay flat inside collapse "
            "zones while z swings; this run has no collapse zone to read it in). Across all points: "
            + "; ".join(spectral_reading(flat))
            + ".",
            "",
        ]
    if pc1:
        k = pc1[0]["k"]
        lines += [
            f"### PC1's share of the readout subspace over steps (k = {k}, chance k/d = {pc1[0]['pc1_readout_chance']:.3f})",
            "",
            "Each layer's share [half-sample 95% interval, inside [0, 1]] at the first (step 0, the initialisation), "
            "middle and last checkpoint.",
            "",
        ]
        picks = [steps[0], steps[len(steps) // 2], steps[-1]]
        names = [n for _, n in sorted({(r["layer_index"], r["layer"]) for r in pc1})]
        table = [
            {
                "layer": n,
                **{
                    f"s{s}": next(
                        (with_interval(r, "pc1_readout_share", 3) for r in pc1 if r["layer"] == n and r["step"] == s), "n/a"
                    )
                    for s in picks
                },
            }
            for n in names
        ]
        lines += markdown_table(table, [("layer", "layer")] + [(f"step {s}", f"s{s}") for s in picks])
        counts = pc1_reading(pc1, last)
        below = sum(c["below"] for c in counts)
        lines += [
            "",
            "**Verdict** (last checkpoint, late non-final layers against chance k/d): "
            + (
                "**reproduced** (PC1 below chance in " + str(below) + " of them)"
                if below
                else "**undecided** (PC1 stays above chance; the paper ties its migration to collapse zones of trained "
                "models, and this run has none)"
            )
            + ". "
            + "; ".join(f"{c['below']} of {c['points']} below chance, {c['above']} above" for c in counts)
            + ".",
            "",
        ]
    if len(ranks) > 1:
        lines += [
            "### Restoration by CCR rank over steps",
            "",
            f"Lowest non-final z per checkpoint at each CCR rank (k = {config['k']}) [95% interval], and how many "
            f"trained (checkpoint, layer) points with z below {decide.collapse_z:g} at CCR-0 a higher rank lifts above "
            f"{decide.positive_z:g} (whole intervals).",
            "",
        ]
        table = []
        for step in steps:
            row = {"step": step_name(step) if step == 0 else step}
            for rank in ranks:
                at = [
                    r
                    for r in pga
                    if r["step"] == step
                    and r["r"] == rank
                    and r["k"] == config["k"]
                    and r["layer"] not in ("embed", "final_norm")
                ]
                low = min(at, key=lambda r: r["z"], default=None)
                row[f"r{rank}"] = f"{with_interval(low)} at {low['layer']}" if low else "n/a"
            table.append(row)
        lines += markdown_table(table, [("step", "step")] + [(f"CCR-{rank}", f"r{rank}") for rank in ranks])
        restored = restoration([r for r in pga if r["k"] == config["k"]], 0.0, decide)
        if restored:
            counts = restored[0]
            lines += [
                "",
                f"**Verdict**: **outside the paper's stated range** (it claims restoration for d >= 768; this run "
                f"has d = {d}). For the record: {counts['low_at_ccr0']} of {counts['points']} trained points fall "
                f"below {decide.collapse_z:g} at CCR-0; CCR-1 lifts {counts.get('organised_at_ccr1', 0)}, CCR-5 "
                f"{counts.get('organised_at_ccr5', 0)} and CCR-10 {counts.get('organised_at_ccr10', 0)} of them above "
                f"{decide.positive_z:g}.",
                "",
            ]
    if probe:
        z_of = {(r["step"], r["layer"]): r["z"] for r in pga if r["k"] == config["k"] and r["r"] == config["r"]}
        pairs = [(r["accuracy"], z_of[(r["step"], r["layer"])]) for r in probe if (r["step"], r["layer"]) in z_of]
        lines += [f"### Probe accuracy against z (k = {config['k']}, CCR-{config['r']})", ""]
        if len(pairs) >= 4:
            fit = spearman_with_ci(*map(list, zip(*pairs)), seed=0, method="fisher")
            if fit["note"]:
                lines += [
                    f"**Reading**: Spearman(accuracy, z) over {len(pairs)} points: {fit['rho']:+.2f} ({fit['note']}; "
                    f"{fit['p_method']} permutation p = {fit['p_perm']:.3g}).",
                    "",
                ]
            else:
                verdict = (
                    "accuracy rises with z"
                    if fit["lo"] > 0
                    else "accuracy falls as z rises"
                    if fit["hi"] < 0
                    else "no relation decided (the interval holds 0)"
                )
                lines += [
                    f"**Reading**: Spearman(accuracy, z) over {len(pairs)} (checkpoint, layer) points: "
                    f"{fit['rho']:+.2f} [{fit['lo']:+.2f}, {fit['hi']:+.2f}]: {verdict}.",
                    "",
                ]
        final = [r for r in probe if r["step"] == steps[-1]]
        lines += markdown_table(
            sorted(
                (
                    {
                        "layer": r["layer"],
                        "accuracy": with_interval(r, "accuracy", 3),
                        "chance": r.get("chance"),
                        "index": r["layer_index"],
                    }
                    for r in final
                ),
                key=lambda r: r["index"],
            ),
            [("layer", "layer"), ("accuracy at the last step [Wilson 95%]", "accuracy"), ("chance", "chance")],
        )
        lines.append("")
    return lines
