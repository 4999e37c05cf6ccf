"""Ray orchestration: extraction through replica actors (engine.replica_actor), analysis through the unit engine.

No analysis is imported here: a job driver (raygeom.jobs.run) says which units each landed extraction gets.

Call :func:`raygeom.engine.ray_env.prepare_local_ray_environment` before importing
this module when the cluster is local (the CLI does).
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable

import ray

from raygeom.engine import replica_actor
from raygeom.engine.contract import Unit
from raygeom.engine.ray_env import DRIVER_ONLY_ENV
from raygeom.engine.units import UnitRunner, warn_damaged
from raygeom.engine.weights import Weights, WeightsSettings
from raygeom.errors import RaygeomError
from raygeom.replica.replica import tensor_digests  # noqa: F401 - re-exported
from raygeom.replica.request import ExtractionRequest
from raygeom.replica.settings import batches_at_once
from raygeom.sources import download
from raygeom.sources.layers import select_layers
from raygeom.store import failures
from raygeom.store.tree import Store

# A worker beyond one per CPU that idles for a second is killed by default, and the next stage of the same job (the sweep
# after training, dispersion after the sweep, the tasks after a replica ends) starts a new one, which imports torch and
# the numerics again (about 7 CPU-s here). Kept for a minute, it serves the next stage: the tiny width ladder started 7
# workers instead of 11, 64 s instead of 76 s end to end on 2 CPUs. Only for a Ray this process starts.
LOCAL_SYSTEM_CONFIG = {"idle_worker_killing_time_threshold_ms": 60_000}

CONNECT_TIMEOUT_ENV = "RAYGEOM_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT_S = 30.0
# A local Ray's start: Ray 2.60 waits a fixed 30 s (ray/_private/node.py, not a setting) for its raylet to register
# with the GCS: on a 2-core machine at a load average of 15-35 it ran out. raygeom waits this long instead (each try),
# and tries twice, the processes of a failed try removed. (Each of the driver's lookups of its node blocks inside C++
# for raylet_start_wait_time_s, made 2 s by raygeom.engine.ray_env.DRIVER_ONLY_ENV, so that a raylet that died is
# noticed between lookups.)
START_TIMEOUT_ENV = "RAYGEOM_START_TIMEOUT"
DEFAULT_START_TIMEOUT_S = 120.0
START_TRIES = 2


def _seconds(given: float | None, env: str, default: float, what: str) -> float:
    """``given``, else the number of seconds in $``env``, else ``default``; refused in one line unless positive."""
    raw = os.environ.get(env, "") if given is None else given
    try:
        seconds = float(raw) if raw != "" else default
    except ValueError:
        raise RaygeomError(f"{env} must be a number of seconds, got {raw!r}") from None
    if not (0 < seconds < float("inf")):
        raise RaygeomError(f"{what} must be a positive number of seconds, got {raw!r}")
    return seconds


def connect_timeout(seconds: float | None = None) -> float:
    """How long connecting to a Ray at an address may take: ``seconds``, else $RAYGEOM_CONNECT_TIMEOUT, else 30 s."""
    return _seconds(seconds, CONNECT_TIMEOUT_ENV, DEFAULT_CONNECT_TIMEOUT_S, "the Ray connect timeout")


def start_timeout(seconds: float | None = None) -> float:
    """How long one try to start a local Ray may take: ``seconds``, else $RAYGEOM_START_TIMEOUT, else 120 s."""
    return _seconds(seconds, START_TIMEOUT_ENV, DEFAULT_START_TIMEOUT_S, START_TIMEOUT_ENV)


def start_ray(address: str | None = None, num_cpus: int | None = None, timeout_s: float | None = None) -> None:
    """Start a local Ray, or connect to ``address`` within ``timeout_s`` (default 30 s, or
    $RAYGEOM_CONNECT_TIMEOUT) and otherwise fail with one line; never hang."""
    if num_cpus is not None and num_cpus <= 0:
        raise RaygeomError(f"--num-cpus must be at least 1, got {num_cpus}")
    if address is not None and num_cpus is not None:  # Ray ignores num_cpus when it attaches to a cluster
        raise RaygeomError("num_cpus sets the CPUs of a local Ray; with an address the cluster's nodes have their own")
    if ray.is_initialized():
        return
    _import_pandas_now()
    # Refs of a layer dropped as degenerate are never fetched; Ray would print each one's traceback.
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    handler = signal.getsignal(signal.SIGTERM)
    if not (callable(handler) and threading.current_thread() is threading.main_thread()):
        _start(address, num_cpus, timeout_s)  # nobody here handles SIGTERM: Ray's handlers stay
        return
    # The caller (the CLI) handles SIGTERM. ray.init would replace that twice: in Python (``sys.exit(15)``, and the
    # local node's handler, ``sys.exit(1)``) and, below Python, by the core worker's abseil failure handler, which
    # dumps native stacks and aborts (exit -6). So Ray's Python registrations are skipped, and afterwards the
    # handler is installed again: that re-registers Python's C handler with sigaction, over abseil's.
    from unittest import mock

    # abseil's handler goes in while ray.init runs, before the handler can be installed again: a SIGTERM in between
    # dumped native stacks. The driver's core worker installs none when ray_constants says so; that constant was read
    # from the environment when ray was imported, so it is set here (the variable is for the processes Ray starts).
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    try:
        with (
            mock.patch.object(ray._private.utils, "set_sigterm_handler", lambda _: None),
            mock.patch.object(ray._private.ray_constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", True),
        ):
            _start(address, num_cpus, timeout_s)
    finally:
        signal.signal(signal.SIGTERM, handler)


def _import_pandas_now() -> None:
    """pyarrow imports pandas the first time it converts (``to_numpy``, ``Table.from_pylist``), inside Cython code that
    swallows exceptions: a SIGTERM or Ctrl-C that landed during that import (seconds, on a loaded machine; the first
    conversion of a run is often its first analysis) raised KeyboardInterrupt into it, and the run went on as if
    nothing had happened. Imported here, before the work, where an interrupt ends the command."""
    try:
        import pandas  # noqa: F401
    except ImportError:
        pass


def _lean_local_node(init: Callable) -> Callable:
    """``RayParams.__init__`` for raygeom's local node, with defaults ray.init takes no argument for:

    - the agents' ports (:data:`AGENT_PORTS`) chosen here, free on loopback, not Ray's fixed default (52365, held by
      any other Ray on the machine: the agent then retried for 3.5 s) nor left to the agents: see
      :func:`_ports_known_to_raylet`;
    - no log monitor. It only forwards workers' output to the driver, and raygeom's driver does not take it
      (``log_to_driver=False``); it rescans the node's log folder all the time (38 CPU-s in a 20-minute test session
      here);
    - no autoscaler monitor: a local node has nothing to scale.

    With ``include_dashboard=False`` Ray still starts a dashboard process for its usage-stats module alone (usage
    stats are off, ``raygeom.engine.ray_env``), and ``ray.init`` waits for it: :func:`_no_dashboard_process`."""

    def lean(self, *args, **kwargs):
        for name in AGENT_PORTS:
            kwargs[name] = kwargs.get(name) or _free_loopback_port()  # ray.init passes some as None
        kwargs.setdefault("include_log_monitor", False)
        kwargs.setdefault("no_monitor", True)
        init(self, *args, **kwargs)

    return lean


# The ports the raylet learns from its agents, each a ``<name>_<node id>`` file in the session folder that the agent
# writes once it listens. The raylet waits a fixed 15 s for each (Ray 2.60's WaitForPersistedPort, not a setting) and
# then exits: at a load average of 18 on 2 CPUs the dashboard agent (a Python process importing aiohttp and grpc) took
# longer, and every start failed ("Timed out waiting for file .../dashboard_agent_listen_port_..."). raygeom picks
# the ports and writes the files before the raylet starts; the agents listen on them when they are up.
AGENT_PORTS = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port", "runtime_env_agent_port")


def _free_loopback_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ports_known_to_raylet(start_raylet: Callable) -> Callable:
    """``Node.start_raylet`` that first writes each agent's port file (:data:`AGENT_PORTS`)."""
    from ray._raylet import persist_port

    def start(self, *args, **kwargs):
        for name in AGENT_PORTS:
            port = getattr(self._ray_params, name, None)
            if port:
                persist_port(self._session_dir, self._node_id, name, port)
        return start_raylet(self, *args, **kwargs)

    return start


