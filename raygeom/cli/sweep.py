"""CLI commands for sweeps: `raygeom plan JOB` and `raygeom status JOB` (registered by raygeom.cli.root).

Both read the job file and the store only: no Ray, no model weights. `raygeom run JOB` runs a sweep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from raygeom.analyses import registry
from raygeom.cli.consoles import output_width
from raygeom.cli.flags import GridSettings, checked, option
from raygeom.cli.flags import fail as _fail
from raygeom.errors import RaygeomError
from raygeom.jobspec import SweepSettings

console = Console(width=output_width())


def _job(job_file: Path, out: Optional[Path]):
    """The job as `raygeom run` would run it, after every refusal run makes before its first forward pass."""
    from raygeom.jobs.load import hub_revision_lists
    from raygeom.jobs.preflight import preflight
    from raygeom.jobspec import load_job

    job = hub_revision_lists(load_job(job_file).with_overrides(out=str(out) if out else None), console)
    preflight(job, console)
    return job


def _load(job):
    from raygeom.jobs import plan as sweep
    from raygeom.store.tree import Store

    return job, sweep.build_plan(job, Store(job.out))


def _revision_span(revisions) -> str:
    names = [r.spec.revision for r in revisions]
    return names[0] if len(names) == 1 else f"{len(names)}: {names[0]} .. {names[-1]}"


def _show_training(job) -> bool:
    """The runs [train] will make (a grid: one per variant), whether each is trained, and for those that are not
    the time it should take, measured from a few steps here. Returns True when there is nothing more to plan: a
    job whose [train] has not run has no checkpoints and no held-out texts yet, so what follows is only counted."""
    from raygeom.analyses.train import estimate_training_seconds
    from raygeom.jobs.plan import format_seconds
    from raygeom.jobs.train import completed_trajectory

    if not job.trains:
        return False
    table = Table(title=escape(f"Plan {job.name}: [train] runs"), title_justify="left")
    for name in ("run", "d", "heads", "blocks", "seed", "steps", "checkpoints", "status", "train time"):
        table.add_column(name, justify="left" if name in ("run", "status") else "right")
    units = 0
    pooled = [item for item in job.planned() if item.spec.extraction == "pooled"]  # per layer; the others per checkpoint
    own = len(job.planned()) - len(pooled)
    with console.status("timing a few training steps per run to estimate the time of the runs to train"):
        for run in job.trains:
            plan, settings = run.plan(), run.settings
            trained = completed_trajectory(plan, plan.key(settings)) is not None
            estimate = "" if trained else f"~{format_seconds(estimate_training_seconds(settings, len(plan.steps)))}"
            table.add_row(
                run.variant or Path(run.run_dir).name,
                str(settings.hidden_size),
                str(settings.n_heads),
                str(settings.n_layers),
                str(settings.seed),
                f"{settings.steps:,}",
                str(len(plan.steps)),
                "trained" if trained else "to train",
                estimate,
            )
            units += len(plan.steps) * (settings.n_layers + 2) * len(pooled)
    console.print(table)
    if (Path(job.train.run_dir) / "heldout.jsonl").is_file():
        return False
    shape = sorted({(len(run.plan().steps), run.settings.n_layers + 2) for run in job.trains})
    grid = (f"{len(job.trains)} runs x " if len(job.trains) > 1 else "") + (
        f"{shape[0][0]} checkpoints x {shape[0][1]} layers" if len(shape) == 1 else "their checkpoints x layers"
    )
    console.print(
        f"then: {grid} x {len(pooled)} planned analyses -> {units:,} units (N={job.n_samples}); 0 done"
        + (f"; and {own} analyses with an extraction of their own at every checkpoint" if own else ""),
        highlight=False,
        markup=False,
    )
    console.print(
        "cost of the analyses: nothing measured yet; `raygeom run` trains first, then plan again", highlight=False, markup=False
    )
    return True


def print_per_analysis(plan) -> None:
    """Units and progress per planned analysis (each grid point of an analysis on its own line)."""
    per = plan.per_analysis()
    if len(per) <= 1:  # one analysis: the grid line says it all
        return
    table = Table(title="Per analysis", title_justify="left")
    for name in ("analysis", "units", "done", "to compute"):
        table.add_column(name, justify="left" if name == "analysis" else "right")
    for name, (total, done) in per.items():
        table.add_row(escape(name), f"{total:,}", f"{done:,}", f"{total - done:,}")
    console.print(table)


def print_passes(job, plan) -> None:
    """The forward passes per (model, revision) the job's analyses share (raygeom.jobs.passes), what each reads and
    serves, and how many the store holds already."""
    from raygeom.jobs import passes

    planned = passes.job_passes(job)
    if not planned:
        return
    keys = {(r.spec.slug, r.spec.revision): r.key for r in plan.revisions}
    specs = [r.spec for r in plan.revisions]
    stored = passes.stored_passes(plan.store, job, specs, lambda spec: keys[(spec.slug, spec.revision)])
    held = [sum(stored[(spec.slug, spec.revision, index)] for spec in specs) for index in range(len(planned))]
    lines = [
        f"forward passes: {len(planned)} per (model, revision), {len(planned) * len(specs):,} in all; "
        f"{sum(held):,} stored, {len(planned) * len(specs) - sum(held):,} to run"
    ]
    for one, count in zip(planned, held):
        lines.append(f"  {one.kind} ({count:,} of {len(specs):,} stored): {one.why}; serves {', '.join(one.serves)}")
    console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)


def _headline(job) -> str:
    """Each planned analysis's :attr:`~raygeom.analyses.registry.Analysis.headline` settings as the job gives them: one
    value, or the grid's values (``pga k=8, r = 0, 1, 5, n_null=20, seed=0``)."""

    def said(name: str, values: list) -> str:
        return f"{name}={values[0]}" if len(values) == 1 else f"{name} = {', '.join(map(str, values))}"

    parts = []
    for name in dict.fromkeys(item.analysis for item in job.planned()):
        items = [item for item in job.planned() if item.analysis == name]
        shown = [item.spec.headline_values(item.params) for item in items]
        if shown[0]:
            words = [said(key, list(dict.fromkeys(values[key] for values in shown))) for key in shown[0]]
            parts.append(f"{name} " + ", ".join(words))
    return "; " + "; ".join(parts) if parts else ""


