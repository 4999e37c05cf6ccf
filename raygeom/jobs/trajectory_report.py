"""docs/results/trajectory.md, regenerated from a trajectory job's store: the figures (copied next to it), the
tables, and each of the papers' claims held against what this run measured."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

from raygeom.report.figures import save_text


def _f(value, digits: int = 2, sign: bool = False) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _spearman_reading(s: dict) -> str:
    return (f"{_f(s['spearman'], 3, True)} (n = {s['n']}; 95% Fisher-z, Bonett-Wright variance [{_f(s['fisher_lo'], 2, True)}, {_f(s['fisher_hi'], 2, True)}], "
            f"bootstrap over checkpoints [{_f(s['boot_lo'], 2, True)}, {_f(s['boot_hi'], 2, True)}])")


def _verdict_early(organisation: list[dict], last_step: int) -> tuple[str, str]:
    """'Set early' read as: the middle layer reaches half of its peak z within the first quarter of the run."""
    middle = next((o for o in organisation if o["role"] == "middle"), None)
    if middle is None or middle["z_peak"] is None or middle["z_peak"] <= 2:
        return "not seen", "the middle layer never reaches z > 2, so there is no organisation to date"
    half = middle["half_peak_step"]
    share = half / last_step if last_step else float("nan")
    status = "seen" if half is not None and share <= 0.25 else "not seen"
    first = middle.get("first_organised_step")
    return status, (f"the middle layer ({middle['layer']}) reaches half of its peak z ({_f(middle['z_peak'])}, at step "
                    f"{middle['peak_step']}) by step {half}, {share:.0%} of the {last_step} steps (read as early: within "
                    f"the first quarter); it first exceeds z = 2 at step {first if first is not None else 'never'}")


def _lowest_block(z_rows: list[dict]) -> str:
    blocks = [r for r in z_rows if r["layer"].startswith("block_") and r["z"] == r["z"]]
    if not blocks:
        return ""
    low = min(blocks, key=lambda r: r["z"])
    if low["z"] >= 0:
        return f" No block has z below 0 (lowest {_f(low['z'], 2, True)})."
    organised = min((r["step"] for r in blocks if r["z"] > 2), default=None)
    when = ("before any block is organised (z > 2 first at step " + str(organised) + ")"
            if organised is None or low["step"] < organised else "after organisation had appeared")
    return f" The lowest z of any block is {_f(low['z'], 2, True)} ({low['layer']}, step {low['step']}), {when}."


def _verdict(lo: float, hi: float) -> str:
    """What a 95% interval of a rank correlation (positive = the claim) says."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "undecided (too few checkpoints)"
    if lo > 0:
        return "supported"
    if hi < 0:
        return "contradicted on this run"
    return "undecided (the interval includes 0)"


def _wall_line(outputs: dict, load: float) -> str:
    full, swept = outputs.get("full_run"), outputs["swept"]
    line = "- **Wall time**: "
    if full:
        line += (f"the whole job, training included, took {full['wall_s'] / 60:.1f} min (training {full['train_wall_s'] / 60:.1f} min; "
                 f"finished {full['finished']}, {full['cpus']} CPUs, 1-minute load average {full['load_1min_at_end']:.1f} at the end: "
                 "other engineers' jobs shared the cores). ")
    line += (f"This regeneration took {outputs['wall_s'] / 60:.1f} min and computed {swept.computed_units} PGA units and "
             f"{outputs['computed_dispersion_units']} dispersion units (a rerun computes none).")
    return line


def rank_interval(x, y, n_boot: int, seed: int) -> dict:
    """Spearman with two 95% intervals (numerics.uncertainty): Fisher z with the Bonett-Wright variance, and a
    percentile bootstrap over the pairs (here: over checkpoints)."""
    from raygeom.numerics.uncertainty import spearman_with_ci

    fisher = spearman_with_ci(x, y, seed=seed, method="fisher")
    boot = spearman_with_ci(x, y, seed=seed, method="bootstrap", n_boot=n_boot)
    return {"spearman": fisher["rho"], "fisher_lo": fisher["lo"], "fisher_hi": fisher["hi"], "boot_lo": boot["lo"],
            "boot_hi": boot["hi"], "n_boot": n_boot}


