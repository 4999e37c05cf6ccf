"""The analysis registry, in the manner of lm-evaluation-harness's ``register_task``.

An analysis is one class decorated with :func:`register`, in a file of its own (some keep the steps they run in a
companion module that registers nothing: converge, diagnostics, knn, dispersion), that declares, in one place, its name and
version, its typed :class:`Params` (every field declared once with :func:`param`: type, range, help), the
extraction it needs, its units (pure steps for the engine), its tidy table's columns, the per-layer metrics
the report draws and the settings that tell its series apart. The CLI commands, the ``[analyses.<name>]``
sections of job files, ``plan``/``status`` and the report are built from here; none of them names an analysis.

Declarations import no torch, Ray or model code, so a bad value is refused in well under a second.
"""

from __future__ import annotations

import abc
import importlib
import importlib.metadata
import math
import pkgutil
import sys
from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, Iterable

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
    lo: str | None = None  # columns of its interval, when it has one
    hi: str | None = None
    chance: str | None = None  # a column with the chance level to draw beside it
    # The interval's coverage: a number in (0, 1), or the declared column that holds it per row (a parameter such as
    # ``level``); labels and legends name it ("80 %").
    level: float | str = 0.95

    def level_label(self, rows: Iterable[dict] = ()) -> str:
        """The interval's coverage as labels say it: "95 %"; from the rows' column where ``level`` names one (each
        distinct value, "90 %/95 %"), the declared number otherwise."""
        if isinstance(self.level, str):
            values = sorted({row[self.level] for row in rows if _coverage(row.get(self.level))})
        else:
            values = [self.level]
        return "/".join(f"{100 * value:.4g} %" for value in values) or "?"


