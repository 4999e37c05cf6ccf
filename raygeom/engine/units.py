"""The one unit engine. Every analysis, of a run or a sweep, hands
its work here as :class:`Unit` objects; this module alone does keys -> resume, Ray fan-out with retries,
progress, atomic writes of finished rows and the mapping of worker errors to one line.

An analysis module stays free of Ray: a unit is a list of pure steps (module-level functions and their
arguments). ``prepare`` steps run first; each ``parts`` step then receives their results wherever its
arguments hold :data:`PREPARED`; ``finish`` turns the parts' values into rows on the driver, or asks for
more parts (``More``, used by ``--n-null auto``). Large numpy arguments are put in the object store once.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Iterable, Sequence

import numpy as np
import ray

from raygeom.engine.contract import PREPARED, More, Step, Unit, finished_rows, timed
from raygeom.engine.threads import one_thread
from raygeom.errors import InputError, RaygeomError
from raygeom.params import canonical_rows
from raygeom.store.tree import Store

PUT_BYTES = 1 << 20  # numpy arguments at least this big travel through the object store, once
UNITS_IN_FLIGHT = 4  # units whose tasks are submitted at once: bounds object-store memory, keeps CPUs busy


def _call(fn: Callable, *args) -> tuple:
    """(value, seconds) as two returns: a part waits on the value alone, the seconds are summed when its unit ends."""
    one_thread()
    return timed(fn, *args)


_remote_call = ray.remote(max_retries=3, num_returns=2)(_call)


def one_line(error: BaseException, where: str) -> RaygeomError:
    """A worker's exception as the one line the CLI prints."""
    cause = error.cause if isinstance(error, ray.exceptions.RayTaskError) and error.cause is not None else error
    if isinstance(cause, RaygeomError):
        return RaygeomError(f"{where}: {cause}")
    if isinstance(cause, (ValueError, ArithmeticError, np.linalg.LinAlgError)):
        return RaygeomError(f"{where}: {type(cause).__name__}: {cause}")
    if isinstance(error, ray.exceptions.RayError) and not isinstance(error, ray.exceptions.RayTaskError):
        return RaygeomError(f"{where}: the Ray worker was lost ({type(error).__name__}) after its retries")
    text = str(cause).strip().splitlines()
    return RaygeomError(
        f"{where}: unexpected {type(cause).__name__}: {text[-1] if text else ''} (rerun with RAYGEOM_DEBUG=1 for the traceback)"
    )


