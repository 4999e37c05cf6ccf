"""A job's analyses on each landed extraction, and what they leave behind: the glue between a job file's
``[analyses.<name>]`` tables (raygeom.analyses.registry) and the engine's ``run_sweep``. Nothing here names an
analysis: every registered one is run, tabled, plotted and accumulated the same way."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from raygeom.analyses import registry


def progress_bar(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), console=console, transient=False)


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


def needs_nll(job) -> bool:
    return any(item.spec.needs.nll for item in job.planned() if item.spec.extraction == "pooled")


def needs_pooled(job) -> bool:
    """Whether any planned analysis reads the job's [extract] extraction (else no forward pass is made for it)."""
    return any(item.spec.extraction == "pooled" for item in job.planned())


def run_own_extractions(store, job, console) -> dict[str, list[dict]]:
    """Every planned analysis with an extraction of its own (token-level chunks, kNN-LM features, aligned texts):
    each extracts what it needs (what the store holds is reused, so analyses naming one extraction share it) and
    runs its units; returns this job's rows by analysis name."""
    from raygeom.jobs.plan import job_specs

    own = [item for item in job.planned() if item.spec.extraction != "pooled"]
    if not own:
        return {}
    specs = job_specs(job)
    rows: dict[str, list[dict]] = {}
    with progress_bar(console) as progress:
        def factory(label: str, total: int | None):
            task = progress.add_task(label, total=total)
            return lambda n: progress.advance(task, n)

        for item in own:
            rows.setdefault(item.analysis, []).extend(item.spec.run(store, job, specs, item.params, factory))
    return rows


def analyses_of(job) -> list[str]:
    return list(dict.fromkeys(item.analysis for item in job.planned()))


def write_outputs(store, job, units: JobUnits, rows: list[dict], console, skip: tuple[str, ...] = ("pga",),
                  own: dict[str, list[dict]] | None = None) -> dict[str, Path]:
    """For every planned analysis but ``skip`` (whose driver writes its own): ``results/<dir>.parquet`` with every
    row of it the store holds (all jobs, each row with its settings), its console table of this job's rows and its
    plots under ``plots/``. ``own``: the rows of the analyses with an extraction of their own, by name."""
    from raygeom.engine.units import accumulated_rows
    from raygeom.report.figures import write_rows
    from raygeom.report.tables import plot_analysis, print_analysis, print_ranked

    written = {}
    for name in analyses_of(job):
        if name in skip:
            continue
        analysis = registry.get(name)
        mine = (own or {}).get(name, []) if analysis.extraction != "pooled" else units.rows_of(name, rows)
        if analysis.extraction != "pooled":  # a pooled analysis's rows are checked as its units finish
            analysis.check_rows(mine)
        directory = analysis.results_dir
        every = accumulated_rows(store, directory, mine)
        if analysis.extraction != "pooled":  # stores from before the unit engine kept summaries there, with no key
            every = [row for row in every if row.get("unit_key")]
        written[name] = write_rows(every, store.root / "results" / f"{directory}.parquet")
        layered = [row for row in mine if row.get("relative_depth") is not None]
        if layered and analysis.metrics:
            print_analysis(console, analysis, layered)
            plot_analysis(analysis, layered, store.root / "plots")
        elif mine:
            print_ranked(console, analysis, mine)
    return written
