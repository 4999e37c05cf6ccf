"""A run's first step: the job as it will run (a sweep's ``revisions = "all"`` as the hub lists them), every refusal
before Ray starts (raygeom.jobs.preflight, what ``raygeom plan`` checks too), the store and the texts of the pooled
pass. Loads no model and starts no Ray."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from raygeom.jobs.passes import needs_pooled, pooled_corpus
from raygeom.jobs.preflight import preflight
from raygeom.jobspec import JobSpec
from raygeom.sources.models import ModelSpec
from raygeom.store.tree import Store, check_writable


@dataclass
class Loaded:
    job: JobSpec
    specs: list[ModelSpec]  # every (model, revision) of the job, in its order
    corpus: object  # the texts of the pooled pass (sampled; aligned when the job compares models)
    store: Store


def load(job: JobSpec, console: Console, local: bool) -> Loaded:
    """The job, checked, with its store and texts. ``local``: the run starts a local Ray (its models must fit this
    machine's memory)."""
    job = hub_revision_lists(job, console)
    corpus = preflight(job, console, local=local)  # sampled when the pooled pass reads it; the others read it their way
    store = Store(job.out)
    check_writable(store.root)
    specs = job.model_specs()
    if job.sweep or needs_pooled(job):  # the texts of its pooled pass (aligned when the job compares models)
        corpus = pooled_corpus(job, specs, corpus)
    if job.sweep:
        from raygeom.store.manifest import write_manifest

        write_manifest(store, job, corpus)
    return Loaded(job, specs, corpus, store)


def hub_revision_lists(job: JobSpec, console: Console) -> JobSpec:
    """``revisions = "all"`` names the 154 Pythia checkpoints of raygeom.sources.revisions; when the hub answers, each
    model's own list (its stepN branches) is used instead, and a difference is one warning line."""
    from dataclasses import replace

    from raygeom.sources import download
    from raygeom.sources.revisions import PYTHIA_REVISIONS

    if not job.sweep or not download.online():
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
