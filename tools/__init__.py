"""The repository's scripts: what builds docs/results/ from the rows shipped there (``python -m tools.results_pages``).
Not part of the installed package (pyproject.toml installs raygeom* alone)."""
