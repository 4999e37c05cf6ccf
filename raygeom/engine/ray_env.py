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


def prepare_local_ray_environment() -> None:
    if "ray" in sys.modules and os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") != "0":
        raise RuntimeError("ray was imported before raygeom could keep the local cluster on loopback")
    for name, value in LOCAL_RAY_ENV.items():
        os.environ.setdefault(name, value)
    # Short path: Ray's socket names must stay under the 107-byte Unix limit.
    ray_tmp = Path(tempfile.gettempdir()) / f"raygeom-ray-{os.getuid()}"
    ray_tmp.mkdir(exist_ok=True)
    os.environ.setdefault("RAY_TMPDIR", str(ray_tmp))
