"""A job's analyses on each landed extraction, and what they leave behind: the glue between a job file's
``[analyses.<name>]`` tables (raygeom.analyses.registry) and the engine's ``run_sweep``. Nothing here names an
analysis: every registered one is run, tabled, plotted and accumulated the same way."""

from __future__ import annotations

from pathlib import Path

from raygeom.analyses import registry


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
    return any(item.spec.needs.nll for item in job.planned())


def analyses_of(job) -> list[str]:
    return list(dict.fromkeys(item.analysis for item in job.planned()))


def write_outputs(store, job, units: JobUnits, rows: list[dict], console, skip: tuple[str, ...] = ("pga",)) -> dict[str, Path]:
    """For every planned analysis but ``skip`` (whose driver writes its own): ``results/<name>.parquet`` with every
    row of it the store holds (all jobs, each row with its settings), its console table of this job's rows and its
    plots under ``plots/``."""
    from raygeom.engine.units import accumulated_rows
    from raygeom.report.figures import write_rows
    from raygeom.report.tables import plot_analysis, print_analysis

    written = {}
    for name in analyses_of(job):
        if name in skip:
            continue
        analysis = registry.get(name)
        mine = units.rows_of(name, rows)
        written[name] = write_rows(accumulated_rows(store, name, mine), store.root / "results" / f"{name}.parquet")
        if mine:
            print_analysis(console, analysis, mine)
            plot_analysis(analysis, mine, store.root / "plots")
    return written
