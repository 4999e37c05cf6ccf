"""A run's last step, its one writer: ``results/<analysis>.parquet`` for every planned analysis (every row of it the
store holds), then what each analysis's declaration shows and draws of this job's rows (raygeom.report.tables), then
the console's closing lines. A sweep (a run over revisions: a job with [sweep]) writes the revisions table too
(results/revisions.parquet: size, step and weights integrity flags per (model, revision)), and an analysis whose
renderer has a ``sweep`` part (raygeom.report.renderers) is drawn by it over the revisions. Nothing here names an
analysis."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from rich.console import Console
from rich.markup import escape

from raygeom.analyses import registry
from raygeom.jobs.extract import Extracted
from raygeom.jobs.load import Loaded
from raygeom.jobs.plan import SweepPlan, build_plan
from raygeom.report.figures import counted
from raygeom.report.html import announce_report
from raygeom.sources import revisions as pythia
from raygeom.store.manifest import IntegrityReport, integrity

REVISIONS_TABLE = "revisions.parquet"
# Column -> type of results/revisions.parquet: a (model, revision) as the results tables name it, what the sweep knows
# of it beside its rows (the hub repo, Pythia size, parameters, training step) and its integrity flags.
REVISIONS_SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("revision", pa.string()),
        ("repo", pa.string()),
        ("size", pa.string()),
        ("deduped", pa.bool_()),
        ("params", pa.int64()),
        ("step", pa.int64()),
        ("weights_flag", pa.string()),
        ("known_bad_note", pa.string()),
    ]
)
REVISION_COLUMNS = tuple(REVISIONS_SCHEMA.names)


def revisions_rows(plan: SweepPlan, report: IntegrityReport | None = None) -> list[dict]:
    """One row per (model, revision) of this plan, in size and step order."""
    report = report or integrity(plan)
    out = []
    for revision in plan.revisions:
        spec = revision.spec
        size = pythia.size_of(spec.source)
        out.append(
            {
                "model": spec.slug,
                "revision": spec.revision,
                "repo": spec.source,
                "size": size.name if size else None,
                "deduped": spec.source.endswith("-deduped"),
                "params": revision.params,
                "step": spec.step,
                "weights_flag": report.flag(spec.name, spec.revision),
                "known_bad_note": report.notes.get((spec.name, spec.revision)),
            }
        )
    return sorted(out, key=lambda r: (r["params"] or 0, r["repo"], r["step"] if r["step"] is not None else -1, r["revision"]))


@dataclass
class RunOutputs:
    files: dict[str, list[Path]] = field(default_factory=dict)  # what each analysis wrote, by name: its table first
    rows: dict[str, list[dict]] = field(default_factory=dict)  # this job's rows of each analysis, by name
    # A sweep's: what each analysis's ``sweep`` renderer made, by name; the units of the plan computed by this run; the
    # weights integrity flags (model, revision, flag); results/revisions.parquet
    over_revisions: dict[str, object] = field(default_factory=dict)
    computed_units: int = 0
    flagged: list[tuple[str, str, str]] = field(default_factory=list)
    revisions: Path | None = None


def write(loaded: Loaded, plan: SweepPlan, extracted: Extracted, console: Console, write_html: bool = True) -> RunOutputs:
    """Every planned analysis's table, files and console lines; a sweep's revisions table and drawings over its
    revisions; then where it all is. ``plan``: the run's plan before its passes (what a sweep counts its computed
    units from); ``write_html``: announce (write) the HTML report too (a driver that adds to the store afterwards
    writes it once, at its end)."""
    from raygeom.analyses.results_table import write_results_table
    from raygeom.report.renderers import Swept, renderer
    from raygeom.report.tables import analysis_outputs

    job, store = loaded.job, loaded.store
    sweep = job.sweep is not None
    outputs = RunOutputs()
    over_revisions = []  # the analyses a sweep draws over its revisions, below
    for name, mine in extracted.rows.items():
        analysis = registry.get(name)
        outputs.rows[name] = mine
        outputs.files[name] = [write_results_table(store, analysis, mine)]
        if sweep and renderer(name).sweep:
            over_revisions.append(name)
        else:
            outputs.files[name] += analysis_outputs(console, analysis, mine, store.root)
    if sweep:
        print_not_scored(console, extracted.pooled)  # degenerate units are not stored, so the tables do not show them
        final = build_plan(job, store, loaded.corpus.fingerprint())
        revisions, outputs.flagged, outputs.revisions = write_revisions(final, console)
        outputs.computed_units = final.n_done - plan.n_done
        for name in over_revisions:
            swept = Swept(final, outputs.files[name][0], revisions, outputs.revisions, job.sweep)
            outputs.over_revisions[name] = renderer(name).sweep(console, swept)
    else:
        width = max([9, *(len(name) + 2 for name in outputs.files)])
        for name, paths in outputs.files.items():
            console.print(f"{name + ':':<{width}}{paths[0]}", markup=False, highlight=False)
        plots = {path for paths in outputs.files.values() for path in paths if path.suffix == ".png"}
        if plots:
            console.print(f"plots:   {counted(len(plots), 'figure')} in {store.root / 'plots'}", markup=False)
    console.print(f"store:   {store.root}", markup=False)
    if write_html:
        announce_report(store.root, console)
    return outputs


def write_revisions(plan: SweepPlan, console: Console) -> tuple[list[dict], list[tuple[str, str, str]], Path]:
    """results/revisions.parquet of ``plan`` and a line per weights integrity flag; returns (its rows, the flags, its
    path)."""
    from raygeom.store.tree import atomic_write_table

    report = integrity(plan)
    rows = revisions_rows(plan, report)
    path = plan.store.root / "results" / REVISIONS_TABLE
    atomic_write_table(pa.Table.from_pylist(rows, schema=REVISIONS_SCHEMA), path)
    for model, revision, flag in report.flagged:
        console.print(f"[yellow]weights flag[/] {escape(f'{model}@{revision}: {flag}')}", highlight=False)
    return rows, report.flagged, path


def print_not_scored(console: Console, rows: list[dict]) -> None:
    """A line for each row of a unit that was not scored (its ``note`` says why): such a row is not stored."""
    for row in rows:
        if row.get("note"):
            console.print(
                f"[yellow]not scored[/] {escape(row['model'])}@{escape(row['revision'])} {escape(row['layer'])}: "
                f"{escape(row['note'])} (not stored; a rerun tries it again)",
                highlight=False,
                soft_wrap=True,
            )