def _no_dashboard_process(start_api_server: Callable) -> Callable:
    """``Node.start_api_server`` that starts nothing when the dashboard is not included: the node then has no web
    URL, as when Ray's own start of it fails (``raise_on_failure=False``)."""

    def start(self, *, include_dashboard, raise_on_failure):
        if include_dashboard is False:
            self._webui_url = None
            return
        start_api_server(self, include_dashboard=include_dashboard, raise_on_failure=raise_on_failure)

    return start


def _own_session(popen: type) -> type:
    """Ray's ``ConsolePopen`` starting each process of the local node (GCS, raylet, and so its agents and workers) in
    a session of its own. A signal sent to the run's process group (``timeout``, a shell's ``kill -TERM -PGID``, a
    job scheduler) then reaches the driver alone, which stops Ray itself: reaching them too, it killed the node
    under the driver (no exit within 10 s) and made abseil dump stacks ("*** SIGTERM received") on stderr."""

    class OwnSession(popen):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("start_new_session", True)
            kwargs["env"] = {k: v for k, v in (kwargs.get("env") or os.environ).items() if k not in DRIVER_ONLY_ENV}
            super().__init__(*args, **kwargs)

    return OwnSession


def _start(address: str | None, num_cpus: int | None, timeout_s: float | None) -> None:
    if address is None:
        _start_local(num_cpus)
        return
    _connect(address, connect_timeout(timeout_s))


