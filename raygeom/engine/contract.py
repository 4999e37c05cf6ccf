"""What an analysis hands the engine: units of pure steps. No Ray here, so analyses import only this."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

PREPARED = object()  # placeholder in a part's arguments for the values of the unit's prepare steps


@dataclass(frozen=True)
class Step:
    fn: Callable
    args: tuple = ()
    options: Mapping[str, Any] = field(default_factory=dict)  # Ray options, e.g. num_gpus


@dataclass(frozen=True)
class More:
    """``finish`` wants these parts too before it can decide (their values are appended)."""

    parts: tuple[Step, ...]


@dataclass
class Unit:
    analysis: str  # rows go to results/<analysis>/<key>.parquet
    key: str  # content key of (inputs, analysis, parameters): resume and provenance
    label: str  # what a person calls it, e.g. "smollm2@main block_05"
    parts: Sequence[Step]
    finish: Callable[[list], list[dict] | dict | More]
    prepare: Sequence[Step] = ()
    degenerate: Callable[[str], list[dict] | dict] | None = None  # rows to show (never stored) for an InputError
    store_rows: bool = True
    # (model, revision, extraction key) of each extraction it reads: the store records the unit there before it
    # runs, and raygeom gc keeps those activations until the unit is stored
    extractions: tuple[tuple[str, str, str], ...] = ()

    @property
    def cost(self) -> int:
        return len(self.prepare) + len(self.parts)


def timed(fn: Callable, *args) -> tuple[Any, float]:
    """(``fn(*args)``, the seconds it took on the one thread a unit task runs on): what every step of a unit costs,
    measured where it runs (the arguments' transfer and deserialisation are not counted)."""
    start = time.perf_counter()
    value = fn(*args)
    return value, time.perf_counter() - start


def finished_rows(produced: list[dict] | dict, key: str, seconds: float | None) -> list[dict]:
    """A finished unit's rows, each naming its unit (so a unit file read back under another unit's name is recognised
    as damaged) and the CPU-seconds of its steps (``cpu_seconds``: what ``raygeom plan`` scales its estimates from,
    with the analysis's declared ``work``)."""
    return [{**row, "unit_key": key, "cpu_seconds": seconds} for row in ([produced] if isinstance(produced, dict) else produced)]
