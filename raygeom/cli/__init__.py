"""The raygeom command line: one Typer app, one module per command family."""

from raygeom.cli.root import app, main

__all__ = ["app", "main"]