class _StartTimedOut(Exception):
    """Not a RuntimeError: Ray's own wait loop (which catches those) lets it through at once."""


def _patient(get_node: Callable, deadline: float, nodes: list) -> Callable:
    """``ray._private.services.get_node`` that asks again until ``deadline``: the node start's wait for its raylet to
    register with the GCS, 30 s in Ray 2.60 and not a setting, becomes raygeom's. It gives up at once when the node's
    GCS or raylet has exited (killed, or its agent died and the raylet with it): Ray would wait out its time."""

    def patient(*args, **kwargs):
        while True:
            try:
                return get_node(*args, **kwargs)
            except RuntimeError:
                ended = _ended_process(nodes)
                if ended:
                    raise _StartTimedOut(f"its {ended} exited while it started") from None
                if time.monotonic() >= deadline:
                    raise _StartTimedOut("the raylet did not register with the GCS in time") from None
                time.sleep(0.5)

    return patient


def _ended_process(nodes: list) -> str | None:
    """The first of a starting node's GCS server and raylet that has exited, or None."""
    for node in nodes:
        for kind in (ray._private.ray_constants.PROCESS_TYPE_GCS_SERVER, ray._private.ray_constants.PROCESS_TYPE_RAYLET):
            for info in getattr(node, "all_processes", {}).get(kind, []):
                if info.process.poll() is not None:
                    return kind
    return None


def _keep_node(init: Callable, nodes: list) -> Callable:
    def keep(self, *args, **kwargs):
        nodes.append(self)  # before it starts anything: a failed start's processes are in its all_processes
        init(self, *args, **kwargs)

    return keep


def _remove_failed_start(nodes: list, before: set[int], looks: int = 3) -> None:
    """Every process of a failed try: the node's own (GCS, raylet, agents), then whatever else this process started
    since the try began (its workers), ending with SIGKILL for any that outlive a SIGTERM by 3 s."""
    import psutil

    # listed first: once the raylet is stopped, its agents and workers are no longer this process's descendants
    leftovers = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    try:
        ray.shutdown()
    except Exception:  # noqa: BLE001 - a start that failed halfway may leave state that shuts down badly
        pass
    for node in nodes:
        try:
            node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
        except Exception:  # noqa: BLE001 - what it could not stop is found below
            pass
    # The raylet starts its agents (and they their children) on its own time: one started after the list above, its
    # raylet stopped since, is no descendant of this process any more, only a process of the node's session.
    marks = [m for node in nodes for m in (getattr(node, "_session_dir", None), getattr(node, "_node_id", None)) if m]
    for look in range(looks):
        if look:
            time.sleep(1.0)
        leftovers += [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p not in leftovers]
        leftovers += [p for p in _processes_of(marks) if p not in leftovers]
        for process in leftovers:
            try:
                process.terminate()
            except psutil.NoSuchProcess:
                pass
        for process in psutil.wait_procs(leftovers, timeout=3)[1]:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(leftovers, timeout=3)


def _processes_of(marks: list[str]) -> list:
    """This user's processes whose command line names one of ``marks`` (a node's session folder or node id)."""
    import psutil

    if not marks:
        return []
    found = []
    for process in psutil.process_iter(["pid", "uids", "cmdline"]):
        try:
            line = " ".join(process.info["cmdline"] or ())
            if process.pid != os.getpid() and process.info["uids"].real == os.getuid() and any(m in line for m in marks):
                found.append(process)
        except (psutil.Error, AttributeError, TypeError):
            continue
    return found