def write_report(path: str | Path, job, outputs: dict, by_step: list[dict], z_rows: list[dict], picked: dict[str, str]) -> Path:
    import pyarrow.parquet as pq


    path = Path(path)
    figures_dir = path.parent / path.stem
    figures_dir.mkdir(parents=True, exist_ok=True)
    links = {}
    for name, figure in outputs["figures"].items():
        if figure is not None and Path(figure).is_file():
            target = figures_dir / f"{name}.png"
            shutil.copyfile(figure, target)
            links[name] = f"{figures_dir.name}/{name}.png"
    rows, summary, organisation = outputs["rows"], outputs["summary"], outputs["organisation"]
    swept = outputs["swept"]
    settings = job.trajectory
    train = job.train.settings if job.train is not None else None
    steps = sorted({r["step"] for r in z_rows})
    last_step = steps[-1] if steps else 0
    log_until = job.train.log_until if job.train is not None else 512
    zones = pq.read_table(swept.collapse).to_pylist() if Path(swept.collapse).is_file() else []
    collapsed = [z for z in zones if z.get("collapsed")]
    everything, late = summary[0], summary[1]
    final_layer = picked.get("final")
    final_rows = sorted((r for r in by_step if r["layer"] == final_layer), key=lambda r: r["step"])
    perplexity = {r["revision"]: r["heldout_perplexity"] for r in rows}
    dispersion_agreement = None
    paired = [(r["token_dispersion"], -perplexity[r["revision"]]) for r in final_rows if r["revision"] in perplexity]
    if len(paired) >= 4:
        dispersion_agreement = rank_interval(*zip(*paired), settings.bootstrap, settings.seed)
    early_status, early_text = _verdict_early(organisation, last_step)
    late_role = next((o for o in organisation if o["role"] == "late"), None)
    flagged = [r["revision"] for r in rows if r["weights_flag"]]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")

    lines = [
        "# A training trajectory on the laptop: geometry over a small GPT-NeoX's training",
        "",
        "Regenerated by `raygeom run jobs/trajectory.toml` (its `[trajectory] report`); every number below is read from",
        f"`{job.out}/results/` (`sweep_pga.parquet`, `trajectory_checkpoints.parquet`, `trajectory_agreement.parquet`,",
        "`trajectory_dispersion.parquet`, `collapse.parquet`). Edit the job, not this page.",
        "",
        "## What ran",
        "",
    ]
    if train is not None:
        lines += [
            f"- **Model**: GPT-NeoX trained from scratch, d = {train.hidden_size}, {train.n_layers} blocks, {train.n_heads} heads, "
            f"a {train.vocab_size}-token BPE vocabulary trained on the training articles, context {train.seq_len}.",
            f"- **Data**: BBC News, {1 - train.heldout_fraction:.0%} of the articles for training, {train.heldout_fraction:.0%} held out "
            f"(never trained on); {train.steps} steps of {train.batch_size} x {train.seq_len} tokens "
            f"({train.steps * train.batch_size * train.seq_len / 1e6:.1f}M tokens), AdamW lr {train.lr:g}, cosine schedule, "
            f"seed {train.seed}, " + ("one Ray task (one worker)." if train.workers == 1 else f"Ray Train ({train.workers} data-parallel workers)."),
            f"- **Checkpoints**: {len(steps)} (`step0`, then 1, 2, 4, ... {log_until}, then every {job.train.save_every} steps): "
            f"{', '.join(str(s) for s in steps)}. Each is a `save_pretrained` directory (model + tokenizer) with its held-out "
            "evaluation.",
        ]
    lines += [
        f"- **PGA sweep**: every checkpoint x every layer, N = {job.n_samples} held-out articles, last-token pooling, "
        f"k = {job.pga.k}, CCR-{job.pga.r}, {job.pga.n_null} nulls, seed {job.pga.seed}.",
        f"- **Dispersion**: {settings.chunks_per_domain} chunks of {settings.chunk_len} tokens per topic from the held-out "
        f"articles; the dispersion gap G at `{settings.gap_layer}` with domain tokens `{settings.domain_tokens}` "
        "(what `raygeom select` ranks by).",
        _wall_line(outputs, load),
        "",
        "## Subspace PGA over step x layer",
        "",
    ]
    if "heatmap" in links:
        lines += [f"![z heatmap]({links['heatmap']})", ""]
    if "z_vs_step" in links:
        lines += [f"![z against step]({links['z_vs_step']})", ""]
    lines += [f"| layer | role | z at step 0 | first step with z > {job.sweep.positive_z:g} | half of peak by step | peak z | at step "
              "| z at the last step |", "|---|---|---|---|---|---|---|---|"]
    for o in organisation:
        first = o.get("first_organised_step")
        lines.append(f"| {o['layer']} | {o['role']} | {_f(o['z_first'], 2, True)} | {first if first is not None else 'never'} | "
                     f"{o['half_peak_step'] if o['half_peak_step'] is not None else 'n/a'} | {_f(o['z_peak'], 2, True)} | "
                     f"{o['peak_step']} | {_f(o['z_last'], 2, True)} |")
    uncertainty = bool(z_rows) and all(r.get("z_lo") is not None and r.get("z_hi") is not None for r in z_rows)
    lines += ["", ("Bands are the z intervals stored with each unit." if uncertainty else
                   f"No per-unit uncertainty columns existed in the sweep table when this page was generated; with {job.pga.n_null} "
                   f"nulls the Monte-Carlo standard error of z is roughly sqrt((1 + z^2/2)/{job.pga.n_null}), about "
                   f"{math.sqrt(1 / job.pga.n_null):.2f} at z = 0 and {math.sqrt(51 / job.pga.n_null):.2f} at z = 10."), ""]
    if flagged:
        lines += [f"Checkpoints whose weights duplicate another's (hatched / dotted): {', '.join(flagged)}.", ""]
    lines += ["## Dispersion over steps", ""]
    if "dispersion_vs_step" in links:
        lines += [f"![dispersion against step]({links['dispersion_vs_step']})", ""]
    lines += ["| step | token dispersion | sample dispersion | held-out perplexity |", "|---|---|---|---|"]
    for r in final_rows:
        lines.append(f"| {r['step']} | {_f(r['token_dispersion'], 4)} | {_f(r['sample_dispersion'], 4)} | "
                     f"{_f(perplexity.get(r['revision']), 2)} |")
    lines += ["", f"(layer `{final_layer}`; all layers in `trajectory_dispersion.parquet`)", "",
              "## Does `select` pick the best checkpoints?", ""]
    if "gap_vs_perplexity" in links:
        lines += [f"![G and perplexity]({links['gap_vs_perplexity']})", ""]
    source = rows[0]["perplexity_source"] if rows else "n/a"
    lines += [f"Held-out perplexity: {'the trainer evaluation saved with each checkpoint' if source == 'trainer' else 'of the held-out chunks G is measured on'}. "
              "Agreement is Spearman(G, -perplexity): +1 when `select`'s order is the perplexity order.", "",
              "| revision | step | G | select rank | held-out perplexity | perplexity rank |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['revision']} | {r['step']} | {_f(r['gap'], 4, True)} | {r['select_rank']} | {_f(r['heldout_perplexity'], 2)} | "
                     f"{r['perplexity_rank']} |")
    lines += ["", f"- Over all checkpoints: {_spearman_reading(everything)}.", f"- Over the late ones ({late['subset']}): {_spearman_reading(late)}."]
    for s in summary:
        if s.get("select_pick"):
            lines.append(f"- {s['subset']}: `select` puts {s['select_pick']} first (perplexity {_f(s['select_pick_perplexity'])}, "
                         f"rank {s['pick_perplexity_rank']} of {s['n']}); the lowest perplexity is {s['best_by_perplexity']} "
                         f"({_f(s['best_perplexity'])}), {'inside' if s['best_in_select_top3'] else 'outside'} `select`'s top 3.")
    lines += ["", "## Against the papers' claims", ""]
    lines.append(f"- **Organisation is set early** (PGA paper): {early_status}: {early_text}.")
    if late_role is not None:
        lines.append(f"- **Collapse comes later** (PGA paper: small models lose alignment in late, non-final layers while loss "
                     f"keeps improving): {len(collapsed)} of {len(zones)} checkpoints have a collapse zone (late non-final "
                     f"layers with z < {job.sweep.collapse_threshold:g} while an earlier layer has z > {job.sweep.positive_z:g}, "
                     "both decided on the 95% interval of z where the sweep stored one)"
                     + (f", at steps {', '.join(str(z['step']) for z in collapsed)}" if collapsed else "")
                     + f"; the last block ({late_role['layer']}) peaks at z = {_f(late_role['z_peak'])} (step {late_role['peak_step']}) "
                     f"and ends at {_f(late_role['z_last'])}." + _lowest_block(z_rows))
    if final_rows:
        low = min(final_rows, key=lambda r: r["token_dispersion"])
        lines.append(f"- **Dispersion over training**: token-level dispersion at `{final_layer}` starts at "
                     f"{_f(final_rows[0]['token_dispersion'], 3)}, falls to {_f(low['token_dispersion'], 3)} at step {low['step']} "
                     f"and ends at {_f(final_rows[-1]['token_dispersion'], 3)}; sample-level dispersion from "
                     f"{_f(final_rows[0]['sample_dispersion'], 3)} to {_f(final_rows[-1]['sample_dispersion'], 3)}. A dip and "
                     "recovery makes a single rank correlation over all checkpoints a poor summary.")
    lines.append(f"- **G tracks quality** (dispersion paper): {_verdict(everything['fisher_lo'], everything['fisher_hi'])}: "
                 f"Spearman(G, -perplexity) {_f(everything['spearman'], 2, True)} over all checkpoints "
                 f"(Fisher [{_f(everything['fisher_lo'], 2, True)}, {_f(everything['fisher_hi'], 2, True)}]); over the late ones "
                 f"{_f(late['spearman'], 2, True)}, {_verdict(late['fisher_lo'], late['fisher_hi'])}.")
    if dispersion_agreement is not None:
        lines.append(f"- **Higher dispersion, lower perplexity** (dispersion paper): "
                     f"{_verdict(dispersion_agreement['fisher_lo'], dispersion_agreement['fisher_hi'])}: token-level dispersion at `{final_layer}` "
                     f"against -perplexity across checkpoints, Spearman {_f(dispersion_agreement['spearman'], 2, True)} "
                     f"(Fisher [{_f(dispersion_agreement['fisher_lo'], 2, True)}, {_f(dispersion_agreement['fisher_hi'], 2, True)}]).")
    lines += [""] + mechanism_lines(job)
    lines += [
        "",
        "## What a model this small can and cannot show",
        "",
        "- It can show the *shape* of a trajectory: when z first rises above chance at each depth, whether late",
        "  layers lose it again, and whether G moves with held-out perplexity, on real text and a real optimiser.",
        "- It cannot test the scale claim: the PGA paper's two regimes are about width (d <= 1024 against d >= 2048); one",
        f"  run at d = {train.hidden_size if train else '?'} sits far inside the small regime and has nothing to compare against.",
        f"- k = {job.pga.k} of d = {train.hidden_size if train else '?'} is a large share of the space (the paper used k = 100",
        "  of d >= 512), so readout and random subspaces overlap more; z values are not comparable in size with the paper's.",
        f"- {len(steps)} checkpoints of one seed are one trajectory: neighbouring checkpoints are not independent samples,",
        "  so both intervals on the Spearman are optimistic; over all checkpoints the comparison mixes the first",
        "  steps' collapse and recovery with the slow late improvement, which is why the late-only figure is the",
        "  sharper test of `select` (and with few late checkpoints it decides little).",
        "- A few million tokens is far from convergence (Pythia saw 300B); 'late' here means late in this run, not the",
        "  over-trained regime in which the paper's small models collapse. Learning-rate decay and training time are",
        "  confounded along the step axis.",
        "",
    ]
    save_text("\n".join(lines), path)
    return path


