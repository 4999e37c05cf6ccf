"""The run's one progress display: bars on a terminal, plain lines in a log (:class:`PlainProgress`), and its
stages (:class:`Stages`), each with its total before it starts. Every step of a run that shows progress takes it from
here; nothing here knows a step or an analysis."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

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