def warn_damaged(message: str) -> None:
    """One line on stderr for a stored file that is damaged and will be recomputed: never silent, never fatal."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


class UnitRunner:
    """Runs units to completion on Ray; units can be added while others run (streaming)."""

    def __init__(
        self,
        store: Store,
        progress: Callable[[int], None] | None = None,
        warn: Callable[[str], None] | None = None,
        units_in_flight: int = UNITS_IN_FLIGHT,
        grow: Callable[[int], None] | None = None,
    ):
        """``progress(n)``: n more steps done, of the units' ``cost`` in all; ``grow(n)``: a unit asked for n steps
        more than its cost (``More``: --n-null auto), so a progress bar's total can follow."""
        self.store = store
        self.progress = progress or (lambda n: None)
        self.grow = grow or (lambda n: None)
        self.warn = warn or (lambda message: None)
        self.units_in_flight = units_in_flight
        self.rows: dict[str, list[dict]] = {}
        self.computed: set[str] = set()
        self._queue: list[Unit] = []
        self._active: dict[str, dict] = {}
        self._refs: dict[ray.ObjectRef, tuple[str, int]] = {}
        self._puts: dict[int, tuple[np.ndarray, ray.ObjectRef]] = {}

    @property
    def busy(self) -> bool:
        return bool(self._queue or self._active)

    def add(self, units: Iterable[Unit]) -> None:
        units = list(units)
        self.store.record_planned(units)
        for unit in units:
            if unit.key in self.rows or unit.key in self._active or any(q.key == unit.key for q in self._queue):
                continue
            if unit.store_rows and self.store.has_result(unit.analysis, unit.key):
                self.rows[unit.key] = self.store.read_results(unit.analysis, [unit.key]).to_pylist()
                self.progress(unit.cost)
            else:
                problem = self.store.result_problem(unit.analysis, unit.key) if unit.store_rows else None
                if problem:
                    warn_damaged(f"{unit.label}: {problem}; recomputing it")
                self._queue.append(unit)

    def _arg(self, value):
        if isinstance(value, np.ndarray) and value.nbytes >= PUT_BYTES:
            cached = self._puts.get(id(value))
            if cached is None or cached[0] is not value:
                cached = (value, ray.put(value))
                self._puts[id(value)] = cached
            return cached[1]
        return value

    def _submit(self, key: str, step: Step, index: int, prepared: list) -> None:
        args = []
        for value in step.args:
            if value is PREPARED:
                args.extend(prepared)
            else:
                args.append(self._arg(value))
        ref, seconds = _remote_call.options(**step.options).remote(step.fn, *args)
        self._refs[ref] = (key, index)
        self._active[key]["seconds"].append(seconds)

    def _start(self, unit: Unit) -> None:
        prepared, seconds = [], []
        for step in unit.prepare:
            args = [self._arg(v) for v in step.args]
            value, taken = _remote_call.options(**step.options).remote(step.fn, *args)
            prepared.append(value)
            seconds.append(taken)
        state = {"unit": unit, "prepared": prepared, "values": {}, "parts": list(unit.parts), "seconds": seconds}
        self._active[unit.key] = state
        # Preparation is waited on through the parts that consume it; count it as done once they run.
        for index, step in enumerate(state["parts"]):
            self._submit(unit.key, step, index, prepared)

    def _fill(self) -> None:
        while self._queue and len(self._active) < self.units_in_flight:
            self._start(self._queue.pop(0))

    def _drop(self, key: str) -> None:
        """Forget a unit's tasks; those still running finish on their own and their results are never read. Not
        ``ray.cancel``: a cancel racing with the task's completion aborts the driver inside Ray's core worker
        ("Check failed: it != submissible_tasks_.end() Tried to complete task that was not pending", Ray 2.60; seen
        here once in bench/bench_sweep.py, right after "Cancelling a task" in the driver's log), and a degenerate
        layer's other tasks fail at once on its failed preparation anyway."""
        for ref in [r for r, (k, _) in self._refs.items() if k == key]:
            self._refs.pop(ref)
        self._active.pop(key, None)

    def _fail(self, key: str, error: BaseException) -> None:
        state = self._active[key]
        unit: Unit = state["unit"]
        cause = error.cause if isinstance(error, ray.exceptions.RayTaskError) else error
        if isinstance(cause, InputError) and unit.degenerate is not None:
            # Nothing to compute (e.g. every sample shares one vector): shown with its reason, never stored as done.
            self._drop(key)
            rows = unit.degenerate(str(cause))
            self.rows[key] = [rows] if isinstance(rows, dict) else rows
            self.warn(f"{unit.label}: not computed: {cause}")
            self.progress(len(unit.prepare) + len(state["parts"]) - len(state["values"]))  # what is left of its steps
            return
        for other in list(self._active):
            self._drop(other)
        self._queue.clear()
        if os.environ.get("RAYGEOM_DEBUG"):
            raise error
        raise one_line(error, unit.label) from None

    def _complete(self, key: str) -> None:
        state = self._active[key]
        unit: Unit = state["unit"]
        values = [state["values"][i] for i in range(len(state["parts"]))]
        try:
            produced = unit.finish(values)
        except InputError as error:
            self._fail(key, error)
            return
        if isinstance(produced, More):
            start = len(state["parts"])
            state["parts"].extend(produced.parts)
            self.grow(len(produced.parts))
            for offset, step in enumerate(produced.parts):
                self._submit(key, step, start + offset, state["prepared"])
            return
        try:
            seconds = float(sum(ray.get(state["seconds"])))
        except ray.exceptions.RayError:  # a prepare step no part read failed: its time is unknown, the rows are not
            seconds = None
        rows = finished_rows(produced, key, seconds)
        if unit.store_rows:
            self.store.write_result(unit.analysis, key, rows)
        self.rows[key] = rows
        self.computed.add(key)
        self._active.pop(key)
        self.progress(len(unit.prepare))

    def step(self, others: Sequence[ray.ObjectRef] = ()) -> list[ray.ObjectRef]:
        """Wait for one task (a unit's or one of ``others``); returns the ``others`` that finished."""
        self._fill()
        waiting = list(self._refs) + list(others)
        if not waiting:
            return []
        done, _ = ray.wait(waiting, num_returns=1)
        finished_others = []
        for ref in done:
            if ref not in self._refs:
                finished_others.append(ref)
                continue
            key, index = self._refs.pop(ref)
            try:
                value = ray.get(ref)
            except (ray.exceptions.RayError, RaygeomError) as error:
                self._fail(key, error)
                continue
            state = self._active[key]
            state["values"][index] = value
            self.progress(1)
            if len(state["values"]) == len(state["parts"]):
                self._complete(key)
        self._fill()
        return finished_others

    def run(self) -> None:
        while self.busy:
            self.step()


def run_units(
    store: Store,
    units: Sequence[Unit],
    progress: Callable[[int], None] | None = None,
    warn: Callable[[str], None] | None = None,
    units_in_flight: int = UNITS_IN_FLIGHT,
) -> list[dict]:
    """Every unit's rows, in the order of ``units``; finished units are read back, not recomputed. ``progress`` is
    advanced by steps; where it carries ``set_total`` (a bar made before the units were known), that is told how many."""
    if progress is not None and hasattr(progress, "set_total"):
        progress.set_total(sum(unit.cost for unit in units))
    runner = UnitRunner(store, progress, warn, units_in_flight)
    runner.add(units)
    runner.run()
    return [row for unit in units for row in runner.rows[unit.key]]


def accumulated_rows(store: Store, analysis: str, job_rows: Sequence[dict]) -> list[dict]:
    """Every stored unit row of ``analysis`` (all jobs on this store), then this job's rows that were not
    stored (degenerate units); each row carries the settings that made it, so they can be told apart."""
    stored = store.read_results(analysis).to_pylist()
    keys = {row.get("unit_key") for row in stored}
    return canonical_rows(stored + [row for row in job_rows if row.get("unit_key") not in keys])
