"""`raygeom explain [NAME]`: the job-file reference (docs/job-files.md) made from the declarations, for one analysis
or section in the terminal, or the whole page with ``--markdown`` (registered by raygeom.cli.root)."""

from __future__ import annotations

from typing import Optional

import typer

from raygeom.cli.flags import fail
from raygeom.errors import RaygeomError


def register(app: typer.Typer) -> None:
    """Add this module's command to the raygeom app."""

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
