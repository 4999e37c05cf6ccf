"""Rebuild the generated pages of docs/results/ from the tidy rows shipped beside each one, no store and no model
needed: ``python -m tools.results_pages docs/results`` (every generated page there) or
``python -m tools.results_pages docs/results/width.md`` (one). ``--check`` rebuilds into memory and exits 1,
naming the page, where a committed page differs from what its rows give (the figures are redrawn beside it).

These page builders are the repository's write-ups, not the package's: they import raygeom, raygeom imports none of
them (the jobs export the rows: raygeom.jobs.width.export_rows, raygeom.jobs.trajectory.export_rows); run them from
the repository's root."""

from __future__ import annotations

import sys
from pathlib import Path

from raygeom.report.figures import save_text

# page file name -> the module whose render_page(page) renders it from its rows folder (<page stem>/): the jobs' own
# pages from their tidy rows, the hand-written ones from their template's queries over their rows (tools/cited_pages.py)
GENERATED = {
    "width.md": "tools.width_page",
    "trajectory.md": "tools.trajectory_page",
    "pga.md": "tools.cited_pages",
    "dispersion.md": "tools.cited_pages",
}


def render(page: Path) -> str:
    import importlib

    return importlib.import_module(GENERATED[page.name]).render_page(page)


def pages(target: Path) -> list[Path]:
    if target.is_dir():
        return [target / name for name in GENERATED if (target / name).is_file() and (target / Path(name).stem).is_dir()]
    if target.name not in GENERATED:
        raise SystemExit(f"{target}: not a generated page (these are: {', '.join(GENERATED)})")
    return [target]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    args = [a for a in args if a != "--check"]
    if len(args) != 1:
        print("usage: python -m tools.results_pages [--check] docs/results | docs/results/<page>.md", file=sys.stderr)
        return 2
    target = Path(args[0])
    if not target.exists() and not (target.parent / target.stem).is_dir():  # a page is written from its rows folder
        print(f"{target}: no such page or folder", file=sys.stderr)
        return 2
    differ = []
    for page in pages(target):
        text = render(page)
        if check:
            if page.read_text() != text:
                differ.append(page)
        else:
            save_text(text, page)
            print(f"{page}: regenerated from {page.parent / page.stem}/")
    for page in differ:
        print(f"{page}: differs from what its rows in {page.parent / page.stem}/ give", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
