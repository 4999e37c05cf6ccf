"""Job driver: corpus -> extraction actors -> Arrow store -> PGA tasks -> tables, plots, Parquet."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from raygeom import report
from raygeom.corpus import load_corpus
from raygeom.jobspec import JobSpec
from raygeom.models import ModelSpec, resolve_model
from raygeom.store import Store, check_writable


@dataclass
class JobOutputs:
    rows: list[dict]
    table: Path
    plot: Path


def progress_bar(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), console=console, transient=False)


def job_models(job: JobSpec) -> list[ModelSpec]:
    return [resolve_model(entry.source, revision) for entry in job.models for revision in entry.revisions]


def run_pga_job(job: JobSpec, console: Console, address: str | None = None, num_cpus: int | None = None) -> JobOutputs:
    # Everything that can fail on bad input fails here, before Ray starts.
    store = Store(job.out)
    check_writable(store.root)
    specs = job_models(job)
    corpus = load_corpus(job.corpus).sample(job.n_samples, job.sample_seed)

    from raygeom import orchestrate

    with console.status("starting Ray" + (f" at {address}" if address else " locally")):
        orchestrate.start_ray(address, num_cpus)
    rows: list[dict] = []
    chunks = min(job.pga.null_chunks, job.pga.n_null) + 1
    with progress_bar(console) as progress:
        for spec in specs:
            label = f"{spec.name}@{spec.revision}"
            extract_task = progress.add_task(f"extract {label}", total=len(corpus.texts))
            request = orchestrate.ExtractionRequest(spec, corpus, job.extraction, job.layers)
            info = orchestrate.extract(store, request, progress=lambda n: progress.advance(extract_task, n))
            pga_task = progress.add_task(f"PGA     {label}", total=len(info["layers"]) * chunks)
            rows += orchestrate.run_pga(store, spec.slug, spec.revision, info["layers"], job.pga,
                                        progress=lambda n: progress.advance(pga_task, n))
    table = report.write_rows(rows, store.root / "results" / "pga.parquet")
    plot = report.plot_z_vs_depth(rows, store.root / "plots" / "pga_z_vs_depth.png", title=f"Subspace PGA: {job.name}")
    report.print_pga(console, rows)
    console.print(f"results: {table}\nplot:    {plot}\nstore:   {store.root}")
    return JobOutputs(rows, table, plot)