def mechanism_lines(job) -> list[str]:
    """The PGA paper's mechanism read over one run's checkpoints from the job's registered analyses ([analyses.*]):
    spectral blindness, PC1's readout share against k/d, restoration by CCR rank and probe accuracy against z, each
    decided on its interval. Empty when the job plans none of them."""
    from types import SimpleNamespace

    from raygeom.jobs.width import (job_rows, markdown_table, pc1_reading, restoration, spectral_against_z,
                                    spectral_reading, with_interval)
    from raygeom.numerics.uncertainty import spearman_with_ci
    from raygeom.store.tree import Store

    if job.train is None or not job.planned():
        return []
    rows = job_rows(job, Store(job.out))
    pga, spectral, pc1, probe = (rows.get(name, []) for name in ("pga", "spectral", "pc1", "probe"))
    if not pga:
        return []
    ranks = sorted({r["r"] for r in pga})
    config = {"k": job.pga.k, "r": job.pga.r} if any(r["r"] == job.pga.r and r["k"] == job.pga.k for r in pga) else \
        {"k": pga[0]["k"], "r": ranks[0]}
    decide = SimpleNamespace(collapse_z=job.sweep.collapse_threshold, positive_z=job.sweep.positive_z)
    steps = sorted({r["step"] for r in pga})
    last = {r["run"]: steps[-1] for r in pga}
    lines = ["## The PGA paper's mechanism over training", "",
             f"Read from the job's registered analyses at every checkpoint x layer (PGA at CCR {', '.join(map(str, ranks))}, "
             "spectral metrics, PC1 readout share, the topic probe); every number carries its interval.", ""]
    if spectral:
        flat = spectral_against_z(pga, spectral, config, job.trajectory.seed)
        lines += [f"### Spectral blindness: do the spectral metrics move when z moves? (k = {config['k']}, CCR-{config['r']})", "",
                  "Spearman of z against each metric over every (checkpoint, block) point, 95% Fisher interval.", ""]
        lines += markdown_table(flat, [("points", "points"), ("z range", "z_range"), ("RankMe", "rankme"),
                                       ("alpha-ReQ", "alpha_req"), ("isotropy", "isotropy")])
        lines += ["", "**Reading**: " + "; ".join(spectral_reading(flat)) + ".", ""]
    if pc1:
        k = pc1[0]["k"]
        lines += [f"### PC1's share of the readout subspace over steps (k = {k}, chance k/d = {pc1[0]['pc1_readout_chance']:.3f})", "",
                  "Each layer's share [half-sample 95% interval] at the first, middle and last checkpoint.", ""]
        picks = [steps[0], steps[len(steps) // 2], steps[-1]]
        names = [n for _, n in sorted({(r["layer_index"], r["layer"]) for r in pc1})]
        table = [{"layer": n, **{f"s{s}": next((with_interval(r, "pc1_readout_share", 3) for r in pc1
                                                if r["layer"] == n and r["step"] == s), "n/a") for s in picks}} for n in names]
        lines += markdown_table(table, [("layer", "layer")] + [(f"step {s}", f"s{s}") for s in picks])
        lines += ["", "**Reading** (last checkpoint): " + "; ".join(pc1_reading(pc1, last)) + ".", ""]
    if len(ranks) > 1:
        lines += ["### Restoration by CCR rank over steps", "",
                  f"Lowest non-final z per checkpoint at each CCR rank (k = {config['k']}) [95% interval], and how many "
                  f"(checkpoint, layer) points with z below {decide.collapse_z:g} at CCR-0 a higher rank lifts above "
                  f"{decide.positive_z:g} (whole intervals).", ""]
        table = []
        for step in steps:
            row = {"step": step}
            for rank in ranks:
                at = [r for r in pga if r["step"] == step and r["r"] == rank and r["k"] == config["k"]
                      and r["layer"] not in ("embed", "final_norm")]
                low = min(at, key=lambda r: r["z"], default=None)
                row[f"r{rank}"] = f"{with_interval(low)} at {low['layer']}" if low else "n/a"
            table.append(row)
        lines += markdown_table(table, [("step", "step")] + [(f"CCR-{rank}", f"r{rank}") for rank in ranks])
        restored = restoration([r for r in pga if r["k"] == config["k"]], 0.0, decide)
        if restored:
            counts = restored[0]
            lines += ["", f"**Reading**: {counts['low_at_ccr0']} of {counts['points']} points fall below "
                          f"{decide.collapse_z:g} at CCR-0; CCR-1 lifts {counts.get('organised_at_ccr1', 0)}, CCR-5 "
                          f"{counts.get('organised_at_ccr5', 0)} and CCR-10 {counts.get('organised_at_ccr10', 0)} of them above "
                          f"{decide.positive_z:g}.", ""]
    if probe:
        z_of = {(r["step"], r["layer"]): r["z"] for r in pga if r["k"] == config["k"] and r["r"] == config["r"]}
        pairs = [(r["accuracy"], z_of[(r["step"], r["layer"])]) for r in probe if (r["step"], r["layer"]) in z_of]
        lines += [f"### Probe accuracy against z (k = {config['k']}, CCR-{config['r']})", ""]
        if len(pairs) >= 4:
            fit = spearman_with_ci(*map(list, zip(*pairs)), seed=0, method="fisher")
            verdict = ("accuracy rises with z" if fit["lo"] > 0 else "accuracy falls as z rises" if fit["hi"] < 0
                       else "no relation decided (the interval holds 0)")
            lines += [f"**Reading**: Spearman(accuracy, z) over {len(pairs)} (checkpoint, layer) points: "
                      f"{fit['rho']:+.2f} [{fit['lo']:+.2f}, {fit['hi']:+.2f}]: {verdict}.", ""]
        final = [r for r in probe if r["step"] == steps[-1]]
        lines += markdown_table(sorted(({"layer": r["layer"], "accuracy": with_interval(r, "accuracy", 3), "chance": r.get("chance"),
                                         "index": r["layer_index"]} for r in final), key=lambda r: r["index"]),
                                [("layer", "layer"), ("accuracy at the last step [95%]", "accuracy"), ("chance", "chance")])
        lines.append("")
    return lines
