"""The one Ray actor that holds models: ``raygeom.replica.Replica`` made remote.

Every command that runs a model (the laptop job, sweeps, diagnostics, dispersion,
select, kNN-LM) starts its replicas here. A replica lost with its node restarts
elsewhere and its pending calls are retried (Ray needs both max_restarts and
max_task_retries=-1 for that, or calls fail with ActorUnavailableError).

On CPU, torch runs on exactly the CPUs Ray gives the actor.
"""

from __future__ import annotations

import ray

from raygeom.errors import RaygeomError
from raygeom.replica.replica import Replica
from raygeom.sources.models import ModelSpec

ReplicaActor = ray.remote(max_restarts=3, max_task_retries=-1)(Replica)


def largest_node_cpus() -> int:
    """CPUs of the largest alive node: the most one replica can hold."""
    cpus = [float(node["Resources"].get("CPU", 0)) for node in ray.nodes() if node.get("Alive")]
    return max(1, int(max(cpus, default=1)))


def replica_options(gpus: float, cpus: int = 1, reserve_cpus: bool = True) -> tuple[dict, str, str | None]:
    """Ray options, device and device_map of one replica: ``gpus`` 0 = CPU with ``cpus`` threads,
    0.5 = two replicas share a GPU, > 1 = sharded over a device_map group. ``reserve_cpus=False``: a CPU replica asks
    Ray for no CPU (its caller bounds how many run; it still runs ``cpus`` torch threads) and is spread over
    the nodes, as 0-CPU actors would otherwise all land on one."""
    if gpus <= 0:
        if not reserve_cpus:
            return {"num_cpus": 0, "scheduling_strategy": "SPREAD"}, "cpu", None
        return {"num_cpus": max(1, int(cpus))}, "cpu", None
    # A GPU replica asks for no CPU, so queued analysis tasks can never hold it back.
    return {"num_gpus": gpus, "num_cpus": 0}, "cuda", ("auto" if gpus > 1 else None)


def create(spec: ModelSpec, gpus: float, cpus: int = 1, reserve_cpus: bool = True):
    """A replica actor (the model loads in the background); call ``describe`` to wait for it."""
    options, device, device_map = replica_options(gpus, cpus, reserve_cpus)
    threads = max(1, int(cpus)) if device == "cpu" else None
    return ReplicaActor.options(**options).remote(spec, device, device_map, threads)


def default_gpus() -> float:
    return 1.0 if float(ray.cluster_resources().get("GPU", 0.0)) >= 1 else 0.0


def start(spec: ModelSpec, gpus: float | None = None, cpus: int | None = None):
    """One replica for a single model at a time: a GPU if the cluster has one, else every CPU of a node.
    Returns (actor, description); raises the replica's RaygeomError (e.g. the model cannot load)."""
    gpus = default_gpus() if gpus is None else gpus
    actor = create(spec, gpus, largest_node_cpus() if cpus is None else cpus)
    try:
        return actor, get(actor.describe.remote())
    except BaseException:
        ray.kill(actor)
        raise


def stop(actor) -> None:
    ray.kill(actor)


class Handover:
    """Replicas handed from one (model, revision) to the next by a driver that works through many, instead of one
    new actor each: a new actor is a new worker process that imports torch and transformers again (about 7 s of a
    CPU here, before any weights load), which every checkpoint of a sweep would pay.

    ``create`` hands back a replica ``park`` kept for the same placement (GPU share and CPUs), else a new one;
    every call to it must pass ``spec=`` (``raygeom.replica.replica.serving``), which loads that model in place.
    A parked replica still holds its CPUs or GPU, so a driver parks only what it hands on at once and ``drop``s the
    rest before anything else needs those resources (and ``create`` drops the parked replicas of other placements).
    As a context manager it drops everything at exit. ``reserve_cpus=False``: its CPU replicas ask Ray for no CPU
    (``replica_options``), so a parked one holds none back and may wait for its next revision.
    ``started``: the replica processes it created."""

    def __init__(self, reserve_cpus: bool = True):
        self.parked: dict[tuple[float, int], list] = {}
        self.placement: dict = {}
        self.reserve_cpus = reserve_cpus
        self.started = 0

    def create(self, spec: ModelSpec, gpus: float, cpus: int = 1):
        key = (float(gpus), int(cpus))
        for other in [k for k in self.parked if k != key]:
            for actor in self.parked.pop(other):
                stop(actor)
        if self.parked.get(key):
            actor = self.parked[key].pop()
        else:
            actor = create(spec, gpus, cpus, self.reserve_cpus)
            self.started += 1
        self.placement[actor] = key
        return actor

    def start(self, spec: ModelSpec, gpus: float | None = None, cpus: int | None = None):
        """``start`` through the handover: (actor, description of ``spec``)."""
        gpus = default_gpus() if gpus is None else gpus
        actor = self.create(spec, gpus, largest_node_cpus() if cpus is None else cpus)
        try:
            return actor, get(actor.describe.remote(spec=spec))
        except BaseException:
            self.discard(actor)
            raise

    def park(self, actor) -> None:
        """Keep ``actor`` for the next ``create`` of its placement (an actor this handover did not create is stopped)."""
        key = self.placement.pop(actor, None)
        if key is None:
            stop(actor)
        else:
            self.parked.setdefault(key, []).append(actor)

    def discard(self, actor) -> None:
        """Stop ``actor`` (failed, or not needed again)."""
        self.placement.pop(actor, None)
        stop(actor)

    def drop(self) -> None:
        for actors in self.parked.values():
            for actor in actors:
                stop(actor)
        self.parked.clear()

    def __enter__(self) -> "Handover":
        return self

    def __exit__(self, *exc) -> None:
        self.drop()
        for actor in list(self.placement):
            self.discard(actor)


def get(ref):
    """``ray.get`` that turns a replica's RaygeomError back into one (a one-line CLI error)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, RaygeomError):
            raise RaygeomError(str(error.cause)) from None
        raise
