"""Job driver: corpus -> forward passes (replica actors) -> Arrow store -> analysis units (Ray tasks) -> tables, plots,
Parquet."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from raygeom.analyses import registry
from raygeom.jobs import experiment, passes
from raygeom.jobs.experiment import progress_bar  # noqa: F401 - the drivers' (and commands') one progress display
from raygeom.jobs.preflight import job_models, preflight
from raygeom.jobspec import JobSpec
from raygeom.replica.request import ExtractionRequest
from raygeom.report.figures import counted
from raygeom.report.html import announce_report
from raygeom.sources.models import ModelSpec
from raygeom.store.tree import Store, check_writable


@dataclass
class JobOutputs:
    files: dict[str, list[Path]] = field(default_factory=dict)  # what each analysis wrote, by name: its table first
    rows: dict[str, list[dict]] = field(default_factory=dict)  # this job's rows of each analysis, by name


def pooled_stages(job: JobSpec, store: Store, corpus, items: list, stages, plan=None):
    """``run_sweep``'s ``progress`` on the run's stages: the pooled pass (texts) and its analyses (engine steps), each
    with its total before it starts (the analyses' from the plan's layers: the store's, the config's or the Pythia
    table's; only for a model none of them knows does it grow as its extraction lands)."""
    from raygeom.jobs import plan as sweep

    if not items:
        return None
    specs = [item.request.spec for item in items]
    words = experiment.pairs_words(specs)
    extract = stages(f"pooled pass, {words}", len(corpus.texts) * len(items))
    plan = plan or sweep.build_plan(job, store, corpus.fingerprint(), with_own=False)
    labels = sweep.planned_labels(job)
    known = all(revision.layers for revision in plan.revisions)
    total = sum(
        len(keys) * labels[label].spec.progress_cost(labels[label].params)
        for revision in plan.revisions
        for label, keys in revision.analysis_units.items()
    )
    names = [name for name in experiment.analyses_of(job) if registry.get(name).extraction == "pooled"]
    said = ", ".join(names) if len(names) <= 3 else f"{len(names)} analyses"
    analyse = stages(f"{said} on {words}", total if known else None)
    grown = [0]

    def advance(kind: str, n: int) -> None:
        if kind == "texts":
            extract(n)
        elif kind == "units" and not known:  # a revision landed (its layers are known now)
            grown[0] += n
            analyse.set_total(grown[0])
        elif kind == "more":  # --n-null auto asked for more null blocks than planned
            grown[0] += n
            analyse.set_total(total + grown[0] if known else grown[0])
        elif kind == "steps":
            analyse(n)

    return advance


def print_passes(console: Console, job: JobSpec, specs: list, before: dict, store: Store, pooled_key: dict) -> None:
    """The forward passes this run made, counted in the store (an extraction there now that was not before), beside
    the job's plan of passes."""
    planned = passes.job_passes(job)
    after = passes.stored_passes(store, job, specs, lambda spec: pooled_key.get((spec.slug, spec.revision)))
    ran = sum(1 for key, stored in after.items() if stored and not before.get(key))
    read_back = sum(1 for key, stored in after.items() if stored and before.get(key))
    console.print(
        f"forward passes: {ran} ran"
        + (f", {read_back} read back from the store" if read_back else "")
        + f"; per (model, revision) {passes.describe(planned)}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def start_ray(console: Console, address: str | None, num_cpus: int | None) -> None:
    from raygeom.engine import orchestrate

    with console.status("starting Ray" + (f" at {escape(address)}" if address else " locally")):
        orchestrate.start_ray(address, num_cpus)


def pooled_items(job: JobSpec, corpus, specs_and_gpus: list[tuple[ModelSpec, float]]) -> list:
    """The pooled pass of each (model, revision), as the engine runs it (none when no analysis reads it)."""
    from raygeom.engine import orchestrate

    if not experiment.needs_pooled(job):
        return []
    nll = experiment.needs_nll(job)
    return [
        orchestrate.SweepItem(ExtractionRequest(spec, corpus, job.extraction, job.layers, nll=nll), gpus)
        for spec, gpus in specs_and_gpus
    ]


def run_passes(job: JobSpec, console: Console, store: Store, corpus, specs: list, items: list, plan=None, **engine):
    """Every pass the job plans (raygeom.jobs.passes) and the analyses on each, on one progress: the pooled pass and
    its analyses through the engine's ``run_sweep`` (``engine``: its options), then each analysis with an extraction
    of its own; then the count of the passes that ran. Returns (the pooled analyses' rows, the others' rows by
    analysis, the JobUnits that tell the pooled rows apart)."""
    from raygeom.engine import orchestrate

    pooled_key = {(item.request.spec.slug, item.request.spec.revision): item.request.key() for item in items}
    if not items and passes.job_passes(job)[0].kind == passes.POOLED:  # a pooled reader makes the pass itself
        texts = passes.pooled_corpus(job, specs)  # its texts, as it reads them (convergence: aligned)
        pooled_key = {(s.slug, s.revision): ExtractionRequest(s, texts, job.extraction, job.layers).key() for s in specs}
    stored_before = passes.stored_passes(store, job, specs, lambda spec: pooled_key.get((spec.slug, spec.revision)))
    units = experiment.JobUnits(store, job)
    with progress_bar(console) as progress:
        stages = experiment.Stages(progress)
        every_row = orchestrate.run_sweep(
            store, items, units, progress=pooled_stages(job, store, corpus, items, stages, plan), **engine
        )
        stages.close_opened()
        own = experiment.run_own_extractions(store, job, stages)
    print_passes(console, job, specs, stored_before, store, pooled_key)
    return every_row, own, units


def run_job(job: JobSpec, console: Console, address: str | None = None, num_cpus: int | None = None) -> JobOutputs:
    """A job's every (model, revision): its passes, its analyses, their tables, plots and console lines."""
    # Everything that can fail on bad input fails here, before Ray starts (what `raygeom plan` checks too).
    corpus = preflight(
        job, console, local=address is None
    )  # sampled when the pooled extraction reads it; the others read it their own way
    specs = job_models(job)
    store = Store(job.out)
    check_writable(store.root)
    if experiment.needs_pooled(job):  # the texts of its pooled pass (aligned when the job compares models)
        corpus = passes.pooled_corpus(job, specs, corpus)

    from raygeom.engine import orchestrate

    start_ray(console, address, num_cpus)
    # The laptop job is a sweep of its revisions through the same code as a Pythia sweep.
    gpus = orchestrate.cluster_gpus()
    items = pooled_items(job, corpus, [(spec, replica_gpus(spec, job, gpus, None)) for spec in specs])
    every_row, own, units = run_passes(job, console, store, corpus, specs, items)
    order = {(spec.slug, spec.revision): i for i, spec in enumerate(specs)}
    every_row.sort(key=lambda row: (order[(row["model"], row["revision"])], row["layer_index"], row.get("relative_depth") or 0.0))
    outputs = JobOutputs()
    written = experiment.write_outputs(
        store, job, units, every_row, console, skip=(), own=own, files=outputs.files, shown=outputs.rows
    )
    width = max([9, *(len(name) + 2 for name in written)])
    for name, path in written.items():
        console.print(f"{name + ':':<{width}}{path}", markup=False, highlight=False)
    plots = {path for paths in outputs.files.values() for path in paths if path.suffix == ".png"}
    if plots:
        console.print(f"plots:   {counted(len(plots), 'figure')} in {store.root / 'plots'}", markup=False)
    console.print(f"store:   {store.root}", markup=False)
    announce_report(store.root, console)
    return outputs


@dataclass
class SweepOutputs:
    rows: int
    table: Path
    collapse: Path
    plots: list[Path]
    computed_units: int
    flagged: list[tuple[str, str, str]]
    revisions: Path | None = None  # results/revisions.parquet: size, step and integrity flags per (model, revision)
    pga_rows: list[dict] = field(default_factory=list)  # this plan's PGA units, with their revision's flags


def replica_gpus(spec: ModelSpec, job: JobSpec, cluster_gpus: float, params: int | None) -> float:
    """GPUs one extraction replica asks Ray for; 0 on a cluster without GPUs."""
    from raygeom.sources.revisions import gpus_per_model

    if cluster_gpus < 1:
        return 0.0
    settings = job.sweep
    if params is None:
        return 1.0
    return gpus_per_model(params, settings.gpu_memory_gib, min(settings.gpus_per_node, int(cluster_gpus)))


def weights_settings(job: JobSpec):
    """The sweep's weights budget: [sweep] weights_budget_gib (0: four fifths of the free disk), keep_weights (also
    kept when a planned analysis extracts on its own after the sweep: it loads the weights again)."""
    from raygeom.engine.weights import WeightsSettings
    from raygeom.sources import download

    settings = job.sweep
    budget = int(settings.weights_budget_gib * 2**30) if settings.weights_budget_gib else download.default_budget_bytes()
    own = any(item.spec.extraction != "pooled" for item in job.planned())
    return WeightsSettings(budget, keep=settings.keep_weights or own, retries=settings.download_retries)


def hub_revision_lists(job: JobSpec, console: Console) -> JobSpec:
    """``revisions = "all"`` names the 154 Pythia checkpoints of raygeom.sources.revisions; when the hub answers, each
    model's own list (its stepN branches) is used instead, and a difference is one warning line."""
    from dataclasses import replace

    from raygeom.sources import download
    from raygeom.sources.revisions import PYTHIA_REVISIONS

    if not download.online() or not job.sweep:
        return job
    entries = []
    for entry in job.models:
        listed = download.hub_revisions(entry.source) if tuple(entry.revisions) == PYTHIA_REVISIONS else None
        if listed and tuple(listed) != PYTHIA_REVISIONS:
            missing = [r for r in PYTHIA_REVISIONS if r not in listed]
            extra = [r for r in listed if r not in PYTHIA_REVISIONS]
            console.print(
                f"[yellow]warning[/] {escape(entry.source)}: the hub lists {len(listed)} revisions, "
                f"raygeom/sources/revisions.py {len(PYTHIA_REVISIONS)} ({len(missing)} not on the hub"
                + (f", e.g. {missing[0]}" if missing else "")
                + f"; {len(extra)} only on the hub"
                + (f", e.g. {extra[0]}" if extra else "")
                + "); using the hub's",
                highlight=False,
                soft_wrap=True,
            )
            entry = replace(entry, revisions=tuple(listed))
        entries.append(entry)
    return replace(job, models=tuple(entries))


def run_sweep_job(
    job: JobSpec, console: Console, address: str | None = None, num_cpus: int | None = None, write_html: bool = True
) -> SweepOutputs:
    """Every (model, revision) of the job: extraction on GPU (or CPU) tasks, PGA per layer, then the tidy
    table, collapse zones, plots and the integrity report, all from the store. ``write_html``: write the HTML
    report too (a driver that adds to the store afterwards writes it once, at its end)."""
    from raygeom.jobs import plan as sweep
    from raygeom.jobs.tidy import write_outputs
    from raygeom.store.manifest import write_manifest

    job = hub_revision_lists(job, console)
    corpus = preflight(job, console, local=address is None)  # every refusal, before Ray starts (what `raygeom plan` checks too)
    store = Store(job.out)
    check_writable(store.root)
    corpus = passes.pooled_corpus(job, job_models(job), corpus)
    plan = sweep.build_plan(job, store, corpus.fingerprint())
    write_manifest(store, job, corpus)

    from raygeom.engine import orchestrate

    start_ray(console, address, num_cpus)
    gpus = orchestrate.cluster_gpus()
    by_model = plan.by_model()
    revisions = [revision for group in by_model.values() for revision in group]
    items = pooled_items(job, corpus, [(r.spec, replica_gpus(r.spec, job, gpus, r.params)) for r in revisions])
    total, done = plan.all_units()
    console.print(
        f"sweep {escape(job.name)}: {counted(len(plan.revisions), 'revision')} of {counted(len(by_model), 'model')}, "
        f"{total:,} units, "
        f"{done:,} already done, {total - done:,} to compute; {gpus:g} GPUs in the cluster"
    )
    settings = job.sweep
    every_row, own, units = run_passes(
        job,
        console,
        store,
        corpus,
        job_models(job),
        items,
        plan,
        max_in_flight=settings.max_in_flight or None,
        analysis_threads=settings.analysis_threads,
        keep_activations=settings.keep_activations,
        weights=weights_settings(job),
    )
    # PGA's table and figures over revisions are the sweep's own (tidy.write_outputs, below)
    experiment.write_outputs(store, job, units, every_row, console, skip=("pga",), own=own)
    for row in every_row:  # degenerate units are not stored, so the tables below do not show them: say so here
        if row.get("note"):
            console.print(
                f"[yellow]not scored[/] {escape(row['model'])}@{escape(row['revision'])} {escape(row['layer'])}: "
                f"{escape(row['note'])} (not stored; a rerun tries it again)",
                highlight=False,
                soft_wrap=True,
            )
    final = sweep.build_plan(job, store, corpus.fingerprint())
    outputs = write_outputs(
        final,
        units.rows_of("pga", every_row),
        settings.collapse_threshold,
        settings.positive_z,
        settings.plots,
        pga="pga" in experiment.analyses_of(job),
    )
    report = outputs["report"]
    for model, revision, flag in report.flagged:
        console.print(f"[yellow]weights flag[/] {escape(f'{model}@{revision}: {flag}')}", highlight=False)
    from raygeom.report.figures import sweep_table

    if outputs["rows"]:  # a job whose PGA is only in [analyses.pga] has its tables printed above, per setting
        console.print(sweep_table(outputs["table_rows"], outputs["zones"]))
        collapsed = [z for z in outputs["zones"] if z["collapsed"]]
        console.print(f"collapse zones: {len(collapsed)} of {len(outputs['zones'])} (model, revision) profiles")
        console.print(
            f"results: {outputs['table']} ({outputs['table_count']} rows)\nrevisions: {outputs['revisions']}\n"
            f"collapse: {outputs['collapse']}\n"
            f"plots:   {len(outputs['plots'])} in {store.root / 'plots'}",
            markup=False,
        )
    console.print(f"store:   {store.root}", markup=False)
    if write_html:
        announce_report(store.root, console)
    return SweepOutputs(
        outputs["rows"],
        outputs["table"],
        outputs["collapse"],
        outputs["plots"],
        final.n_done - plan.n_done,
        report.flagged,
        outputs["revisions"],
        outputs["table_rows"],
    )
