"""`raygeom explain [NAME]`: the job-file reference (docs/job-files.md) made from the declarations, for one analysis
or section in the terminal, or the whole page with ``--markdown``; `raygeom tiny-pythia DIR`: models to try a job on offline (registered by
raygeom.cli.root)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer

from raygeom.cli.flags import fail
from raygeom.errors import RaygeomError


def register(app: typer.Typer) -> None:
    """Add this module's commands to the raygeom app."""
    register_tiny(app)

    @app.command()
    def explain(
        name: Optional[str] = typer.Argument(
            None, help="An analysis (pga, spectral, ...) or a section (job, models, corpus, extract, sweep, train, ...)."
        ),
        markdown: bool = typer.Option(False, "--markdown", help="Print the whole reference as Markdown (docs/job-files.md)."),
    ):
        """What a job file's section or analysis table takes: every key with its type, default, allowed values and
        help, from the declarations. Without NAME, the names it knows; --markdown prints docs/job-files.md."""
        from raygeom.jobs import reference

        try:
            if markdown:
                text = reference.markdown() if name is None else reference.section_text(name)
            elif name is None:
                names = [s.name for s in reference.job_sections()] + [s.name for s in reference.analysis_sections()]
                text = "sections and analyses: " + ", ".join(dict.fromkeys(names)) + "\n(raygeom explain NAME)\n"
            else:
                text = reference.section_text(name)
        except RaygeomError as error:
            fail(str(error))
        typer.echo(text, nl=False)


def register_tiny(app: typer.Typer) -> None:
    """`raygeom tiny-pythia DIR`: tiny random-weight Pythia stand-ins in an HF cache folder, for an offline sweep."""

    @app.command(name="tiny-pythia")
    def tiny_pythia(
        cache: Path = typer.Argument(..., help="The HF cache folder to write (use it as HF_HUB_CACHE)."),
        model: list[str] = typer.Option(
            ["EleutherAI/pythia-14m"], "--model", "-m", help="Pythia repo ids to write (repeatable)."
        ),
        revisions: str = typer.Option(
            "step0,step1000,step143000", "--revisions", help="Comma-separated Pythia revisions (stepN) to write."
        ),
    ):
        """Write tiny random-weight GPT-NeoX models (d=64, 3 blocks, a 320-token tokenizer) under the real Pythia repo
        ids and stepN revisions into an HF cache folder, so a sweep runs offline, with no download:
        HF_HUB_CACHE=DIR HF_HUB_OFFLINE=1 raygeom run jobs/tiny-pythia.toml. The weights are random (each revision
        its own seed): they test the machinery, not a finding."""
        from raygeom.sources.revisions import PYTHIA_REVISIONS, PYTHIA_SIZES

        wanted = [r.strip() for r in revisions.split(",") if r.strip()]
        unknown = [r for r in wanted if r not in PYTHIA_REVISIONS]
        if not wanted or unknown:
            fail(
                f"--revisions must name Pythia revisions such as step0,step1000,step143000; "
                f"not one: {unknown[0] if unknown else repr(revisions)}"
            )
        sizes = "|".join(map(re.escape, PYTHIA_SIZES))
        for repo in model:
            if not re.fullmatch(rf"EleutherAI/pythia-({sizes})(-deduped)?", repo):
                fail(f"--model must be a Pythia repo id such as EleutherAI/pythia-14m, got {repo!r}")
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            fail(f"cannot make {cache}: {error.strerror or error}")
        from transformers.utils import logging as transformers_logging

        from raygeom.sources.tiny_pythia import write_tiny_pythia

        transformers_logging.disable_progress_bar()  # one line per model, not a bar per shard

        for repo in model:
            write_tiny_pythia(cache, repo, wanted)
            typer.echo(f"wrote {repo} at {', '.join(wanted)} (tiny, random weights) in {cache}")
        typer.echo(f"use it: HF_HUB_CACHE={cache.resolve()} HF_HUB_OFFLINE=1 raygeom run jobs/tiny-pythia.toml")