def _revision_units(revision) -> tuple[int, int]:
    """(units, done) of one revision over every planned analysis that reads its pooled extraction."""
    return (
        sum(len(units) for units in revision.analysis_units.values()),
        sum(len(revision.analysis_done.get(name, ())) for name in revision.analysis_units),
    )


def _gpus_in_view(job, gpu_memory_gib) -> bool:
    """Whether GPUs concern this plan: the job says what GPUs it runs on ([sweep] gpu_memory_gib or gpus_per_node),
    --gpu-memory-gib, or this machine (the cluster of a local run) has one. Otherwise no GPU line is shown."""
    import shutil

    return job.gpus or gpu_memory_gib is not None or shutil.which("nvidia-smi") is not None


def show_plan(job_file: Path, out: Optional[Path], gpu_memory_gib: Optional[float]) -> None:
    from raygeom.jobs import plan as sweep
    from raygeom.sources.revisions import gpus_per_model

    job = _job(job_file, out)
    if _show_training(job):
        return
    job, plan = _load(job)
    settings = job.sweep or SweepSettings()
    memory = settings.gpu_memory_gib if gpu_memory_gib is None else gpu_memory_gib
    gpus_shown = _gpus_in_view(job, gpu_memory_gib)
    table = Table(
        title=escape(
            f"Plan {job.name}: models x revisions x layers  (N={job.n_samples}, seq_len={job.extraction.seq_len}{_headline(job)})"
        ),
        title_justify="left",
    )
    # Per model, the units of its pooled extraction's layers; an analysis with an extraction of its own counts its
    # units per (model, revision), in the per-analysis table: a job of only those has no per-model units to show.
    pooled = not job.analyses or any(revision.analysis_units for revision in plan.revisions)
    unit_columns = (("pooled units", "done") if plan.own else ("units", "done")) if pooled else ()
    for name in (
        "model",
        "params",
        "layers",
        "revisions",
        *unit_columns,
        *([f"GPUs/replica ({memory:g} GiB)"] if gpus_shown else []),
    ):
        table.add_column(name, justify="left" if name in ("model", "revisions") else "right")
    for model, revisions in plan.by_model().items():
        layers = sorted({len(r.layers) for r in revisions})
        params = revisions[0].params
        try:
            gpus = f"{gpus_per_model(params, memory, settings.gpus_per_node):g}" if params else "1"
        except RaygeomError as error:
            gpus = str(error)
        counts = [_revision_units(r) for r in revisions]
        table.add_row(
            model,
            f"{params / 1e6:,.1f}M" if params else "?",
            "/".join(map(str, layers)) + f" ({revisions[0].layers_from})",
            _revision_span(revisions),
            *((f"{sum(c[0] for c in counts):,}", f"{sum(c[1] for c in counts):,}") if pooled else ()),
            *([gpus] if gpus_shown else []),
        )
    console.print(table)
    total, done = plan.all_units()
    from raygeom.report.figures import counted

    console.print(
        f"grid: {counted(len(plan.by_model()), 'model')} x {counted(len(plan.revisions), '(model, revision) pair')}"
        f" -> {total:,} units; {done:,} done, {total - done:,} to compute"
    )
    print_per_analysis(plan)
    print_passes(job, plan)
    _show_weights(plan, settings)
    cost = sweep.estimate(plan)
    for name, analysis_cost in cost.analyses.items():
        for line in registry.get(name).plan_lines(plan, analysis_cost):
            console.print(line, highlight=False, markup=False)
    if cost.measured_extractions == 0 and cost.measured_units == 0:
        gpu_seconds, cpu = sweep.reference_estimate(plan)
        priced = {name: seconds for name, seconds in cpu.items() if seconds is not None}
        if not priced and (gpu_seconds is None or not gpus_shown):
            console.print("cost: no measured units in this store yet; run a few revisions first (`raygeom run`), then plan again")
            return
        gpu = f"extraction {gpu_seconds / 3600:,.1f} GPU-hours (A100), " if gpus_shown and gpu_seconds is not None else ""
        unpriced = [name for name, seconds in cpu.items() if seconds is None]
        console.print(
            "cost (no measured units in this store yet; reference rates, see docs/sweeps.md): "
            + gpu
            + ", ".join(f"{name} {sweep.format_seconds(seconds)} of CPU time" for name, seconds in priced.items())
            + (f"; not priced until measured: {', '.join(unpriced)}" if unpriced else "")
            + "; run a few revisions, then plan again to scale from this store's own unit times",
            highlight=False,
            markup=False,
        )
        return
    stored = ", ".join(f"{label} {count:,}" for label, count in cost.stored.items() if count)
    console.print(
        f"measured: {counted(cost.measured_extractions, 'extraction')} ({cost.device}), "
        f"{counted(cost.measured_units, 'stored unit')}" + (f" ({stored})" if stored else ""),
        highlight=False,
        markup=False,
    )
    if cost.extract_rate is not None:
        console.print(f"  forward {cost.extract_rate:.3e} s per parameter-token, loading {cost.load_rate:.3e} s per parameter")
    for name, analysis_cost in cost.analyses.items():
        if analysis_cost.rate is not None:
            console.print(
                f"  {name} {analysis_cost.rate:.3e} CPU-s per {analysis_cost.words} ({counted(analysis_cost.measured, 'unit')})",
                highlight=False,
                markup=False,
            )
    each = ", ".join(f"{name} {sweep.format_seconds(c.remaining_seconds)}" for name, c in cost.analyses.items())
    console.print(
        f"estimate for what is missing: extraction {sweep.format_seconds(cost.remaining_extract_seconds)} "
        f"of {cost.device} time, analyses {sweep.format_seconds(cost.remaining_analysis_seconds)} of CPU time"
        + (f" ({each})" if len(cost.analyses) > 1 or cost.remaining_analysis_seconds is None else "")
        + " (scaled from the measured units; see docs/sweeps.md)",
        highlight=False,
        markup=False,
    )