def _start_local(num_cpus: int | None) -> None:
    from unittest import mock

    import psutil

    from raygeom.engine.watchdog import watch_driver

    wait = start_timeout()
    # before ray.init: a driver killed while its Ray starts (agents come up seconds after the raylet) leaves none
    watch_driver()  # this Ray's processes end with this driver, even after a SIGKILL
    params, node, services = ray._private.parameter.RayParams, ray._private.node.Node, ray._private.services
    failure = None
    for _ in range(START_TRIES):
        nodes: list = []
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        try:
            with (
                mock.patch.object(params, "__init__", _lean_local_node(params.__init__)),
                mock.patch.object(node, "__init__", _keep_node(node.__init__, nodes)),
                mock.patch.object(node, "start_api_server", _no_dashboard_process(node.start_api_server)),
                mock.patch.object(node, "start_raylet", _ports_known_to_raylet(node.start_raylet)),
                mock.patch.object(services, "ConsolePopen", _own_session(services.ConsolePopen)),
                mock.patch.object(services, "get_node", _patient(services.get_node, time.monotonic() + wait, nodes)),
                # the GCS port's wait, as long as raygeom's (read when the node starts the GCS)
                mock.patch.dict(os.environ, {"RAY_gcs_server_port_wait_time_s": str(int(math.ceil(wait)))}),
            ):
                ray.init(
                    address="local",
                    num_cpus=num_cpus,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=True,
                    logging_level="ERROR",
                    _system_config=LOCAL_SYSTEM_CONFIG,
                )
            return
        except BaseException as error:  # ray.init raises a bare Exception when the node times out
            # interrupted (Ctrl-C, SIGTERM): one look, the run ends now (and the CLI stops what is left of its Ray)
            _remove_failed_start(nodes, before, looks=3 if isinstance(error, Exception) else 1)
            if not isinstance(error, Exception):
                raise  # Ctrl-C, SIGTERM: the run ends, with nothing of this try left
            failure = error
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    raise RaygeomError(
        f"could not start a local Ray ({_first_line(failure)}), {START_TRIES} tries of up to {wait:g} s each, at a "
        f"load average of {load:.1f} on {os.cpu_count()} CPUs; set ${START_TIMEOUT_ENV} (seconds) to wait longer, "
        "or start it when the machine is less busy"
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS frame


def _check_reachable(address: str, timeout_s: float) -> None:
    """Before ray.init (whose retries run for minutes, logging to stderr): the port must accept a TCP
    connection and answer an HTTP/2 preface with a SETTINGS frame, as Ray's gRPC servers (GCS, client
    server) do. A closed port, a dead host or a server that never answers fails here, in seconds."""
    import socket

    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return  # 'auto' and the like: Ray resolves it and fails fast by itself
    wait = min(timeout_s, 10.0)
    deadline = time.monotonic() + wait
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=wait) as connection:
            connection.sendall(HTTP2_PREFACE)
            # Short waits, so Ctrl-C ends the run at once: a SIGINT delivered to another thread of this
            # process does not interrupt the main thread's blocking recv, only its next bytecode.
            connection.settimeout(0.2)
            while True:
                try:
                    answer = connection.recv(9)
                    break
                except socket.timeout:
                    if time.monotonic() >= deadline:
                        raise
    except socket.timeout:
        raise RaygeomError(
            f"could not connect to Ray at {address} within {wait:g} s: the port accepted a connection "
            "but nothing answered as a Ray (gRPC) server"
        ) from None
    except OSError as error:
        raise RaygeomError(f"cannot reach Ray at {address}: {error.strerror or _first_line(error)}") from None
    if len(answer) < 4 or answer[3] != 4:
        raise RaygeomError(f"no Ray cluster at {address}: the port answered, but not as a Ray (gRPC) server")


