"""Session set-up: an offline HF hub cache of tiny Pythia models, and one local Ray on loopback.

The environment is set at import, before anything imports ray or huggingface_hub,
because both read it once at import.
"""

import os
import tempfile
from pathlib import Path

import pytest

_SESSION_DIR = Path(tempfile.mkdtemp(prefix="raygeom-tests-"))
os.environ["HF_HUB_CACHE"] = str(_SESSION_DIR / "hub")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from raygeom.engine.ray_env import prepare_local_ray_environment  # noqa: E402

prepare_local_ray_environment()

TINY_REVISIONS = ("step0", "step1000", "step143000")


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
    from raygeom.testing import TINY_TEXT

    sentences = [s.strip() + " ." for s in TINY_TEXT.split(" . ") if s.strip()]
    lines = [f"{sentences[i % len(sentences)]} item {i} {sentences[(i * 3 + 1) % len(sentences)]}" for i in range(60)]
    path = tmp_path / "tiny.txt"
    path.write_text("\n".join(lines) + "\n")
    return path
