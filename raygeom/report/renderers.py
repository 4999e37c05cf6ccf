"""Who draws each analysis: the report layer's table of renderers, keyed by analysis name.

A renderer has three parts, each optional (None: the generic one, drawn from the analysis's declared metrics):

- ``section(root: Path) -> Section | None``: the analysis's section of the HTML report, from a store root (it reads
  the store's tables itself; None where the store holds none of its rows). The page heads it with the analysis's
  title and anchors it by its name.
- ``figures(rows: list[dict], directory: Path) -> list[Path]``: the PNGs a run of it leaves under ``plots/``, from
  that run's rows; returns the files written.
- ``console(console: Console, rows: list[dict]) -> None``: what a run prints of its rows (rich tables), in place of
  the analysis's ``console`` lines or the generic table of its metrics.
- ``sweep(console: Console, swept: Swept) -> object``: what a sweep (a run over revisions, a job with ``[sweep]``)
  shows and leaves of the analysis across its revisions, in place of ``console`` and ``figures``, after the revisions
  table (results/revisions.parquet); returns what it made (the run's outputs keep it under the analysis's name).

The built-in analyses' renderers are named here, as imports the import-graph test sees. Another package registers its
own with :func:`register_renderer` (or the :func:`renders` decorator), called from a module that the entry-point
group ``raygeom.renderers`` names in its ``pyproject.toml``; the report imports that group's modules the first time it
draws (CONTRIBUTING.md). A module that fails to import costs one warning line; its analysis is drawn generically.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from raygeom.analyses.registry import load_entry_points
from raygeom.report import analysis_sections, converge_plots, diagnostics_plots, dispersion_plots, figures, pga_sweep

ENTRY_POINTS = "raygeom.renderers"  # the entry-point group through which another package adds renderers

SectionFunction = Callable[[Path], "object | None"]
FiguresFunction = Callable[[list, Path], list]
ConsoleFunction = Callable[["object", list], None]
SweepFunction = Callable[["object", "Swept"], object]


@dataclass(frozen=True)
class Swept:
    """What a sweep's ``sweep`` renderer is given: the sweep's plan once its units ran (raygeom.jobs.plan.SweepPlan:
    its revisions, their units and the store), the analysis's table (results/<name>.parquet, just written), the
    revisions table's rows and path, and the job's [sweep] settings."""

    plan: object
    table: Path
    revisions: list[dict]
    revisions_table: Path
    settings: object


@dataclass(frozen=True)
class Renderer:
    """How one analysis is drawn; a part that is None is the generic one (``sweep``: none, its run's parts)."""

    section: SectionFunction | None = None
    figures: FiguresFunction | None = None
    console: ConsoleFunction | None = None
    sweep: SweepFunction | None = None

    PARTS = ("section", "figures", "console", "sweep")


BUILT_IN = {
    "convergence": Renderer(section=analysis_sections.converge_section, figures=converge_plots.figures),
    "diagnostics": Renderer(figures=diagnostics_plots.figures),
    "gap": Renderer(section=analysis_sections.gap_section, figures=dispersion_plots.gap_figures),
    "knn_lm": Renderer(section=analysis_sections.knn_section, figures=dispersion_plots.knn_figures),
    # its rows from the job's table and a sweep's tidy table too, with the sweep's collapse zones
    "pga": Renderer(
        section=analysis_sections.pga_section,
        figures=figures.pga_figures,
        console=figures.print_pga,
        sweep=pga_sweep.pga_sweep,
    ),
    # with the gap of each layer and the perplexity groups and domains its units write beside their rows
    "token_dispersion": Renderer(
        section=analysis_sections.token_dispersion_section, figures=dispersion_plots.token_dispersion_figures
    ),
}

_RENDERERS: dict[str, Renderer] = dict(BUILT_IN)
_DISCOVERED: list[bool] = []


def register_renderer(
    name: str,
    section: SectionFunction | None = None,
    figures: FiguresFunction | None = None,
    console: ConsoleFunction | None = None,
    sweep: SweepFunction | None = None,
) -> None:
    """Draw the analysis called ``name`` with ``section``, ``figures``, ``console`` and/or ``sweep`` (see the module's
    docstring for their signatures); a part not given stays as it was. Refuses a part that is not callable."""
    given = {"section": section, "figures": figures, "console": console, "sweep": sweep}
    for what, function in given.items():
        if function is not None and not callable(function):
            raise TypeError(f"the {what} renderer of analysis {name!r} must be a function, got {function!r}")
    before = _RENDERERS.get(name, Renderer())
    _RENDERERS[name] = Renderer(**{part: given[part] or getattr(before, part) for part in Renderer.PARTS})


def renders(name: str, part: str):
    """Decorator form of :func:`register_renderer`: ``@renders("mean_norm", "section")`` above a section function."""
    if part not in Renderer.PARTS:
        raise ValueError(f"a renderer part is one of {', '.join(map(repr, Renderer.PARTS))}, not {part!r}")

    def decorate(function):
        register_renderer(name, **{part: function})
        return function

    return decorate


def renderer(name: str) -> Renderer:
    """How the analysis called ``name`` is drawn (the ``raygeom.renderers`` entry points are loaded once, first)."""
    if not _DISCOVERED:
        _DISCOVERED.append(True)
        load_entry_points(ENTRY_POINTS)
    return _RENDERERS.get(name, Renderer())


def renderers() -> dict[str, Renderer]:
    """Every analysis with a renderer of its own, by name."""
    renderer("")
    return dict(_RENDERERS)
