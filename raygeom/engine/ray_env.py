"""Environment for a Ray that this process starts on its own machine.

Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, at import, to decide which
address its node binds to; "0" keeps a local cluster on 127.0.0.1. So this
must run before ``import ray``, and only when no external cluster is used.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

LOCAL_RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
}

# How long one of the driver's lookups of its starting node blocks inside C++ (GlobalStateAccessor::GetNode, Ray's
# default 10 s; a raylet killed while it started kept the driver there 30 s a try under load). raygeom's start asks
# again until its own wait is over and looks between lookups whether the node's processes still run, so the lookup
# is kept short. Read once, when Ray's C++ config is first made in this process, so it is set before ``import ray``;
# the node's processes are started without it (raygeom.engine.orchestrate._own_session).
DRIVER_ONLY_ENV = {"RAY_raylet_start_wait_time_s": "2"}


def prepare_local_ray_environment() -> None:
    if "ray" in sys.modules and os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") != "0":
        raise RuntimeError("ray was imported before raygeom could keep the local cluster on loopback")
    for name, value in {**LOCAL_RAY_ENV, **DRIVER_ONLY_ENV}.items():
        os.environ.setdefault(name, value)
    # Short path: Ray's socket names must stay under the 107-byte Unix limit.
    ray_tmp = Path(tempfile.gettempdir()) / f"raygeom-ray-{os.getuid()}"
    ray_tmp.mkdir(exist_ok=True)
    os.environ.setdefault("RAY_TMPDIR", str(ray_tmp))


LOOPBACK_HOSTS = ("127.", "localhost", "::1", "[::1]")


def _address_host(address: str) -> str:
    address = address.split("://", 1)[-1]
    if address.startswith("["):
        return address[: address.find("]") + 1]
    return address.rsplit(":", 1)[0] if address.count(":") == 1 else address


def _resolve_auto(address: str) -> str | None:
    """Where ``auto`` points, read the way Ray reads it (RAY_ADDRESS, then the last started cluster's file)."""
    if address != "auto":
        return address
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    for base in {os.environ.get("RAY_TMPDIR") or tempfile.gettempdir(), "/tmp"}:
        try:
            return (Path(base) / "ray" / "ray_current_cluster").read_text().strip() or None
        except OSError:
            continue
    return None


def is_loopback(address: str | None) -> bool:
    resolved = _resolve_auto(address) if address else None
    return bool(resolved) and _address_host(resolved).startswith(LOOPBACK_HOSTS)


def prepare_ray_environment(address: str | None) -> None:
    """Before ``import ray``: a local cluster gets the full loopback environment; a cluster at a loopback
    address (a head started with --node-ip-address=127.0.0.1) needs the driver on loopback too, or Ray
    rewrites its address to the host's IP and the connection hangs."""
    if address is None:
        prepare_local_ray_environment()
    elif is_loopback(address):
        for name, value in LOCAL_RAY_ENV.items():
            os.environ.setdefault(name, value)
