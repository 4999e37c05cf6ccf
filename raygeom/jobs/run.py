"""``raygeom run``: a job's every (model, revision), in four steps, each a module of its own that this one calls in
turn: load (raygeom.jobs.load: the job, its refusals before Ray starts, the store, the texts), plan
(raygeom.jobs.plan: its units and what the store holds of them), extract (raygeom.jobs.extract: Ray, every forward
pass and the analyses on each, on one progress display), write (raygeom.jobs.write: tables, files and console lines).
A sweep (a job with [sweep]) is a run over revisions through the same four steps."""

from __future__ import annotations

from rich.console import Console

from raygeom.jobs.extract import extract
from raygeom.jobs.load import load
from raygeom.jobs.plan import build_plan
from raygeom.jobs.write import RunOutputs, write
from raygeom.jobspec import JobSpec


def run(
    job: JobSpec, console: Console, address: str | None = None, num_cpus: int | None = None, write_html: bool = True
) -> RunOutputs:
    """Run ``job`` on the Ray at ``address`` (None: a local one of ``num_cpus``). ``write_html``: write the HTML report
    too (a driver that adds to the store afterwards writes it once, at its end)."""
    loaded = load(job, console, local=address is None)  # every refusal, before Ray starts (what `raygeom plan` checks)
    plan = build_plan(loaded.job, loaded.store, loaded.corpus.fingerprint(), with_own=loaded.job.sweep is not None)
    extracted = extract(loaded, plan, console, address, num_cpus)
    return write(loaded, plan, extracted, console, write_html)
