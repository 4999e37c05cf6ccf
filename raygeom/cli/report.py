"""`raygeom report STORE`: one self-contained interactive HTML file of everything a store holds
(registered by raygeom.cli.root)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from raygeom.cli.consoles import output_width
from raygeom.errors import RaygeomError

console = Console(width=output_width())
errors = Console(stderr=True)


def register(app: typer.Typer) -> None:
    """Add this module's command to the raygeom app."""

    @app.command()
    def report(store: Path = typer.Argument(..., help="The store (a run's --out directory)."),
               out: Optional[Path] = typer.Option(None, "--out", "-o", help="HTML file to write (default: STORE/report.html).")):
        """Write one self-contained, interactive HTML report of every result in STORE: PGA z by depth, sweep heatmaps,
        diagnostics, convergence, dispersion, kNN-LM, training curves and the settings of every run. It opens offline."""
        from raygeom.report.html import write_report

        try:
            with console.status(f"reading {store}"):
                path = write_report(store, out)
        except RaygeomError as error:
            errors.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2)
        console.print(f"report: {path} ({path.stat().st_size / 1e6:.1f} MB)", highlight=False)
        from raygeom.report.html import _UNREADABLE

        for unreadable, reason in _UNREADABLE:
            errors.print(f"[yellow]warning:[/] left out {escape(str(unreadable))}: {escape(reason)}", highlight=False,
                         soft_wrap=True)
