"""The unit engine's progress counts each step once: a bar ends at its total, never past it (the laptop job on
SmolLM2 showed `PGA ... 225/224`: a degenerate layer's steps that had finished were counted again)."""

import time

import pytest

from raygeom.engine.contract import PREPARED, More, Step, Unit
from raygeom.engine.units import UnitRunner
from raygeom.errors import InputError
from raygeom.store.tree import Store

pytestmark = pytest.mark.integration


def steps():
    """Step functions defined here, so Ray pickles them by value (its workers cannot import this test file)."""

    def value(x):
        return x

    def refuse_later(_prepared):
        time.sleep(0.5)  # after its sibling part has been counted
        raise InputError("too few distinct rows to be scored")

    def finish_after_one_more(values):
        return {"sum": sum(values)} if len(values) == 3 else More(parts=(Step(value, (4,)),))

    return value, refuse_later, finish_after_one_more


def test_a_degenerate_unit_and_a_unit_that_asks_for_more_are_counted_once_per_step(ray_local, tmp_path):
    value, refuse_later, finish_after_one_more = steps()
    degenerate = Unit(
        "probe_progress",
        "deg",
        "a degenerate layer",
        parts=[Step(value, (1,)), Step(refuse_later, (PREPARED,))],
        finish=lambda values: {"never": True},
        prepare=[Step(value, (0,))],
        degenerate=lambda reason: {"note": reason},
        store_rows=False,
    )
    growing = Unit(
        "probe_progress",
        "grow",
        "an auto-null layer",
        parts=[Step(value, (1,)), Step(value, (2,))],
        finish=finish_after_one_more,
        prepare=[Step(value, (0,))],
        store_rows=False,
    )
    done, grown, warned = [], [], []
    runner = UnitRunner(Store(tmp_path / "store"), progress=done.append, grow=grown.append, warn=warned.append)
    runner.add([degenerate, growing])
    runner.run()
    assert runner.rows["deg"] == [{"note": "too few distinct rows to be scored"}] and len(warned) == 1
    assert runner.rows["grow"][0]["sum"] == 7
    assert grown == [1]
    assert sum(done) == degenerate.cost + growing.cost + sum(grown)  # 3 + 3 + 1: the bar ends exactly at its total
