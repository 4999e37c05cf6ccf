"""The extraction stage's text count ends at its total whatever order the driver takes the actor's refs in."""

from types import SimpleNamespace

import pytest

from raygeom.engine import orchestrate


class _Parking:
    def __init__(self):
        self.parked, self.discarded = [], []

    def park(self, actor):
        self.parked.append(actor)

    def discard(self, actor):
        self.discarded.append(actor)


@pytest.mark.parametrize("order", [["b0", "b1", "b2", "w"], ["w"], ["b1", "w"], ["b2", "b0", "w"]])
def test_a_write_taken_before_its_batches_still_counts_every_text(monkeypatch, order):
    seen, landed = [], []
    parking = _Parking()
    extractions = orchestrate.Extractions(None, lambda kind, n: seen.append((kind, n)), 1, parking)
    extractions.finished = lambda request, failure: landed.append((request, failure))
    extractions.actors[0] = "actor"
    extractions.items[0] = (SimpleNamespace(request="request"), "all")
    extractions.waiting = {"b0": ("batch", 0, 16), "b1": ("batch", 0, 16), "b2": ("batch", 0, 8), "w": ("write", 0, 0)}
    monkeypatch.setattr(orchestrate.ray, "get", lambda ref: {"ref": ref})
    results = [extractions.handle(ref) for ref in order]
    assert sum(n for kind, n in seen if kind == "texts") == 40  # 16 + 16 + 8: every text once
    assert seen.count(("extract", 1)) == 1 and landed == [("request", None)]
    assert results[-1] == (extractions.items[0][0], {"ref": "w"}) and results[:-1] == [None] * (len(order) - 1)
    assert extractions.waiting == {} and parking.parked == ["actor"]
