"""CLI command of the diagnostics (registered by raygeom.cli.root): ``diagnose`` (``probe`` and ``converge`` are the
probe and convergence analyses' generated commands).

Each command extracts the models it names (or reuses a complete extraction with
the same settings in ``--out``), runs its analysis on Ray, then writes Parquet
tables under ``<out>/results``, PNG plots under ``<out>/plots`` and a Markdown
summary; ``--report DIR`` also copies those into DIR (e.g. docs/results).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from raygeom.analyses.probe import ProbeParams
from raygeom.cli.flags import (
    PGA_OPTIONS,
    TEXT_GRID,
    CommandFlags,
    DiagnoseFlags,
    ReportOption,
    checked,
    grid_job,
    option,
    unique_specs,
)
from raygeom.errors import RaygeomError
from raygeom.report.figures import drawn_once, pyplot, save_figure
from raygeom.report.html import announce_report

Z_METRICS = (  # (column, label, log scale)
    ("rankme", "RankMe", False),
    ("alpha_req", "alpha-ReQ", False),
    ("condition_number", "condition number", True),
    ("isotropy", "isotropy (Mu & Viswanath)", False),
    ("pc1_readout_share", "PC1 readout share", False),
    ("probe_accuracy", "probe accuracy", False),
)


def _cli():
    from raygeom.cli import root as cli

    return cli


def _parse_ranks(text: str) -> tuple[int, ...]:
    try:
        ranks = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise RaygeomError(f"--ccr-ranks must be comma-separated integers, got '{text}'") from None
    if not ranks:
        raise RaygeomError("--ccr-ranks is empty")
    return tuple(sorted(set(ranks)))


def _extract_all(
    specs,
    corpus_name: str,
    n_samples: int,
    seed: int,
    layers: str,
    settings,
    out: Path,
    console,
    max_words: Optional[int] = None,
    align: bool = False,
    nll: bool = False,
):
    """Extract each model into the store (a complete matching extraction is reused). Returns (store, infos).
    ``nll``: also the per-sample NLL (the full-vocabulary LM head), for analyses that read it.

    With ``align``, every text is first cut where all the models' tokenizers still read it whole, so each
    model pools the last token of exactly the same text."""
    from raygeom.analyses.extraction import aligned_corpus, extract_models
    from raygeom.jobs.pipeline import progress_bar
    from raygeom.sources.corpus import load_corpus, truncate_words
    from raygeom.store.tree import Store

    corpus = truncate_words(load_corpus(corpus_name).sample(n_samples, seed), max_words)
    if align:
        corpus, n_cut = aligned_corpus(specs, corpus, settings.seq_len)
        console.print(
            f"aligned: {n_cut} of {len(corpus.texts)} texts cut at the longest character prefix that every "
            f"tokenizer reads within {settings.seq_len} tokens, so every model pools the same text end",
            highlight=False,
            markup=False,
        )
    store = Store(out)
    with progress_bar(console) as progress:

        def factory(label: str, total: int):
            task = progress.add_task(label, total=total)
            return lambda n: progress.advance(task, n)

        infos = extract_models(store, specs, corpus, settings, layers, nll=nll, progress=factory)
    for spec, info in [] if align else infos:
        cut = int(np.sum(store.read_samples(spec.slug, spec.revision, info["key"])["n_tokens"].to_numpy() >= settings.seq_len))
        if cut:
            console.print(
                f"note: {cut} of {len(corpus.texts)} texts reached --seq-len {settings.seq_len} tokens in {spec.name}, "
                "so that model read only a prefix of them (see --max-words)",
                highlight=False,
            )
    return store, corpus, infos


def _prepare(out: Path, address: Optional[str], num_cpus: Optional[int], console):
    from raygeom.store.tree import check_writable

    check_writable(out)
    _cli()._prepare_ray(address)
    from raygeom.engine import orchestrate

    with console.status("starting Ray" + (f" at {address}" if address else " locally")):
        try:
            orchestrate.start_ray(address, num_cpus)
        except Exception as error:  # ray.init raises a bare Exception when the node times out
            raise RaygeomError(
                f"could not start or reach Ray: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
            ) from None


def _fmt(value, spec=".3f") -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    return format(value, spec)


def _write_text(text: str, path: Path) -> Path:
    from raygeom.store.tree import atomic_write_text

    atomic_write_text(text, path)
    return path


def _copy_reports(paths: list[Path], report: Optional[Path]) -> None:
    if report is None:
        return
    report.mkdir(parents=True, exist_ok=True)
    for path in paths:
        temporary = report / f".{path.name}.tmp"
        shutil.copyfile(path, temporary)
        temporary.replace(report / path.name)


# ---------------------------------------------------------------- diagnose: plots and tables


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


def _z_cell(row: dict, rank: int) -> str:
    """z at CCR-rank with the 95 % half-width of its Monte-Carlo interval."""
    z, half = row.get(f"z_ccr{rank}"), row.get(f"z_half_width_ccr{rank}")
    return _fmt(z, "+.1f") + (f" ± {half:.1f}" if half is not None and half == half else "")


def _probe_cell(row: dict) -> str:
    low, high = row.get("probe_accuracy_lo"), row.get("probe_accuracy_hi")
    return _fmt(row.get("probe_accuracy")) + (f" ({low:.2f}-{high:.2f})" if low is not None else "")


def diagnostics_markdown(rows: list[dict], ranks: tuple[int, ...], params) -> str:
    from raygeom.numerics.layer_geometry import blindness_summary

    lines = []
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(f"{row['model']}@{row['revision']}", []).append(row)
    for label, group in groups.items():
        group = sorted(group, key=lambda r: r["layer_index"])
        first = group[0]
        nulls = (
            "nulls: auto, z ± 95% half-width"
            if getattr(params, "n_null_auto", False)
            else f"{params.n_null} nulls, z ± 95% half-width"
        )
        lines += [f"### {label}  (d={first['d']}, N={first['n']}, k={first['k']}, {nulls}, seed {params.seed})", ""]
        header = (
            ["layer", "depth"]
            + [f"z CCR-{r}" for r in ranks]
            + ["RankMe", "alpha-ReQ", "cond", "isotropy", "PC1 share (k/d)", "PC1 var", "probe acc", "loss~share rho"]
        )
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in group:
            cells = (
                [r["layer"], _fmt(r["relative_depth"], ".2f")]
                + [_z_cell(r, c) for c in ranks]
                + [
                    _fmt(r["rankme"], ".1f"),
                    _fmt(r["alpha_req"], ".2f"),
                    _fmt(r["condition_number"], ".3g"),
                    _fmt(r["isotropy"], ".3g"),
                    f"{_fmt(r['pc1_readout_share'])} ({r['pc1_readout_chance']:.3f})",
                    _fmt(r["pc1_variance_fraction"]),
                    _probe_cell(r),
                    _fmt(r.get("loss_share_spearman"), "+.2f"),
                ]
            )
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines += [
            f"CCR restoration (layers with z > 2 and z < -2, out of {len(group)}):",
            "",
            "| CCR-r | z > 2 | z < -2 | median z | min z (layer) | max z (layer) |",
            "|---|---|---|---|---|---|",
        ]
        for c in ranks:
            zs = np.array([r.get(f"z_ccr{c}", np.nan) for r in group])
            if not np.isfinite(zs).any():
                continue
            low, high = int(np.nanargmin(zs)), int(np.nanargmax(zs))
            lines.append(
                f"| {c} | {int(np.sum(zs > 2))} | {int(np.sum(zs < -2))} | {np.nanmedian(zs):+.1f} | "
                f"{zs[low]:+.1f} ({group[low]['layer']}) | {zs[high]:+.1f} ({group[high]['layer']}) |"
            )
        lines.append("")
        z_rank = 1 if 1 in ranks else ranks[0]
        z = [r.get(f"z_ccr{z_rank}", np.nan) for r in group]
        accuracy = np.array([r.get("probe_accuracy", np.nan) for r in group])
        negative = np.array(z) < -2
        if np.isfinite(accuracy).any():
            chance = np.nanmean([r.get("probe_chance", np.nan) for r in group])
            inside = f"{np.nanmean(accuracy[negative]):.3f}" if negative.any() else "-"
            outside = f"{np.nanmean(accuracy[~negative]):.3f}" if (~negative).any() else "-"
            lines += [
                f"Probe accuracy (majority class {chance:.3f}): mean {inside} over the {int(negative.sum())} layers "
                f"with z < -2 at CCR-{z_rank}, {outside} over the other {int((~negative).sum())}.",
                "",
            ]
        lines += [
            f"Spectral blindness over these layers, against z at CCR-{z_rank} (z range = max - min of z; "
            "relative range = (max - min) / median of the metric):",
            "",
            "| metric | z range | metric relative range | Spearman with z |",
            "|---|---|---|---|",
        ]
        for column, label_, _ in Z_METRICS:
            values = [r.get(column, np.nan) for r in group]
            try:
                summary = blindness_summary(z, values)
            except RaygeomError:
                continue
            lines.append(
                f"| {label_} | {summary['z_range']:.1f} | {summary['metric_relative_range']:.3g} | {_fmt(summary['spearman_with_z'], '+.2f')} |"
            )
        lines.append("")
    return "\n".join(lines)


def _print_layers(console, rows: list[dict], ranks: tuple[int, ...]) -> None:
    from rich.table import Table

    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(f"{row['model']}@{row['revision']}", []).append(row)
    for label, group in groups.items():
        table = Table(
            title=f"Diagnostics  {label}  (d={group[0]['d']}, N={group[0]['n']}, k={group[0]['k']})", title_justify="left"
        )
        for name in ["layer", *[f"z CCR-{r}" for r in ranks], "RankMe", "alpha", "isotropy", "PC1 share", "k/d", "probe"]:
            table.add_column(name, justify="left" if name == "layer" else "right")
        for r in sorted(group, key=lambda x: x["layer_index"]):
            table.add_row(
                r["layer"],
                *[_z_cell(r, c) for c in ranks],
                _fmt(r["rankme"], ".1f"),
                _fmt(r["alpha_req"], ".2f"),
                _fmt(r["isotropy"], ".3g"),
                _fmt(r["pc1_readout_share"]),
                _fmt(r["pc1_readout_chance"]),
                _fmt(r.get("probe_accuracy")),
            )
        console.print(table)


# ---------------------------------------------------------------- commands

# The grid and PGA flags are pga's (raygeom.cli.flags): one declaration, one default each.
MaxWordsOption = option(CommandFlags, "max_words")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the raygeom app."""
    cli = _cli()

    @app.command()
    @checked(grid=(*TEXT_GRID, *PGA_OPTIONS))
    def diagnose(
        max_words: Optional[str] = MaxWordsOption,
        ccr_ranks: Optional[str] = option(DiagnoseFlags, "ccr_ranks"),
        sample_ccr: Optional[str] = option(DiagnoseFlags, "sample_ccr"),
        probe: Optional[bool] = option(DiagnoseFlags, "probe", names="--probe/--no-probe"),
        probe_test_fraction: Optional[str] = option(ProbeParams, "test_fraction", flag="--probe-test-fraction"),
        report: Optional[str] = ReportOption,
        given: frozenset = frozenset(),
        **grid,
    ):
        """Per-layer diagnostics: z at several CCR ranks, spectral metrics, PC1 readout share, loss beside geometry, probes."""
        g = grid
        try:
            _diagnose(
                grid_job("diagnose", {**grid, "given": given}),
                max_words,
                g["k"],
                ccr_ranks,
                g["n_null"],
                g["null_chunks"],
                sample_ccr,
                probe,
                probe_test_fraction,
                g["seed"],
                report,
                g["address"],
                g["num_cpus"],
                z_half_width=g["z_half_width"],
                z_rel_width=g["z_rel_width"],
                n_null_cap=g["n_null_cap"],
                n_null_decide=g["n_null_decide"],
            )
        except RaygeomError as error:
            cli._fail(str(error))


