"""The analysis registry, in the manner of lm-evaluation-harness's ``register_task``.

An analysis is one file: a class decorated with :func:`register` that declares, in one place, its name and
version, its typed :class:`Params` (every field declared once with :func:`param`: type, range, help), the
extraction it needs, its units (pure steps for the engine), its tidy table's columns, the per-layer metrics
the report draws and the settings that tell its series apart. The CLI commands, the ``[analyses.<name>]``
sections of job files, ``plan``/``status`` and the report are built from here; none of them names an analysis.

Declarations import no torch, Ray or model code, so a bad value is refused in well under a second.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable

from raygeom.errors import RaygeomError
from raygeom.params import Params, for_width, k_per_d_param, key_settings, nearest, param  # noqa: F401 - an analysis file declares its Params with these

@dataclass(frozen=True)
class Needs:
    """What an analysis asks of the extraction it runs on."""

    nll: bool = False  # per-sample NLL (costs the full-vocabulary LM head)
    labels: bool = False  # corpus labels
    readout: bool = False  # the stored readout basis of W_U


@dataclass(frozen=True)
class Metric:
    """A per-layer number the report draws (against depth, and as a step x layer heatmap in sweeps)."""

    column: str
    title: str
    lo: str | None = None  # columns of its 95 % interval, when it has one
    hi: str | None = None
    chance: str | None = None  # a column with the chance level to draw beside it


class Analysis:
    """One registered analysis. Subclasses set the class attributes and implement :meth:`units`."""

    name: ClassVar[str]
    version: ClassVar[int]
    Params: ClassVar[type]
    title: ClassVar[str]
    needs: ClassVar[Needs] = Needs()
    columns: ClassVar[tuple[str, ...]] = ()  # its own columns in the tidy table (beside model/revision/layer/...)
    metrics: ClassVar[tuple[Metric, ...]] = ()
    series: ClassVar[tuple[str, ...]] = ()  # parameter columns that make rows of one model/revision different series
    # What it reads. "pooled": the job's [extract] extraction (one vector per text and layer), shared by every such
    # analysis and run unit by unit through units(). Any other value names an extraction of its own ("chunks":
    # token-level chunks per domain; "knn": kNN-LM datastore features; "aligned": texts cut where every model's
    # tokenizer reads them whole), made and analysed by run(); analyses naming the same one share it.
    extraction: ClassVar[str] = "pooled"
    results: ClassVar[str | None] = None  # the results/<dir>/ its unit rows are stored in (None: its name)
    # "module:function" drawing its report section from a store root; None: the generic section (each metric by
    # depth, and a step x layer heatmap per setting). Analyses naming one function share that section.
    section: ClassVar[str | None] = None
    command: ClassVar[str | None] = None  # the hand-written command that also runs it (raygeom <command>), if any

    def for_width(self, params, d: int | None):
        """``params`` on a model of width ``d`` (k from a fixed k/d); None: width unknown."""
        return for_width(params, d)

    def check(self, params, info: dict, model: str) -> None:
        """Refuse, before any work, parameters this extraction cannot serve (e.g. k >= d)."""

    def check_job(self, params, job) -> None:
        """Refuse, when the job file is read, a job this analysis can never run on (e.g. one model for a comparison
        of models), so a job-file analysis refuses what its command refuses."""

    def units(self, store, model: str, revision: str, layers: list[str], params, info: dict) -> list:
        raise NotImplementedError

    def run(self, store, job, specs: list, params, progress) -> list[dict]:
        """An analysis with an extraction of its own: extract what it needs for ``specs`` (reusing what the store
        holds) and analyse it through the engine's units; returns this job's rows (each with its ``unit_key``).
        ``progress(label, total)`` gives a function that advances a progress bar by n."""
        raise NotImplementedError

    def planned_units(self, store, job, specs: list, params) -> tuple[int, int]:
        """(units, done) ``run`` would have for ``specs``: what ``plan`` and ``status`` count for it."""
        raise NotImplementedError

    @property
    def results_dir(self) -> str:
        return self.results or self.name

    def progress_cost(self, params) -> int:
        """What one unit counts on the progress bar (its steps)."""
        return 1

    def unit_key(self, extraction_key: str, layer: str, params) -> str:
        """The content key of one unit: the extraction, the layer, this analysis's version and every parameter, so
        a store reused with other settings never mixes them; ``plan`` and ``status`` count units by it."""
        from raygeom.store.tree import content_key

        return content_key(self.name, self.version, extraction_key, layer, *key_settings(params))


_REGISTRY: dict[str, Analysis] = {}
_DISCOVERED: list[bool] = []  # every registering module imported once


def register(cls: type) -> type:
    """Class decorator: add an analysis to the registry under ``cls.name`` (once)."""
    if cls.name in _REGISTRY and type(_REGISTRY[cls.name]) is not cls:
        raise RuntimeError(f"analysis {cls.name!r} is registered twice")
    _REGISTRY[cls.name] = cls()
    return cls


def _discover() -> None:
    import raygeom.analyses as package

    # Only the files that register something are imported: the other analysis modules pull in torch, and the CLI
    # (built from this registry) must refuse bad input before any of that loads.
    for module in pkgutil.iter_modules(package.__path__):
        path = Path(package.__path__[0]) / f"{module.name}.py"
        if module.name != "registry" and path.is_file() and "\n@register\n" in path.read_text():
            importlib.import_module(f"raygeom.analyses.{module.name}")


def analyses() -> dict[str, Analysis]:
    """Every registered analysis by name (every module of raygeom.analyses is imported once)."""
    if not _DISCOVERED:
        _discover()
        _DISCOVERED.append(True)
    return dict(_REGISTRY)


def get(name: str) -> Analysis:
    known = analyses()
    if name not in known:
        raise RaygeomError(f"unknown analysis {name!r}{nearest(name, known)}; registered: {', '.join(sorted(known))}")
    return known[name]


@dataclass(frozen=True)
class Planned:
    """One analysis with one set of parameters, as a job runs it."""

    analysis: str
    params: Any

    @property
    def spec(self) -> Analysis:
        return get(self.analysis)


def parse_analyses(section: dict, where: str = "") -> tuple[Planned, ...]:
    """The ``[analyses]`` table of a job file: ``[analyses.<name>]`` sub-tables of parameters (lists = grids)."""
    if not isinstance(section, dict):
        raise RaygeomError(f"{where}[analyses] must be a table of [analyses.<name>] tables")
    planned = []
    for name, values in section.items():
        try:
            analysis = get(name)
        except RaygeomError as error:
            raise RaygeomError(f"{where}[analyses.{name}]: {error}") from None
        # [[analyses.<name>]] (an array of tables): several grids of one analysis, e.g. a k/d ladder and one fixed k
        tables = values if isinstance(values, list) and values else [values]
        for index, table in enumerate(tables):
            label = f"[analyses.{name}]" if len(tables) == 1 else f"[[analyses.{name}]] #{index + 1}"
            if not isinstance(table, dict):
                raise RaygeomError(f"{where}{label} must be a table (possibly empty)")
            planned += [Planned(name, p) for p in analysis.Params.grid(table, f"{where}{label} ")
                        if Planned(name, p) not in planned]
    if not planned:
        raise RaygeomError(f"{where}[analyses] names no analysis; registered: {', '.join(sorted(analyses()))}")
    return tuple(planned)


def units_for(store, model: str, revision: str, layers: list[str], info: dict, planned: Iterable[Planned]) -> list:
    """Every unit of ``planned`` on one landed extraction."""
    out = []
    for item in planned:
        spec = item.spec
        if spec.extraction != "pooled":  # run by the job after its pooled extraction, through spec.run
            continue
        params = spec.for_width(item.params, info.get("d"))
        spec.check(params, info, model)
        out += spec.units(store, model, revision, layers, params, info)
    return out


def layer_units(analysis: Analysis, params, store, model: str, revision: str, layers: list[str], info: dict, task,
                args: tuple, finish) -> list:
    """One unit per layer: ``task(root, model, revision, layer, *args, extraction key)`` on a worker, then
    ``finish(layer, value)`` on the driver gives its row(s), each carrying its ``unit_key``."""
    from raygeom.analyses.provenance import layer_row
    from raygeom.engine.contract import Step, Unit

    root = str(store.root)
    out = []
    for layer in layers:
        key = analysis.unit_key(info["key"], layer, params)

        def done(values, layer=layer, key=key):
            rows = finish(layer, values[0])
            return [{**row, "unit_key": key} for row in rows] if isinstance(rows, list) else {**rows, "unit_key": key}

        def degenerate(reason: str, layer=layer, key=key) -> dict:
            # A layer the task refuses (e.g. every sample one vector): shown with its reason, never stored as done.
            return {**layer_row(model, revision, layer, info), "note": reason, "unit_key": key}

        out.append(Unit(analysis=analysis.name, key=key, label=f"{model}@{revision} {layer} ({analysis.name})",
                        parts=[Step(task, (root, model, revision, layer, *args, info["key"]))], finish=done,
                        degenerate=degenerate, extractions=((model, revision, info["key"]),)))
    return out


def read_layer(root: str, model: str, revision: str, layer: str, extraction_key: str):
    """(sample ids, vectors) of a layer, only if the store still holds the extraction the unit was planned on."""
    from raygeom.store.tree import Store

    return Store(root).read_layer(model, revision, layer, key=extraction_key)
