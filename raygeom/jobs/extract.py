"""A run's extraction step: Ray started, every forward pass the job plans (raygeom.jobs.passes) and the analyses on
each, on one progress display: the pooled pass and its analyses through the engine's ``run_sweep``, then each analysis
with an extraction of its own; then the count of the passes that ran. Nothing here names an analysis: the registry
says which units each landed extraction gets."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from raygeom.analyses import registry
from raygeom.jobs import passes
from raygeom.jobs.load import Loaded
from raygeom.jobs.progress import Stages, pairs_words, progress_bar
from raygeom.jobspec import JobSpec
from raygeom.replica.request import ExtractionRequest
from raygeom.report.figures import counted
from raygeom.sources.models import ModelSpec
from raygeom.store.tree import Store


@dataclass
class Extracted:
    rows: dict[str, list[dict]]  # this job's rows of each planned analysis, by name
    pooled: list[dict]  # every row of the analyses on the pooled pass, in the job's order of (model, revision), by depth


def extract(loaded: Loaded, plan, console: Console, address: str | None, num_cpus: int | None) -> Extracted:
    """Start Ray (``address``; None: a local one of ``num_cpus``), then make every pass of the job's ``plan``
    (raygeom.jobs.plan.build_plan) and run the analyses on each."""
    from raygeom.engine import orchestrate

    job, store, corpus, specs = loaded.job, loaded.store, loaded.corpus, loaded.specs
    start_ray(console, address, num_cpus)
    gpus = orchestrate.cluster_gpus()
    by_model = plan.by_model()
    revisions = [revision for group in by_model.values() for revision in group]
    items = pooled_items(job, corpus, [(r.spec, replica_gpus(r.spec, job, gpus, r.params)) for r in revisions])
    if job.sweep:
        total, done = plan.all_units()
        console.print(
            f"sweep {escape(job.name)}: {counted(len(plan.revisions), 'revision')} of {counted(len(by_model), 'model')}, "
            f"{total:,} units, "
            f"{done:,} already done, {total - done:,} to compute; {gpus:g} GPUs in the cluster"
        )
    pooled, own, units = run_passes(job, console, store, corpus, specs, items, plan, **engine_options(job))
    order = {(spec.slug, spec.revision): i for i, spec in enumerate(specs)}
    pooled.sort(key=lambda row: (order[(row["model"], row["revision"])], row["layer_index"], row.get("relative_depth") or 0.0))
    rows = {
        name: units.rows_of(name, pooled) if registry.get(name).extraction == passes.POOLED else own.get(name, [])
        for name in passes.analyses_of(job)
    }
    return Extracted(rows, pooled)


def engine_options(job: JobSpec) -> dict:
    """The engine's options a job's [sweep] sets (none without one: the engine's defaults)."""
    settings = job.sweep
    if settings is None:
        return {}
    return {
        "max_in_flight": settings.max_in_flight or None,
        "analysis_threads": settings.analysis_threads,
        "keep_activations": settings.keep_activations,
        "weights": weights_settings(job),
    }


def start_ray(console: Console, address: str | None, num_cpus: int | None) -> None:
    from raygeom.engine import orchestrate

    with console.status("starting Ray" + (f" at {escape(address)}" if address else " locally")):
        orchestrate.start_ray(address, num_cpus)


def replica_gpus(spec: ModelSpec, job: JobSpec, cluster_gpus: float, params: int | None) -> float:
    """GPUs one extraction replica asks Ray for; 0 on a cluster without GPUs."""
    from raygeom.sources.revisions import gpus_per_model

    if cluster_gpus < 1:
        return 0.0
    settings = job.sweep
    if params is None or settings is None:
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


def pooled_items(job: JobSpec, corpus, specs_and_gpus: list[tuple[ModelSpec, float]]) -> list:
    """The pooled pass of each (model, revision), as the engine runs it (none when no analysis reads it)."""
    from raygeom.engine import orchestrate

    if not passes.needs_pooled(job):
        return []
    nll = passes.needs_nll(job)
    return [
        orchestrate.SweepItem(ExtractionRequest(spec, corpus, job.extraction, job.layers, nll=nll), gpus)
        for spec, gpus in specs_and_gpus
    ]


class JobUnits:
    """``run_sweep``'s ``units_for`` for every analysis a job plans; remembers which unit belongs to which."""

    def __init__(self, store, job):
        self.store = store
        self.planned = job.planned()
        self.keys: dict[str, set[str]] = {}

    def __call__(self, item, info: dict) -> list:
        spec = item.request.spec
        units = registry.units_for(self.store, spec.slug, spec.revision, info["layers"], info, self.planned)
        for unit in units:
            self.keys.setdefault(unit.analysis, set()).add(unit.key)
        return units

    def rows_of(self, analysis: str, rows: list[dict]) -> list[dict]:
        keys = self.keys.get(analysis, set())
        return [row for row in rows if row.get("unit_key") in keys]


def pooled_stages(job: JobSpec, corpus, items: list, stages, plan):
    """``run_sweep``'s ``progress`` on the run's stages: the pooled pass (texts) and its analyses (engine steps), each
    with its total before it starts (the analyses' from the plan's layers: the store's, the config's or the Pythia
    table's; only for a model none of them knows does it grow as its extraction lands)."""
    if not items:
        return None
    specs = [item.request.spec for item in items]
    words = pairs_words(specs)
    extract = stages(f"pooled pass, {words}", len(corpus.texts) * len(items))
    labels = passes.planned_labels(job)
    known = all(revision.layers for revision in plan.revisions)
    total = sum(
        len(keys) * labels[label].spec.progress_cost(labels[label].params)
        for revision in plan.revisions
        for label, keys in revision.analysis_units.items()
    )
    names = [name for name in passes.analyses_of(job) if registry.get(name).extraction == "pooled"]
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


def run_passes(job: JobSpec, console: Console, store: Store, corpus, specs: list, items: list, plan, **engine):
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
    units = JobUnits(store, job)
    with progress_bar(console) as progress:
        stages = Stages(progress)
        every_row = orchestrate.run_sweep(store, items, units, progress=pooled_stages(job, corpus, items, stages, plan), **engine)
        stages.close_opened()
        own = run_own_extractions(store, job, specs, stages)
    print_passes(console, job, specs, stored_before, store, pooled_key)
    return every_row, own, units


def run_own_extractions(store: Store, job: JobSpec, specs: list, stages) -> dict[str, list[dict]]:
    """Every planned analysis with an extraction of its own (token-level chunks, kNN-LM features, aligned texts):
    each extracts what it needs (what the store holds is reused, so analyses naming one extraction share it) and
    runs its units, on the run's ``stages``; returns this job's rows by analysis name."""
    own = [item for item in job.planned() if item.spec.extraction != passes.POOLED]
    rows: dict[str, list[dict]] = {}
    for item in own:
        rows.setdefault(item.analysis, []).extend(item.spec.run(store, job, specs, item.params, stages))
        stages.close_opened()
    for name, mine in rows.items():  # a pooled analysis's rows are checked as its units finish
        registry.get(name).check_rows(mine)
    return rows


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
