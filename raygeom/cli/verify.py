"""`raygeom verify STORE`: every checksum and key in a store, including files no unit needs now."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from raygeom.errors import RaygeomError

console = Console()
errors = Console(stderr=True)


def register(app: typer.Typer) -> None:
    """Add this module's command to the raygeom app."""

    @app.command()
    def verify(store: Path = typer.Argument(..., help="The store (a run's --out directory).")):
        """Check every stored file's checksum, and that every layer, unit and completion marker is the one its place
        names. Lists the damaged files (a rerun recomputes them) and exits 1 when there are any."""
        from raygeom.store.audit import audit

        try:
            found = audit(store)
        except RaygeomError as error:
            errors.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2)
        for _, reason in found.damaged:
            errors.print(f"[red]damaged:[/] {escape(reason)}", highlight=False, soft_wrap=True)
        console.print(f"{found.checked} files checked, {len(found.damaged)} damaged"
                      + (f", {found.unrecorded} not written by the store (no checksum to check)" if found.unrecorded else ""),
                      highlight=False)
        if found.damaged:
            raise typer.Exit(1)
