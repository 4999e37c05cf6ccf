"""A job's analyses on each landed extraction, and what they leave behind: the glue between a job file's
``[analyses.<name>]`` tables (raygeom.analyses.registry) and the engine's ``run_sweep``. Nothing here names an
analysis: every registered one is run, tabled, plotted and accumulated the same way."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from raygeom.analyses import registry

PLAIN_PROGRESS_SECONDS = 30.0  # without a terminal: a progress line at most this often


def progress_bar(console: Console):
    """Bars on a terminal; written to a log or a pipe, plain lines (:class:`PlainProgress`)."""
    if not console.is_terminal:
        return PlainProgress(console)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


@dataclass
class PlainTask:
    id: int
    description: str
    total: float | None
    completed: float = 0.0
    printed: tuple | None = None  # (completed, total) when last printed


class PlainProgress:
    """What a progress bar says, for a log: one plain line per stage (``progress 0:01:30  extract 2 models: 96/160``:
    elapsed time on the run's one clock, stage, done, total), at once when the first stage starts, then every
    ``interval`` seconds for each stage that moved or is still running (a heartbeat: a log never goes ``interval``
    seconds without a line while work goes on), and each stage's last count at the end. A stage whose total is not
    known yet is not printed. The part of rich's Progress the drivers use; thread-safe."""

    def __init__(self, console: Console, interval: float = PLAIN_PROGRESS_SECONDS, clock=time.monotonic, heartbeat: bool = True):
        import threading

        self.console, self.interval, self.clock = console, interval, clock
        self.tasks: list[PlainTask] = []
        self.started = clock()
        self.last: float | None = None
        self._lock = threading.RLock()
        self._stopped = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name="progress-heartbeat", daemon=True) if heartbeat else None

    def __enter__(self) -> Self:
        if self._heartbeat is not None:
            self._heartbeat.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopped.set()
        with self._lock:
            self._print()

    def _beat(self) -> None:
        while not self._stopped.wait(min(1.0, self.interval)):
            with self._lock:
                if self.last is not None and self.clock() - self.last >= self.interval:
                    self._print(running=True)

    def add_task(self, description: str, total: float | None = None, **_) -> int:
        from rich.text import Text

        with self._lock:
            self.tasks.append(PlainTask(len(self.tasks), Text.from_markup(description).plain.strip(), total))
            self._tick()
            return self.tasks[-1].id

    def advance(self, task_id: int, advance: float = 1) -> None:
        with self._lock:
            self.tasks[task_id].completed += advance
            self._tick()

    def update(
        self, task_id: int, total: float | None = None, completed: float | None = None, advance: float | None = None, **_
    ) -> None:
        with self._lock:
            task = self.tasks[task_id]
            task.total = task.total if total is None else total
            task.completed = task.completed if completed is None else completed
            task.completed += advance or 0
            self._tick()

    def _tick(self) -> None:
        if self.last is None or self.clock() - self.last >= self.interval:
            self._print()

    def _print(self, running: bool = False) -> None:
        """Each stage that moved since it was last printed; ``running``: each unfinished one too."""
        if not any(task.total is not None for task in self.tasks):
            return
        self.last = now = self.clock()
        seconds = int(now - self.started)
        elapsed = f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        for task in self.tasks:
            if task.total is None:
                continue
            unfinished = task.completed < task.total
            if (task.completed, task.total) == task.printed and not (running and unfinished):
                continue
            task.printed = (task.completed, task.total)
            self.console.print(
                f"progress {elapsed}  {task.description}: {task.completed:,.0f}/{task.total:,.0f}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )


class Stages:
    """The run's stages on its one progress display: ``stage(label, total)`` gives the function that advances it by
    n (with ``set_total(n)``, for a stage opened with total None whose caller learns it before its first step). A label asked for
    again (a pass that an earlier analysis made, read back) is the same stage and is not counted twice."""

    def __init__(self, progress):
        self.progress = progress
        self.ids: dict[str, int] = {}
        self.opened: list[str] = []

    def stage(self, label: str, total: int | None):
        if label in self.ids:

            def again(n: int) -> None:
                return None

            again.set_total = lambda steps: None
            return again
        from rich.markup import escape

        task = self.progress.add_task(escape(label), total=total)
        self.ids[label] = task
        self.opened.append(label)

        def advance(n: int) -> None:
            self.progress.advance(task, n)

        def set_total(steps: int) -> None:
            # only a stage opened without its total learns it: a known total never changes mid-stage (an analysis
            # running several groups of units on one stage would otherwise reset it to each group's size)
            if next(t for t in self.progress.tasks if t.id == task).total is None:
                self.progress.update(task, total=steps)

        advance.set_total = set_total
        return advance

    __call__ = stage

    def close_opened(self) -> None:
        """Every stage opened since the last call ends at its total: an analysis is done with them (a pass it read back
        advanced nothing; a corpus that gave fewer chunks than asked ended short)."""
        tasks = {task.id: task for task in self.progress.tasks}
        for label in self.opened:
            task = tasks[self.ids[label]]
            if task.total is not None and task.completed < task.total:
                self.progress.update(task.id, completed=task.total)
        self.opened = []


def pairs_words(specs: list) -> str:
    """The (model, revision) pairs of a stage as a reader says them: ``pythia-14m@step0``, ``2 models``, ``3
    revisions of pythia-14m``, ``4 (model, revision) pairs of 2 models``."""
    models = list(dict.fromkeys(spec.name for spec in specs))
    if len(specs) == 1:
        return f"{specs[0].name}@{specs[0].revision}"
    if len(models) == len(specs):
        return f"{len(models)} models"
    if len(models) == 1:
        return f"{len(specs)} revisions of {models[0]}"
    return f"{len(specs)} (model, revision) pairs of {len(models)} models"


class JobUnits:
    """``run_sweep``'s ``units_for`` for every analysis a job plans; remembers which unit belongs to which."""

    def __init__(self, store, job):
        self.store = store
        self.planned = job.planned()
        self.keys: dict[str, set[str]] = {}

    def __call__(self, item, info: dict) -> list:
        spec = item.request.spec
        units = registry.units_for(self.store, spec.slug, spec.revision, info["layers"], info, self.planned)
        for unit in units:
            self.keys.setdefault(unit.analysis, set()).add(unit.key)
        return units

    def rows_of(self, analysis: str, rows: list[dict]) -> list[dict]:
        keys = self.keys.get(analysis, set())
        return [row for row in rows if row.get("unit_key") in keys]


def needs_nll(job) -> bool:
    """Whether the pooled pass computes per-sample NLL: a reader of it asks (diagnostics' loss beside geometry)."""
    return any(item.spec.needs.nll for item in job.planned() if item.spec.reads(item.params, job).kind == "pooled")


def needs_pooled(job) -> bool:
    """Whether any planned analysis reads the job's [extract] extraction (else no forward pass is made for it)."""
    return any(item.spec.extraction == "pooled" for item in job.planned())


def run_own_extractions(store, job, stages: Stages) -> dict[str, list[dict]]:
    """Every planned analysis with an extraction of its own (token-level chunks, kNN-LM features, aligned texts):
    each extracts what it needs (what the store holds is reused, so analyses naming one extraction share it) and
    runs its units, on the run's ``stages``; returns this job's rows by analysis name."""
    from raygeom.jobs.plan import job_specs

    own = [item for item in job.planned() if item.spec.extraction != "pooled"]
    if not own:
        return {}
    specs = job_specs(job)
    rows: dict[str, list[dict]] = {}
    for item in own:
        rows.setdefault(item.analysis, []).extend(item.spec.run(store, job, specs, item.params, stages))
        stages.close_opened()
    return rows


def analyses_of(job) -> list[str]:
    return list(dict.fromkeys(item.analysis for item in job.planned()))


def write_outputs(
    store,
    job,
    units: JobUnits,
    rows: list[dict],
    console,
    skip: tuple[str, ...] = (),
    own: dict[str, list[dict]] | None = None,
    files: dict[str, list[Path]] | None = None,
    shown: dict[str, list[dict]] | None = None,
) -> dict[str, Path]:
    """For every planned analysis but ``skip`` (whose driver writes its own): ``results/<dir>.parquet`` with every
    row of it the store holds (all jobs, each row with its settings), then what its declaration shows and writes of
    this job's rows (raygeom.report.tables.analysis_outputs). ``own``: the rows of the analyses with an extraction of
    their own, by name. ``files``: filled with every file written, ``shown`` with this job's rows, by analysis name."""
    from raygeom.analyses.results_table import write_results_table
    from raygeom.report.tables import analysis_outputs

    written = {}
    for name in analyses_of(job):
        if name in skip:
            continue
        analysis = registry.get(name)
        mine = (own or {}).get(name, []) if analysis.extraction != "pooled" else units.rows_of(name, rows)
        if analysis.extraction != "pooled":  # a pooled analysis's rows are checked as its units finish
            analysis.check_rows(mine)
        written[name] = write_results_table(store, analysis, mine)
        extra = analysis_outputs(console, analysis, mine, store.root)
        if files is not None:
            files[name] = [written[name], *extra]
        if shown is not None:
            shown[name] = mine
    return written
