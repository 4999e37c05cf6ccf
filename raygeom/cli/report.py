"""`raygeom report STORE`: one self-contained interactive HTML file of everything a store holds
(registered by raygeom.cli.root)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from raygeom.cli.consoles import LogConsole, output_width
from raygeom.errors import RaygeomError

console = LogConsole(width=output_width())
errors = Console(stderr=True)


def register(app: typer.Typer) -> None:
    """Add this module's command to the raygeom app."""

    @app.command()
    def report(
        stores: list[Path] = typer.Argument(
            ...,
            help="The store (a run's --out directory); more stores are "
            "overlaid on the first, each store one more facet of every series.",
        ),
        out: Optional[Path] = typer.Option(
            None, "--out", "-o", help="HTML file to write (default: STORE/report.html of the first store)."
        ),
    ):
        """Write one self-contained, interactive HTML report of every result in STORE: a section per analysis that has
        rows (each metric by depth, a panel per model, a revision x layer heatmap where there are several revisions),
        training curves and the settings of every run. It opens offline. `raygeom report A B` draws B's rows beside
        A's (each store by a short name in the legend)."""
        from raygeom.report.html import write_report

        store = stores[0]
        try:
            with console.status(escape(f"reading {', '.join(map(str, stores))}")):
                path = write_report(store, out, overlay=stores[1:])
        except RaygeomError as error:
            errors.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        console.print(f"report: {path} ({path.stat().st_size / 1e6:.1f} MB)", markup=False, highlight=False)
        from raygeom.report.html import UNREADABLE

        for unreadable, reason in UNREADABLE:
            errors.print(
                f"[yellow]warning:[/] left out {escape(str(unreadable))}: {escape(reason)}", highlight=False, soft_wrap=True
            )