def _check_labels(corpus_name: str) -> None:
    from raygeom.sources.corpus import load_corpus

    if load_corpus(corpus_name).labels is None:
        raise RaygeomError(
            f"corpus '{corpus_name}' has no labels, so there is nothing to probe "
            "(use 'bbc', a JSONL/Parquet file with a 'label' field, or hf:ag_news)"
        )


def _diagnose(
    job,
    max_words,
    k,
    ccr_ranks,
    n_null,
    null_chunks,
    sample_ccr,
    probe,
    probe_test_fraction,
    seed,
    report,
    address,
    num_cpus,
    z_half_width=0.25,
    n_null_cap=1000,
    z_rel_width=0.05,
    n_null_decide=500,
):
    from raygeom.report.figures import write_rows

    cli = _cli()
    console = cli.console
    from raygeom.params import n_null_settings

    params_kwargs = dict(
        k=k,
        ccr_ranks=_parse_ranks(ccr_ranks),
        **n_null_settings(n_null),
        null_chunks=null_chunks,
        seed=seed,
        z_half_width=z_half_width,
        z_rel_width=z_rel_width,
        n_null_cap=n_null_cap,
        n_null_decide=n_null_decide,
        sample_ccr=sample_ccr,
        probe=probe,
        probe_test_fraction=probe_test_fraction,
    )
    specs, out = unique_specs(job), Path(job.out)
    if probe:
        _check_labels(job.corpus)
    _prepare(out, address, num_cpus, console)
    from raygeom.analyses import diagnostics
    from raygeom.jobs.pipeline import progress_bar

    params = diagnostics.DiagnosticsParams(**params_kwargs)
    store, _, infos = _extract_all(
        specs, job.corpus, job.n_samples, job.sample_seed, job.layers, job.extraction, out, console, max_words, nll=True
    )
    merged, samples, parts = [], [], {"spectral": [], "sample_geometry": [], "pga": [], "probe": []}
    with progress_bar(console) as progress:
        for spec, info in infos:
            task = progress.add_task(f"diagnose {spec.name}@{spec.revision}", total=diagnostics.units(info["layers"], params))
            result = diagnostics.run_diagnostics(
                store,
                spec.slug,
                spec.revision,
                info["layers"],
                params,
                progress=lambda n, t=task: progress.advance(t, n),
                key=info["key"],
            )
            merged += result["layers"]
            for name in parts:
                parts[name] += result[name]
            samples += diagnostics.read_sample_rows(
                store, spec.slug, spec.revision, info["layers"], params.k, params.sample_ccr, info["key"]
            )
    from raygeom.store.tree import encode_segment

    results, plots = store.root / "results", store.root / "plots"
    written = [write_rows(merged, results / "diagnostics_layers.parquet")]
    for name, rows in parts.items():
        if rows:
            written.append(write_rows(rows, results / f"diagnostics_{name}.parquet"))
    written.append(write_rows(samples, results / "diagnostics_samples.parquet"))
    for spec, _ in infos:
        rows = [r for r in merged if r["model"] == spec.slug and r["revision"] == spec.revision]
        z_rank = 1 if 1 in params.ccr_ranks else params.ccr_ranks[0]
        written.append(
            plot_diagnostics(
                rows,
                plots / f"diagnostics_{encode_segment(f'{spec.slug}@{spec.revision}')}.png",
                f"{spec.name}@{spec.revision}: Subspace PGA z beside spectral metrics and probes",
                z_rank,
            )
        )
    written.append(plot_restoration(merged, params.ccr_ranks, plots / "ccr_restoration.png", "CCR restoration: z at CCR-r"))
    written.append(_write_text(diagnostics_markdown(merged, params.ccr_ranks, params), results / "diagnostics.md"))
    _print_layers(console, merged, params.ccr_ranks)
    _copy_reports([p for p in written if p.suffix in (".png", ".md", ".parquet")], report)
    console.print(f"tables: {results}\nplots:  {plots}" + (f"\nreport: {report}" if report else ""))
    announce_report(store.root, console)