def _show_weights(plan, settings) -> None:
    """What the revisions still to extract download, and the [sweep] weights budget the downloads stay within."""
    from raygeom.sources import download

    hub = [r.spec for r in plan.revisions if r.spec.kind == "hub" and not r.extracted and not r.complete]
    if not hub:  # built-ins, GGUF files, local folders and checkpoints download nothing
        return
    volume, unknown = download.weights_volume(hub)
    budget = (
        f"{settings.weights_budget_gib:,.4g} GiB ([sweep] weights_budget_gib)"
        if settings.weights_budget_gib
        else f"{download.default_budget_bytes() / 2**30:,.1f} GiB (4/5 of the free disk under {download.cache_root()})"
    )
    amount = f"{volume / 2**40:,.2f} TiB" if volume >= 2**40 else f"{volume / 2**30:,.2f} GiB"
    console.print(
        f"download: {amount} of weights (fp16, from the Pythia table)"
        + (f" and {unknown} revisions of unknown size" if unknown else "")
        + f"; budget {budget}, "
        + (
            "every revision kept (keep_weights)"
            if settings.keep_weights
            else "each revision deleted once its extraction is stored"
        ),
        highlight=False,
        markup=False,
    )


def show_status(job_file: Path, out: Optional[Path]) -> None:
    from raygeom.store.manifest import integrity

    job, plan = _load(_job(job_file, out))
    report = integrity(plan)
    table = Table(title=escape(f"Status {job.name}  ({plan.store.root})"), title_justify="left")
    for name in ("model", "revisions extracted", "revisions complete", "units done", "weights flagged"):
        table.add_column(name, justify="left" if name == "model" else "right")
    for model, revisions in plan.by_model().items():
        flagged = sum(1 for r in revisions if report.flag(model, r.spec.revision))
        table.add_row(
            model,
            f"{sum(r.extracted for r in revisions)}/{len(revisions)}",
            f"{sum(r.complete for r in revisions)}/{len(revisions)}",
            f"{sum(_revision_units(r)[1] for r in revisions):,}/{sum(_revision_units(r)[0] for r in revisions):,}",
            str(flagged),
        )
    console.print(table)
    total, done = plan.all_units()
    percent = 100.0 * done / total if total else 0.0
    console.print(f"units: {done:,}/{total:,} done ({percent:.1f}%)")
    print_per_analysis(plan)
    planned = {(r.spec.slug, r.spec.revision) for r in plan.revisions}
    partial = [p for p in plan.store.partial_extractions() if p in planned]
    if partial:
        console.print(
            "partial extractions (running, or interrupted and to be redone): " + ", ".join(f"{m}@{r}" for m, r in partial),
            highlight=False,
        )
    _show_failed_and_cache(plan)
    for model, revision, flag in report.flagged:
        note = report.notes.get((model, revision))
        console.print(f"[yellow]weights flag[/] {model}@{revision}: {flag}" + (f"  ({note})" if note else ""), highlight=False)
    if not report.flagged:
        checked = sum(1 for r in plan.revisions if r.marker)
        console.print(f"weights: {checked} loaded revisions fingerprinted, no duplicates")
    notes = sorted({note for note in report.notes.values()})
    for note in notes:
        console.print(f"known hub issue in this grid: {note}", highlight=False)