def _connect(address: str, timeout_s: float) -> None:
    _check_reachable(address, timeout_s)
    outcome: dict = {}

    def connect() -> None:
        try:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
            outcome["ok"] = True
        except BaseException as error:  # noqa: BLE001 - reported below as one line
            outcome["error"] = error

    # ray.init blocks signals while it retries; on a thread, the main thread keeps Ctrl-C and the deadline.
    thread = threading.Thread(target=connect, name="ray-connect", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(0.1)
    if thread.is_alive():
        raise RaygeomError(
            f"could not connect to Ray at {address} within {timeout_s:g} s (set ${CONNECT_TIMEOUT_ENV} to wait longer)"
        )
    if "error" in outcome:
        raise RaygeomError(f"could not connect to Ray at {address}: {_first_line(outcome['error'])}")


def cluster_gpus() -> float:
    return float(ray.cluster_resources().get("GPU", 0.0))


# ---------------------------------------------------------------------------------------------
# Extraction: one replica actor (engine.replica_actor) per (model, revision), as resources allow. A
# replica lost with its node restarts elsewhere; its pending calls are retried and its write recomputes
# any batch it no longer holds, so a node failure costs time, not results.


@dataclass(frozen=True)
class SweepItem:
    request: ExtractionRequest
    gpus: float = 0.0  # GPUs per replica: 0 = CPU, 0.5 = two revisions share a GPU, >1 = sharded (device_map)
    cpus: int | None = None  # CPU replica threads; None: a node's CPUs for a lone revision, else 1


def needs_extraction(store: Store, request: ExtractionRequest) -> str | None:
    """'extract', 'nll' (complete, but stored without the NLL this request wants) or None (complete)."""
    spec = request.spec
    if not store.is_complete(spec.slug, spec.revision, request.key()):
        problem = store.extraction_problem(spec.slug, spec.revision, request.key())
        if problem:
            warn_damaged(f"{spec.name}@{spec.revision}: {problem}; extracting it again")
        return "extract"
    if request.nll and not store.completion(spec.slug, spec.revision, request.key()).get("nll", True):
        return "nll"
    return None


class Extractions:
    """Replica actors extracting revisions. ``start`` one, wait on ``refs()`` (with anything else),
    pass each finished ref to ``handle``, which returns ``(item, info)`` when a revision has landed.

    ``progress(kind, n)``: ``texts`` per batch, ``extract`` per revision (landed or failed). A revision
    that fails with a RaygeomError (e.g. cannot be loaded) is recorded in ``failed`` and the rest go on."""

    def __init__(
        self,
        store: Store,
        progress: Callable[[str, int], None],
        cpus: int,
        replicas: replica_actor.Handover | None = None,
        finished: Callable[[ExtractionRequest, str | None], None] | None = None,
        reserve_cpus: bool = True,
    ):
        self.store, self.progress, self.cpus = store, progress, cpus
        self.finished = finished or (lambda request, failure: None)  # (request, None when it landed, else the reason)
        self.waiting: dict[ray.ObjectRef, tuple[str, int, int]] = {}  # ref -> (kind, number, texts)
        self.actors: dict[int, object] = {}
        # A replica whose revision landed is handed to the next queued one (``start``); ``drop_idle`` stops the rest.
        # A caller's ``replicas`` keeps it for the caller's next extraction instead.
        self.own_replicas = replicas is None
        self.replicas = replica_actor.Handover(reserve_cpus) if replicas is None else replicas
        self.items: dict[int, tuple[SweepItem, str]] = {}
        self.failed: list[str] = []

    @property
    def running(self) -> int:
        return len(self.actors)

    def refs(self) -> list[ray.ObjectRef]:
        return list(self.waiting)

    def start(self, item: SweepItem, need: str = "extract") -> None:
        number = len(self.items)
        self.items[number] = (item, need)
        spec = item.request.spec
        actor = self.replicas.create(spec, item.gpus, item.cpus or self.cpus)
        self.actors[number] = actor
        self.waiting[actor.describe.remote(spec=spec)] = ("describe", number, 0)

    def drop_idle(self) -> None:
        """Stop the replicas no queued revision took: they hold CPUs or GPUs that analysis tasks may need."""
        self.replicas.drop()

    def _stop(self, number: int, hand_on: bool = False) -> None:
        actor = self.actors.pop(number)
        if hand_on:
            self.replicas.park(actor)
        else:
            self.replicas.discard(actor)
        for ref in [r for r, (_, n, _) in self.waiting.items() if n == number]:
            self.waiting.pop(ref)

    def _fail(self, number: int, message: str) -> None:
        self.failed.append(message)
        self.progress("extract", 1)
        self._stop(number)
        self.finished(self.items[number][0].request, message)

    def _submit(self, number: int, described: dict) -> None:
        item, need = self.items[number]
        request, actor = item.request, self.actors[number]
        spec, texts, settings = request.spec, request.corpus.texts, request.settings
        if need == "nll":
            self.waiting[actor.add_nll.remote(str(self.store.root), request.key(), texts, settings, spec=spec)] = (
                "write",
                number,
                len(texts),
            )
            return
        layers = select_layers(described["layers"], request.layer_selection)
        self.store.invalidate(spec.slug, spec.revision, request.key())
        size = settings.batch_size
        parts = [texts[begin : begin + size] for begin in range(0, len(texts), size)]
        group = batches_at_once(described)
        for first in range(0, len(parts), group):
            some = parts[first : first + group]
            self.waiting[actor.run_batches.remote(first, some, settings, layers, request.nll, spec=spec)] = (
                "batch",
                number,
                sum(len(part) for part in some),
            )
        extra = {
            "model": spec.name,
            "revision": spec.revision,
            "corpus": request.corpus.name,
            "corpus_fingerprint": request.corpus.fingerprint(),
            "step": spec.step,
        }
        ref = actor.write_extraction.remote(
            str(self.store.root),
            request.key(),
            texts,
            request.corpus.labels,
            request.corpus.name,
            settings,
            layers,
            request.readout_components,
            request.nll,
            extra,
            spec=spec,
        )
        self.waiting[ref] = ("write", number, 0)

    def handle(self, ref: ray.ObjectRef) -> tuple[SweepItem, dict] | None:
        if ref not in self.waiting:
            return None
        kind, number, count = self.waiting.pop(ref)
        try:
            value = ray.get(ref)
        except ray.exceptions.RayTaskError as error:
            if kind == "batch":
                return None  # the write computes this batch again and reports its error
            if isinstance(error.cause, RaygeomError):
                self._fail(number, str(error.cause))
                return None
            raise
        if kind == "describe":
            try:
                self._submit(number, value)
            except RaygeomError as error:  # a layer selection this model does not have
                spec = self.items[number][0].request.spec
                self._fail(number, f"{spec.name}@{spec.revision}: {error}")
            return None
        if kind == "batch":
            self.progress("texts", count)
            return None
        # The actor wrote after every batch, but the driver may take the write's ref before some batch refs that
        # _stop drops below: their texts are done and counted here, or the stage would end short of its total.
        count += sum(c for k, n, c in self.waiting.values() if n == number and k == "batch")
        if count:
            self.progress("texts", count)
        self.progress("extract", 1)
        self._stop(number, hand_on=True)
        self.finished(self.items[number][0].request, None)
        return self.items[number][0], value

    def close(self) -> None:
        for number in list(self.actors):
            self.replicas.discard(self.actors.pop(number))
        if self.own_replicas:
            self.replicas.drop()


def extract(
    store: Store,
    request: ExtractionRequest,
    progress: Callable[[int], None] | None = None,
    gpus_per_model: float | None = None,
    cpus: int | None = None,
    replicas: replica_actor.Handover | None = None,
) -> dict:
    """Extract one (model, revision) into the store with one replica actor (a GPU, else every CPU of a
    node); skip it when already complete. ``request.nll`` adds per-sample NLL to an extraction stored without.
    ``replicas``: the replica is taken from this handover and parked in it afterwards, for the caller's next call."""
    need = needs_extraction(store, request)
    if need is None:
        if progress:
            progress(len(request.corpus.texts))
        return store.completion(request.spec.slug, request.spec.revision, request.key())
    gpus = replica_actor.default_gpus() if gpus_per_model is None else gpus_per_model
    extractions = Extractions(
        store,
        lambda kind, n: progress(n) if progress and kind == "texts" else None,
        cpus or replica_actor.largest_node_cpus(),
        replicas,
    )
    try:
        extractions.start(SweepItem(request, gpus), need)
        while extractions.refs():
            done, _ = ray.wait(extractions.refs(), num_returns=1)
            landed = extractions.handle(done[0])
            if landed:
                return landed[1]
        raise RaygeomError(extractions.failed[0])
    finally:
        extractions.close()


def default_weights() -> WeightsSettings:
    """Four fifths of the free disk under the HF cache; nothing kept."""
    return WeightsSettings(download.default_budget_bytes())


def run_sweep(
    store: Store,
    items: list[SweepItem],
    units_for: Callable[[SweepItem, dict], list[Unit]],
    progress: Callable[[str, int], None] | None = None,
    max_in_flight: int | None = None,
    analysis_threads: int = 4,
    keep_activations: bool = True,
    weights: WeightsSettings | None = None,
    stages: dict[str, list[tuple[float, float]]] | None = None,
) -> list[dict]:
    """Extract every item not already complete and run the units ``units_for(item, info)`` gives each
    landed extraction (``info``: its completion marker), e.g. one per layer and analysis.

    Replica actors run as resources allow, at most ``max_in_flight`` at once; each finished revision's
    units join the one unit engine at once (their tasks run on the CPUs), so extraction never waits
    for analysis. ``progress(kind, n)`` gets kind ``texts`` (per batch), ``extract`` (per revision),
    ``stored`` (per revision whose extraction is read back from the store: no forward pass), ``units`` (a
    revision's engine progress total, when it lands), ``more`` (steps a unit added: --n-null auto) or ``steps`` (engine
    steps done);
    callers ignore the rest. An extraction of other
    settings of the same (model, revision) is left as it is: each has its own place in the store.

    Hub revisions are downloaded ahead by ``engine.weights`` within ``weights.budget_bytes`` (online only; default: the
    budget of :func:`default_weights`), each deleted again once its extraction is stored unless ``weights.keep``. A
    revision that cannot be fetched or extracted is recorded with its reason (``store.failures``) and the others go
    on. ``stages``, when given, gets the (start, end, "model@revision") monotonic times of every download, extraction
    and analysed revision, and under ``replica_start`` the moments a replica process was started.

    While revisions download, CPU replicas reserve no CPU (at most ``max_in_flight`` of them) and one whose revision
    landed stays parked until the next downloaded revision takes it (or the sweep ends): a replica that held its CPU
    while it waited left that CPU idle under queued analysis tasks, and one stopped instead cost the next revision a new
    process (torch and transformers imported again, about 7 CPU-s here; docs/benchmarks.md, bench_sweep --hub).
    """
    progress = progress or (lambda kind, n: None)
    # One driver loop: a revision's units join the engine the moment its extraction lands, and
    # run while the next revisions extract.
    runner = UnitRunner(
        store, progress=lambda n: progress("steps", n), units_in_flight=4 * analysis_threads, grow=lambda n: progress("more", n)
    )
    extraction_units: dict[tuple[str, str, str], list[str]] = {}

    stages = {} if stages is None else stages
    analysed: dict[tuple[str, str, str], float] = {}

    def analyse(item: SweepItem, info: dict, units: list[Unit] | None = None) -> None:
        spec = item.request.spec
        units = units_for(item, info) if units is None else units
        extraction_units[(spec.slug, spec.revision, info["key"])] = [unit.key for unit in units]
        analysed[(spec.slug, spec.revision, info["key"])] = (time.monotonic(), f"{spec.name}@{spec.revision}")
        progress("units", sum(unit.cost for unit in units))
        runner.add(units)

    def drop_finished() -> None:
        for (slug, revision, key), keys in list(extraction_units.items()):
            if all(unit in runner.rows for unit in keys):
                del extraction_units[(slug, revision, key)]
                began, label = analysed.pop((slug, revision, key))
                stages.setdefault("analyse", []).append((began, time.monotonic(), label))
                if not keep_activations:
                    store.drop_activations(slug, revision, key)

    queue: list[tuple[SweepItem, str]] = []
    for item in items:
        info, units, need = _what_is_stored(store, item, units_for)
        if need is None:
            progress("texts", len(item.request.corpus.texts))
            progress("extract", 1)
            progress("stored", 1)
            analyse(item, info, units)
        else:
            queue.append((item, need))
    # A lone CPU replica gets a whole node; several share the CPUs one each.
    cpus = replica_actor.largest_node_cpus() if len(queue) == 1 else 1
    if max_in_flight is None:
        max_in_flight = _replica_slots(queue, cpus)  # a replica whose revision lands is handed the next one
    # A revision that cannot be loaded (not on the hub, not in an offline cache) must not stop a
    # days-long sweep: the rest finishes, then one error names every failed revision.
    hub = Weights([item.request.spec for item, _ in queue], weights or default_weights())
    started: dict[int, float] = {}  # id of a request -> when its extraction started

    def finished(request: ExtractionRequest, failure: str | None) -> None:
        spec = request.spec
        stages.setdefault("extract", []).append(
            (started.pop(id(request), time.monotonic()), time.monotonic(), f"{spec.name}@{spec.revision}")
        )
        hub.done_with(spec)
        if failure is None:
            failures.clear(store.root, spec.slug, spec.revision)
        else:
            failures.record(store.root, spec.slug, spec.revision, failure)

    waits_for_downloads = hub.active and not any(item.gpus > 0 for item, _ in queue)  # a parked GPU replica holds its GPU
    extractions = Extractions(store, progress, cpus, finished=finished, reserve_cpus=not waits_for_downloads)
    try:
        while queue or extractions.running or runner.busy:
            hub.pump()
            _start_ready(store, queue, extractions, hub, max_in_flight, started, stages, progress)
            if not waits_for_downloads:  # replicas that reserve no CPU wait parked until the sweep ends
                extractions.drop_idle()
            for ref in runner.step(extractions.refs() + hub.refs()):
                if hub.handle(ref):
                    continue
                landed = extractions.handle(ref)
                if landed:
                    analyse(*landed)
            drop_finished()
    finally:
        extractions.close()
    stages["download"] = stages.get("download", []) + hub.intervals
    drop_finished()
    rows = [row for unit_rows in runner.rows.values() for row in unit_rows]
    _refuse_failed(extractions.failed, len(items))
    return rows


def _what_is_stored(store: Store, item: SweepItem, units_for) -> tuple[dict | None, list[Unit] | None, str | None]:
    """An item's completion marker, its units where its extraction is stored, and what it still needs extracted
    (None: nothing, as every unit is done or the extraction is stored; else needs_extraction's answer)."""
    spec = item.request.spec
    key = item.request.key()
    info = store.completion(spec.slug, spec.revision, key)
    # Revisions whose every unit is done need no activations (they may have been dropped).
    units = None
    if info is not None and info.get("key") == key:
        try:
            units = units_for(item, info)
        except RaygeomError:  # e.g. a damaged readout: not done; extracted again, or the error comes back below
            units = None
    done_units = units is not None and all(store.has_result(unit.analysis, unit.key) for unit in units)
    # Every unit stored is not every file intact: a layer file, the samples or the readout of the extraction may be
    # gone or damaged, which `raygeom verify` reports. A rerun makes it again (a freed extraction, every layer file
    # deleted on purpose, is no damage).
    if done_units and store.extraction_problem(spec.slug, spec.revision, key):
        done_units = False
    return info, units, None if done_units else needs_extraction(store, item.request)


def _replica_slots(queue: list, cpus: int) -> int:
    """How many replicas may extract at once: the cluster's CPUs per replica, or its GPUs per GPU replica."""
    slots = max(1, int(ray.cluster_resources().get("CPU", 1)) // cpus)
    gpu_items = [item.gpus for item, _ in queue if item.gpus > 0]
    if gpu_items:
        slots = max(1, int(cluster_gpus() / max(min(gpu_items), 1e-9)))
    return slots


def _start_ready(store, queue: list, extractions, hub, max_in_flight: int, started: dict, stages: dict, progress) -> None:
    """Start the queue's revisions whose weights are ready, in order, while fewer than ``max_in_flight`` extract; a
    revision whose download failed is recorded and skipped (the others go on)."""
    while queue and extractions.running < max_in_flight:
        spec = queue[0][0].request.spec
        state = hub.state(spec)
        if state == "failed":  # not fetched: the others go on
            queue.pop(0)
            extractions.failed.append(hub.reason(spec))
            failures.record(store.root, spec.slug, spec.revision, hub.reason(spec))
            progress("extract", 1)
            continue
        if state != "ready":
            break
        started[id(queue[0][0].request)] = time.monotonic()
        replicas_before = extractions.replicas.started
        extractions.start(*queue[0])
        if extractions.replicas.started > replicas_before:
            stages.setdefault("replica_start", []).append((time.monotonic(),) * 2 + (f"{spec.name}@{spec.revision}",))
        queue.pop(0)


def _refuse_failed(failed: list[str], n_items: int) -> None:
    """One error naming the revisions that could not be fetched or extracted (the others are stored)."""
    if failed:
        if n_items == 1:
            raise RaygeomError(failed[0])
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise RaygeomError(f"{len(failed)} of {n_items} revisions failed, the others are stored; first: {failed[0]}{more}")
