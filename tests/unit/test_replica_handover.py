"""replica_actor without a cluster: the Ray options of a CPU replica that reserves no CPU (a sweep that downloads), and
the Handover's count of replica processes, with actor creation stood in for."""

from __future__ import annotations

from raygeom.engine import replica_actor


def test_a_cpu_replica_reserves_its_cpus_unless_told_not_to():
    assert replica_actor.replica_options(0, 2) == ({"num_cpus": 2}, "cpu", None)
    assert replica_actor.replica_options(0, 2, reserve_cpus=False) == (
        {"num_cpus": 0, "scheduling_strategy": "SPREAD"},
        "cpu",
        None,
    )
    # a GPU replica never reserves a CPU, whatever it is told
    assert replica_actor.replica_options(1, 2, reserve_cpus=False) == ({"num_gpus": 1, "num_cpus": 0}, "cuda", None)


def test_handover_counts_new_processes_and_hands_a_parked_replica_on(monkeypatch):
    created, stopped = [], []

    def create(spec, gpus, cpus=1, reserve_cpus=True):
        created.append((spec, gpus, cpus, reserve_cpus))
        return f"actor-{len(created)}"

    monkeypatch.setattr(replica_actor, "create", create)
    monkeypatch.setattr(replica_actor, "stop", stopped.append)
    handover = replica_actor.Handover(reserve_cpus=False)
    first = handover.create("step0", 0, 1)
    handover.park(first)
    assert handover.create("step1", 0, 1) == first  # the parked process takes the next revision
    second = handover.create("step2", 0, 1)
    assert second != first and handover.started == 2
    assert created == [("step0", 0, 1, False), ("step2", 0, 1, False)]
    handover.park(first)
    handover.drop()
    assert stopped == [first]
