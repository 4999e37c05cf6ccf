"""Session set-up: an offline HF hub cache of tiny Pythia models, and one local Ray on loopback.

The environment is set at import, before anything imports ray or huggingface_hub,
because both read it once at import.
"""

import json
import os
import tempfile
from pathlib import Path

import pytest

_SESSION_DIR = Path(tempfile.mkdtemp(prefix="raygeom-tests-"))
os.environ["HF_HUB_CACHE"] = str(_SESSION_DIR / "hub")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The CLI's module-level rich consoles take their width from COLUMNS once, at import; tests give the width per call
# (CliRunner env, a subprocess env). xdist workers have COLUMNS=80 and LINES=24 set, which would pin it at 80.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # One worker per core (make test: -n 2): one thread each, for torch here and in every CLI subprocess and Ray worker
    # it starts. Two-thread pools in both workers oversubscribe the 2 cores, and OpenMP's waiting threads spin.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import typer.testing  # noqa: E402

from raygeom.engine.ray_env import prepare_local_ray_environment  # noqa: E402

# CliRunner builds the app's whole click tree at every invoke (0.1-0.2 s); raygeom's app keeps the one it built.
_build_command = typer.testing._get_command
typer.testing._get_command = lambda app: app.click_command() if hasattr(app, "click_command") else _build_command(app)

prepare_local_ray_environment()

TINY_REVISIONS = ("step0", "step1000", "step143000")
# make test runs 2 xdist workers (-n 2 --dist loadfile): each is its own session, with its own hub cache (above) and its
# own local Ray (ray_local). A file runs whole on one worker, so its module fixtures are built once; a file that reuses
# another's session run (imported from it) runs on that file's worker, or the run would be made twice.
RUNS_WITH = {
    "tests/integration/test_faults.py": "tests/integration/test_sweep.py",  # first_run
    "tests/integration/test_trajectory.py": "tests/integration/test_checkpoint_sweep.py",
}  # trajectory_run
# Files are handed out longest first (with --no-loadscope-reorder; seconds per file in tests/durations.json, refreshed by
# tests/durations.py), so the short unit files fill the end of both workers and neither is left with a long file at the end.
DURATIONS = json.loads((Path(__file__).with_name("durations.json")).read_text())


@pytest.hookimpl(optionalhook=True)  # xdist's hook: without the plugin (-p no:xdist) it is never called
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LoadFileWithShared(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return LoadFileWithShared(config, log)


def _scope(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return RUNS_WITH.get(path, path)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the workers' collection order is the order work is handed out in
        seconds: dict[str, float] = {}
        for path, value in DURATIONS.items():
            seconds[_scope(path)] = seconds.get(_scope(path), 0.0) + value
        items.sort(
            key=lambda item: (-seconds.get(_scope(item.nodeid), 0.0), _scope(item.nodeid))
        )  # stable: a file keeps its order


@pytest.fixture(scope="session")
def hub_cache() -> Path:
    from raygeom.testing import write_tiny_pythia

    cache = Path(os.environ["HF_HUB_CACHE"])
    write_tiny_pythia(cache, "EleutherAI/pythia-14m", list(TINY_REVISIONS))
    return cache


@pytest.fixture(scope="session")
def ray_local():
    from raygeom.engine import orchestrate

    orchestrate.start_ray(num_cpus=2)
    yield
    import ray

    ray.shutdown()


@pytest.fixture(scope="session")
def ray_address(ray_local) -> str:
    """The session's Ray, for CLI subprocesses (--address) whose test is not about starting a local Ray:
    attaching takes about a second, a local start several, and its job's work runs on the same loopback cluster."""
    import ray

    return ray.get_runtime_context().gcs_address


@pytest.fixture
def tiny_corpus(tmp_path) -> Path:
    from raygeom.testing import varied_text

    # Texts that differ within the first 16 tokens and in their last token: with fewer distinct rows than k + 2 after
    # CCR a layer is not scored (the old lines shared their first 16 tokens: 6 distinct rows in 60).
    lines = [f"item {i} {varied_text(i)}" for i in range(60)]
    path = tmp_path / "tiny.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def warm_replicas(ray_local):
    """For a module whose in-process runs load the same models again and again: a stopped replica stays loaded and the
    next run gets it (raygeom.testing.WarmReplicas), instead of a new Ray worker importing torch and transformers (~7 s).
    A module opts in with ``pytestmark = [..., pytest.mark.usefixtures("warm_replicas")]``; its module fixtures that run
    jobs name it too, so that they run inside it."""
    from raygeom.testing import WarmReplicas

    with WarmReplicas() as replicas:
        yield replicas