def _coverage(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 < value < 1


@dataclass(frozen=True)
class Reads:
    """The forward pass an analysis reads on each (model, revision): analyses whose ``Reads`` are equal share one pass.

    ``kind`` "pooled" is the job's [extract] extraction (one vector per text and layer). ``texts``: for a pooled
    reader, the text set it needs the pooled extraction to read (None: the job's sample as it is); the first such set
    becomes the pooled pass's, so e.g. convergence's aligned texts serve every pooled analysis. Any other kind is an
    extraction of the analysis's own, told apart by ``settings``; ``why`` says what it reads that the pooled pass
    does not, for ``plan``."""

    kind: str = "pooled"
    texts: Any = None
    settings: Any = None
    why: str = ""
    shared: bool = True  # whether the job's other pooled readers may read ``texts`` (False: a pass of its own)


# What each kind of extraction asks an analysis to implement (the abstract methods of its class).
REQUIRED = {"pooled": ("units",)}
OWN_EXTRACTION = ("run", "planned_units")
KIND_METHODS = ("units", "run", "planned_units")


class _AnalysisMeta(abc.ABCMeta):
    """Makes abstract exactly the methods an analysis's extraction kind requires: ``units`` for one that reads the
    pooled extraction, ``run`` and ``planned_units`` for one with an extraction of its own."""

    def __new__(mcs, name, bases, namespace, **kwargs):
        cls = super().__new__(mcs, name, bases, namespace, **kwargs)
        required = REQUIRED.get(cls.extraction, OWN_EXTRACTION)
        unmet = {m for m in KIND_METHODS if m in required and getattr(getattr(cls, m), "__isabstractmethod__", False)}
        cls.__abstractmethods__ = frozenset((set(cls.__abstractmethods__) - set(KIND_METHODS)) | unmet)
        return cls


class Analysis(abc.ABC, metaclass=_AnalysisMeta):
    """One registered analysis: an abstract base class. A subclass sets the class attributes and implements what its
    extraction kind requires (``units`` for "pooled"; ``run`` and ``planned_units`` for an extraction of its own);
    :func:`register` refuses one that does not, or whose declarations disagree."""

    name: ClassVar[str]
    version: ClassVar[int]
    Params: ClassVar[type]
    title: ClassVar[str]
    needs: ClassVar[Needs] = Needs()
    columns: ClassVar[tuple[str, ...]] = ()  # its own columns in the tidy table (beside model/revision/layer/...)
    metrics: ClassVar[tuple[Metric, ...]] = ()
    series: ClassVar[tuple[str, ...]] = ()  # parameter columns that make rows of one model/revision different series
    # declared columns that hold a measurement though a parameter has the name (PGA's z_half_width: z's interval in a
    # row, the --n-null auto target in its Params): never a setting (raygeom export names runs by settings only)
    measured: ClassVar[tuple[str, ...]] = ()
    # What it reads. "pooled": the job's [extract] extraction (one vector per text and layer), shared by every such
    # analysis and run unit by unit through units(). Any other value names an extraction of its own ("chunks":
    # token-level chunks per domain; "knn": kNN-LM datastore features; "aligned": texts cut where every model's
    # tokenizer reads them whole), made and analysed by run(); analyses naming the same one share it.
    extraction: ClassVar[str] = "pooled"
    results: ClassVar[str | None] = None  # the results/<dir>/ its unit rows are stored in (None: its name)
    # How it is drawn is the report layer's: raygeom.report.renderers keys a section and figures by the analysis's
    # name (the generic ones where it has none); a plugin registers its own there (CONTRIBUTING.md).
    command: ClassVar[str | None] = None  # the name of its generated command (raygeom <command>), if not its name
    # CSV name -> a results/ table (e.g. a side table its run writes) whose rows of this run's units --report copies
    tables: ClassVar[dict[str, str]] = {}
    # Settings raygeom plan names in its title (each one value, or the grid's values)
    headline: ClassVar[tuple[str, ...]] = ()

    def reads(self, params, job) -> Reads:
        """The forward pass this analysis reads (see :class:`Reads`): by default the pooled extraction, or, for an
        analysis with an extraction of its own, that extraction at every parameter."""
        if self.extraction == "pooled":
            return Reads()
        return Reads(self.extraction, settings=key_settings(params), why=f"the {self.extraction} extraction")

    def pooled_corpus(self, params, job, specs: list, corpus):
        """The pooled extraction's texts this analysis needs, from the job's sample ``corpus`` (its ``Reads.texts``
        names them); only called when that is not None."""
        return corpus

    def extracted(self, store, job, spec, params) -> bool:
        """Whether the store holds this analysis's own extraction of ``spec`` (what ``plan`` and ``run`` count as a
        forward pass done); pooled readers are counted by the pooled extraction."""
        return False

    def for_width(self, params, d: int | None):
        """``params`` on a model of width ``d`` (k from a fixed k/d); None: width unknown."""
        return for_width(params, d)

    def check(self, params, info: dict, model: str) -> None:
        """Refuse, before any work, parameters this extraction cannot serve (e.g. k >= d)."""

    def check_job(self, params, job) -> None:
        """Refuse a job this analysis can never run on (e.g. one model for a comparison of models): called when a job
        file is read and before a command's work, so a job-file analysis and its command refuse the same things."""

    def check_texts(self, params, corpus, width: int | None, words: dict) -> str | None:
        """Refuse, before any work, a text sample this analysis can never score (``width``: the widest model's d
        where it is known before any loads, else None; ``words``: how the messages name parameters). Returns a line
        to print about the sample (e.g. that some texts repeat), or None."""
        return None

    def chunk_counts(self, params, corpus) -> list[tuple[str, int, int, int, list[str], list | None, str]]:
        """The chunk counts this analysis asks of ``corpus``, which the corpus bounds: (its key, count, chunk_len,
        seed, the texts it cuts them from, their labels (None: unlabelled), what part of the corpus they are, as a
        message says it). ``plan`` and ``run`` refuse a count the corpus cannot give before any work."""
        return []

    def console(self, rows: list[dict], store=None) -> list[str]:
        """The lines a run prints of this job's rows (plain text; ``store``: where they are, for what they decide);
        empty: the generic table of its metrics or columns."""
        return []

    def documents(self, rows: list[dict]) -> dict[str, str]:
        """Text files (name -> text) a run writes beside its table under results/, e.g. a Markdown summary."""
        return {}

    @abc.abstractmethod
    def units(self, store, model: str, revision: str, layers: list[str], params, info: dict) -> list:
        """A pooled analysis's engine units on one landed extraction (see :func:`layer_units`)."""

    @abc.abstractmethod
    def run(self, store, job, specs: list, params, progress) -> list[dict]:
        """An analysis with an extraction of its own: extract what it needs for ``specs`` (reusing what the store
        holds) and analyse it through the engine's units; returns this job's rows (each with its ``unit_key``).
        ``progress(label, total)`` gives a function that advances a progress bar by n."""

    @abc.abstractmethod
    def planned_units(self, store, job, specs: list, params) -> tuple[int, int]:
        """(units, done) ``run`` would have for ``specs``: what ``plan`` and ``status`` count for it."""

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

    def work(self, row: dict) -> float:
        """The work of one unit, from a row's settings, ``n`` and ``d`` (a stored row, or the settings of a unit still
        to run): ``raygeom plan`` prices missing units at the CPU-seconds per work of the stored ones. By default
        N d min(N, d), a decomposition of one layer's N x d matrix; 1 (seconds per unit) where a row has no N or d."""
        n, d = row.get("n"), row.get("d")
        return float(n) * d * min(n, d) if n and d else 1.0

    def work_words(self, row: dict) -> str:
        """What :meth:`work` counts for rows like ``row``, as ``raygeom plan`` says it."""
        return "N d min(N, d)" if row.get("n") and row.get("d") else "unit"

    def reference_seconds(self, row: dict) -> float | None:
        """CPU-seconds of one unit (settings as for :meth:`work`) before a store has measured any, from a benchmark;
        None: not priced until measured."""
        return None

    def headline_values(self, params) -> dict:
        """The :attr:`headline` settings of ``params`` as ``raygeom plan``'s title says them."""
        return {name: getattr(params, name) for name in self.headline}

    def plan_lines(self, plan, cost) -> list[str]:
        """Lines ``raygeom plan`` adds for this analysis (``plan``: raygeom.jobs.plan.SweepPlan; ``cost``: its
        AnalysisCost), e.g. what PGA's ``n_null = "auto"`` may cost."""
        return []

    def check_rows(self, rows: list[dict]) -> None:
        """Rows as the declaration says: each (but a refused layer's, which carries a ``note``) holds every declared
        column, so the series and metrics the report draws from them exist. A defect of the analysis (or rows
        stored by an older row shape under the same version), not of the input."""
        for row in rows:
            missing = [c for c in self.columns if c not in row]
            if missing and not row.get("note"):
                raise RuntimeError(
                    f"analysis {self.name!r} (version {self.version}) has a row without its declared "
                    f"column(s) {', '.join(missing)}; a changed row needs a version bump"
                )


class PerLayer(Analysis):
    """A pooled analysis that computes one row per layer: declare ``task``, a module-level function
    ``task(root, model, revision, layer, *arguments, extraction key) -> dict`` run on a worker (it reads the layer with
    :func:`read_layer`), and ``arguments``, the names of the Params fields passed to it, in order. Each row is
    :func:`~raygeom.analyses.provenance.layer_row`, then every parameter that is a declared column, then
    :meth:`finish` of what the task returned (by default that dict as it is)."""

    task: ClassVar[Callable[..., dict]]
    arguments: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        task = cls.__dict__.get("task")
        if callable(task) and not isinstance(task, staticmethod):  # a plain function stays one, not a bound method
            cls.task = staticmethod(task)

    def finish(self, params, value: dict) -> dict:
        """This analysis's own columns of one layer's row, from what its task returned."""
        return value

    def units(self, store, model: str, revision: str, layers: list[str], params, info: dict) -> list:
        from raygeom.analyses.provenance import layer_row

        given = {name: getattr(params, name) for name in (f.name for f in fields(params)) if name in self.columns}
        return layer_units(
            self,
            params,
            store,
            model,
            revision,
            layers,
            info,
            type(self).task,
            tuple(getattr(params, name) for name in self.arguments),
            lambda layer, value: {**layer_row(model, revision, layer, info), **given, **self.finish(params, value)},
        )


_REGISTRY: dict[str, Analysis] = {}
_DISCOVERED: list[bool] = []  # every analysis module and entry point imported once
ENTRY_POINTS = "raygeom.analyses"  # the entry-point group through which another package adds analyses
FAILED: list[str] = []  # the warning line of each entry point that failed to load, in this process
# The CLI's own commands (raygeom.cli): no analysis may be named or called as one (the built-in would silently win).
# tests/unit/test_cli.py checks this against the commands the CLI really has.
RESERVED_COMMANDS = ("analyze", "explain", "export", "gc", "plan", "report", "run", "status", "tiny-pythia", "train", "verify")


def _check_declaration(cls: type) -> None:
    """What the CLI, job files and report build from must agree: a name, a version, declared Params, metrics within
    the columns, and every ``series`` name both a parameter and a column (else its rows would be series without a
    label); the methods its extraction kind requires."""
    where = f"analysis {getattr(cls, 'name', cls.__name__)!r}"
    for attribute in ("name", "version", "Params", "title"):
        if not hasattr(cls, attribute):
            raise TypeError(f"{where} declares no {attribute}")
    if not isinstance(cls.name, str) or not cls.name.isidentifier():
        raise TypeError(f"{where}: its name must be an identifier (letters, digits and _), as it names a command and files")
    if cls.command is not None and (not isinstance(cls.command, str) or not cls.command.isidentifier()):
        raise TypeError(f"{where}: its command {cls.command!r} must be an identifier")
    if not isinstance(cls.version, int) or isinstance(cls.version, bool) or cls.version < 1:
        raise TypeError(f"{where}: version must be a positive integer, got {cls.version!r}")
    if not (isinstance(cls.Params, type) and issubclass(cls.Params, Params)):
        raise TypeError(f"{where}: Params must be a raygeom.params.Params dataclass")
    if cls.__abstractmethods__:
        raise TypeError(
            f"{where} (extraction {cls.extraction!r}) does not implement {', '.join(sorted(cls.__abstractmethods__))}"
        )
    parameters = {f.name for f in fields(cls.Params)}
    columns = set(cls.columns)
    if cls.extraction == "pooled":
        from raygeom.analyses.provenance import PROVENANCE_COLUMNS

        taken = [c for c in cls.columns if c in PROVENANCE_COLUMNS]
        if taken:
            raise TypeError(
                f"{where}: column(s) {', '.join(taken)} are provenance columns every row already carries (layer_row); "
                "name its own column otherwise"
            )
    if issubclass(cls, PerLayer):
        if not callable(getattr(cls, "task", None)):
            raise TypeError(f"{where}: a PerLayer analysis declares its task")
        unknown = [a for a in cls.arguments if a not in parameters]
        if unknown:
            raise TypeError(f"{where}: arguments {', '.join(unknown)} are not parameters")
    for name in cls.series:
        if name not in parameters or name not in columns:
            raise TypeError(
                f"{where}: series name {name!r} must be a parameter and a declared column "
                f"({'not a parameter' if name not in parameters else 'not a column'})"
            )
    for name in cls.measured:
        if name not in columns or name in cls.series:
            raise TypeError(f"{where}: measured column {name!r} must be a declared column and not a series name")
    for metric in cls.metrics:
        unknown = [c for c in (metric.column, metric.lo, metric.hi, metric.chance) if c is not None and c not in columns]
        if unknown:
            raise TypeError(f"{where}: metric {metric.column!r} names undeclared column(s) {', '.join(unknown)}")
        if not (_coverage(metric.level) or (isinstance(metric.level, str) and metric.level in columns)):
            raise TypeError(
                f"{where}: metric {metric.column!r} has level {metric.level!r}; a coverage > 0 and < 1, or a declared column"
            )


def _check_names(cls: type) -> None:
    """Its name and command are no built-in command's, and no other analysis's name or command: the command line
    would run the other one (analyses may share a command, as token_dispersion and slices share ``dispersion``)."""
    where = f"analysis {cls.name!r}"
    for what, value in (("name", cls.name), ("command", cls.command)):
        if value in RESERVED_COMMANDS:
            raise TypeError(f"{where}: its {what} {value!r} is a built-in command of raygeom")
    for other in _REGISTRY.values():
        if (type(other).__module__, type(other).__qualname__) == (cls.__module__, cls.__qualname__):
            continue
        if cls.name == (other.command or other.name) or (cls.command and cls.command == other.name):
            raise TypeError(f"{where}: its name or command is analysis {other.name!r}'s")


def register(cls: type) -> type:
    """Class decorator: check an analysis's declaration and add it to the registry under ``cls.name`` (once)."""
    _check_declaration(cls)
    if cls.name not in _REGISTRY:
        _check_names(cls)
    if cls.name in _REGISTRY and (type(_REGISTRY[cls.name]).__module__, type(_REGISTRY[cls.name]).__qualname__) != (
        cls.__module__,
        cls.__qualname__,
    ):
        raise RuntimeError(f"analysis {cls.name!r} is registered twice")
    _REGISTRY[cls.name] = cls()
    return cls


def _discover() -> None:
    """Import every module of raygeom.analyses (its @register classes register themselves), then every module the
    ``raygeom.analyses`` entry-point group names. These modules import no torch, Ray or model code at import, so
    the CLI built from the registry refuses bad input before any of that loads."""
    import raygeom.analyses as package

    for module in pkgutil.iter_modules(package.__path__):
        if module.name != "registry":
            importlib.import_module(f"{package.__name__}.{module.name}")
    load_entry_points(ENTRY_POINTS)


def load_entry_points(group: str) -> list:
    """Load every entry point of ``group`` (another package's modules, e.g. its analyses or renderers); return what
    loaded. One that fails to import (or whose declaration is refused) costs one warning line on stderr naming it and
    its error, once per process, and is left out: raygeom and every other plugin still work."""
    loaded = []
    for entry in importlib.metadata.entry_points(group=group):
        try:
            loaded.append(entry.load())
        except Exception as error:  # noqa: BLE001 - another package's defect gets one line naming it
            detail = " ".join(str(error).split())
            line = f"warning: {group} entry point {entry.name!r} ({entry.value}) not loaded: {type(error).__name__}: {detail}"
            if line not in FAILED:
                FAILED.append(line)
                print(line, file=sys.stderr)
    return loaded


def analyses() -> dict[str, Analysis]:
    """Every registered analysis by name (discovered once: see :func:`_discover`)."""
    if not _DISCOVERED:
        _DISCOVERED.append(True)
        _discover()
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
            planned += [
                Planned(name, p) for p in analysis.Params.grid(table, f"{where}{label} ") if Planned(name, p) not in planned
            ]
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


def layer_units(
    analysis: Analysis, params, store, model: str, revision: str, layers: list[str], info: dict, task, args: tuple, finish
) -> list:
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
            analysis.check_rows(rows if isinstance(rows, list) else [rows])
            return [{**row, "unit_key": key} for row in rows] if isinstance(rows, list) else {**rows, "unit_key": key}

        def degenerate(reason: str, layer=layer, key=key) -> dict:
            # A layer the task refuses (e.g. every sample one vector): shown with its reason, never stored as done.
            return {**layer_row(model, revision, layer, info), "note": reason, "unit_key": key}

        out.append(
            Unit(
                analysis=analysis.name,
                key=key,
                label=f"{model}@{revision} {layer} ({analysis.name})",
                parts=[Step(task, (root, model, revision, layer, *args, info["key"]))],
                finish=done,
                degenerate=degenerate,
                extractions=((model, revision, info["key"]),),
            )
        )
    return out


def read_layer(root: str, model: str, revision: str, layer: str, extraction_key: str):
    """(sample ids, vectors) of a layer, only if the store still holds the extraction the unit was planned on."""
    from raygeom.store.tree import Store

    return Store(root).read_layer(model, revision, layer, key=extraction_key)
