"""CLI commands for the dispersion analyses (registered by raygeom.cli)."""

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the raygeom app."""