def _show_failed_and_cache(plan) -> None:
    """Revisions the last run could not fetch or extract (a rerun tries them again), and the HF cache's size."""
    from raygeom.sources import download
    from raygeom.store import failures

    pending = {(r.spec.slug, r.spec.revision) for r in plan.revisions if not r.extracted}
    names = {(r.spec.slug, r.spec.revision): f"{r.spec.name}@{r.spec.revision}" for r in plan.revisions}
    for entry in failures.read(plan.store.root).values():
        where = (entry.get("model"), entry.get("revision"))
        if where in pending:
            reason = entry["reason"] if entry["reason"].startswith(names[where]) else f"{names[where]}: {entry['reason']}"
            console.print(f"[red]failed[/] {escape(reason)} (a rerun tries it again)", highlight=False, soft_wrap=True)
    console.print(
        f"HF cache: {download.cache_bytes() / 2**30:,.3f} GiB in use ({download.cache_root()})", highlight=False, markup=False
    )


def register(app: typer.Typer) -> None:
    """Add this module's commands to the raygeom app."""

    @app.command()
    @checked
    def plan(
        job_file: Path = typer.Argument(..., help="TOML job file, e.g. jobs/pythia-sweep.toml"),
        out: Optional[str] = option(
            GridSettings, "out", "-o", path=True, default=None, help="Store to compare against (default: the job's out)."
        ),
        gpu_memory_gib: Optional[str] = option(
            SweepSettings,
            "gpu_memory_gib",
            default=None,
            help="GPU memory for the GPUs/replica column (default: the job's [sweep] gpu_memory_gib, else 80).",
        ),
    ):
        """Print the sweep grid, the units already done and a cost estimate from measured unit times."""
        try:
            show_plan(job_file, out, gpu_memory_gib)
        except RaygeomError as error:
            _fail(str(error))

    @app.command()
    @checked
    def status(
        job_file: Path = typer.Argument(..., help="TOML job file"),
        out: Optional[str] = option(
            GridSettings, "out", "-o", path=True, default=None, help="Store to read (default: the job's out)."
        ),
    ):
        """Progress of a sweep from the store alone, with revisions whose weights duplicate another's."""
        try:
            show_status(job_file, out)
        except RaygeomError as error:
            _fail(str(error))
