"""Pythia sweeps through a hub: `raygeom run` in a subprocess downloads tiny Pythia revisions from the loopback hub
(tests/hub.py) with the real huggingface_hub client, into an empty HF cache, within a weights budget, through faults.

Every CLI run here is online (HF_HUB_OFFLINE=0, HF_ENDPOINT at the loopback hub) with its own HF_HOME and its own
local Ray, whose workers inherit that environment (the session's Ray workers are offline, on the session's cache).
The budget sweep and the fault sweeps run at the same time, each against a hub of its own (the same repo), so that
one's waits (Ray and worker starts, retry backoff) are the other's CPU time; each Ray has one CPU (one task worker).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from raygeom.testing import varied_text, write_tiny_job, write_tiny_pythia
from tests.hub import LoopbackHub

ROOT = Path(__file__).resolve().parents[2]
REPO = "EleutherAI/pythia-14m"
# 12 real Pythia names, each its own weights; the hub lists only these (revisions = "all" then takes them).
REVISIONS = [
    "step0",
    "step1",
    "step2",
    "step4",
    "step8",
    "step16",
    "step32",
    "step64",
    "step128",
    "step256",
    "step512",
    "step1000",
]
SHAPE = {"hidden_size": 32, "layers": 1}


def cache_files(cache: Path) -> dict[str, bytes]:
    return {str(p.relative_to(cache)): p.read_bytes() for p in sorted(cache.rglob("*")) if p.is_file()}


def file_bytes(root: Path) -> int:
    """What the HF cache holds: every regular file (partial downloads included), links not followed."""
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                if not os.path.islink(path):
                    total += os.lstat(path).st_size
            except FileNotFoundError:
                pass
    return total


@pytest.fixture(scope="module")
def hubs(tmp_path_factory):
    """Two hubs serving the same repo: the budget sweep's and the fault sweeps'."""
    source = tmp_path_factory.mktemp("hub-source")
    folder = write_tiny_pythia(source, REPO, REVISIONS, **SHAPE)
    with LoopbackHub() as budget, LoopbackHub() as faults:
        budget.add(folder, REPO)
        faults.add(folder, REPO)
        yield budget, faults


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hub-corpus") / "texts.txt"
    path.write_text("\n".join(f"item {i} {varied_text(i)}" for i in range(60)) + "\n")
    return path


def run_cli(hub: LoopbackHub, home: Path, *args, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        HF_HOME=str(home),
        HF_HUB_CACHE=str(home / "hub"),
        HF_HUB_OFFLINE="0",
        HF_ENDPOINT=hub.url,
        HF_HUB_DOWNLOAD_TIMEOUT="2",
        COLUMNS="200",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    return subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=home.parent,
        timeout=timeout,
    )


def job(directory: Path, name: str, corpus: Path, sweep: str) -> Path:
    # One replica: each run starts one worker that imports torch, and the budget's second revision is fetched ahead of it.
    return write_tiny_job(
        directory / f"{name}.toml", name, directory / name, corpus, sweep=f'sizes = ["14m"]\nmax_in_flight = 1\n{sweep}'
    )


def layer_files(store: Path, revision: str) -> dict[str, bytes]:
    """Every stored Parquet file of one revision (layers, samples, readout), by path in the store (the markers and
    their checksums hold timings)."""
    found = {}
    for path in sorted(store.rglob("*")):
        parts = path.relative_to(store).parts
        if (
            path.is_file()
            and f"revision={revision}" in parts
            and parts[0] in ("activations", "samples", "readout")
            and path.suffix == ".parquet"
        ):
            found[str(path.relative_to(store))] = path.read_bytes()
    return found


def budget_sweep(hub: LoopbackHub, corpus: Path, directory: Path) -> dict:
    """`revisions = "all"` (the hub's 12), an empty cache but for step0 (there before the run), a budget of 2 revisions'
    weights; the cache's size sampled every 20 ms while it runs."""
    home = directory / "hf"
    write_tiny_pythia(home / "hub", REPO, {"step0": 0}, **SHAPE)  # cached before the sweep: never deleted
    before = cache_files(home / "hub")
    biggest = max(hub.revision_bytes(REPO, r) for r in REVISIONS)
    budget = 2 * biggest + 1024
    path = job(directory, "budget", corpus, f'revisions = "all"\nweights_budget_gib = {budget / 2**30!r}\n')
    samples, stop = [], threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            samples.append(file_bytes(home / "hub") - sum(map(len, before.values())))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    hub.clear()
    try:
        result = run_cli(hub, home, "run", path, "--num-cpus", "1")
    finally:
        stop.set()
        sampler.join()
    requests = list(hub.requests)
    status = run_cli(hub, home, "status", path)
    return {
        "result": result,
        "status": status,
        "home": home,
        "store": directory / "budget",
        "budget": budget,
        "biggest": biggest,
        "samples": samples,
        "before": before,
        "requests": requests,
        "job": path,
    }


@pytest.fixture(scope="module")
def sweeps(hubs, corpus, tmp_path_factory):
    with ThreadPoolExecutor(2) as pool:
        budget = pool.submit(budget_sweep, hubs[0], corpus, tmp_path_factory.mktemp("budget"))
        faults = pool.submit(fault_sweeps, hubs[1], corpus, tmp_path_factory.mktemp("faults"))
        return budget.result(), faults.result()


@pytest.fixture(scope="module")
def budget_run(sweeps):
    return sweeps[0]


@pytest.fixture(scope="module")
def fault_runs(sweeps):
    return sweeps[1]


def test_budget_sweep_stores_every_unit_within_the_budget(budget_run):
    result = budget_run["result"]
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    # revisions = "all": the hub's list (12) differs from raygeom's 154: one warning line, the hub's list is used.
    warnings = [line for line in result.stdout.splitlines() if "warning" in line and "the hub lists 12 revisions" in line]
    assert len(warnings) == 1, result.stdout[-3000:]
    assert "sweep budget: 12 revisions of 1 model" in result.stdout, result.stdout[-3000:]
    samples = budget_run["samples"]
    assert len(samples) > 20 and max(samples) <= budget_run["budget"], (max(samples), budget_run["budget"])
    assert max(samples) > budget_run["biggest"] // 2  # the downloads did land in this cache
    status = budget_run["status"].stdout
    assert "units: 36/36 done (100.0%)" in status, status
    assert "failed" not in status


def test_budget_sweep_leaves_only_what_was_cached_before(budget_run):
    from huggingface_hub import scan_cache_dir

    cache = budget_run["home"] / "hub"
    info = scan_cache_dir(cache)
    refs = {ref for repo in info.repos for revision in repo.revisions for ref in revision.refs}
    assert refs == {"step0"}
    assert {k: v for k, v in cache_files(cache).items() if "snapshots" in k or "refs" in k} == {
        k: v for k, v in budget_run["before"].items() if "snapshots" in k or "refs" in k
    }
    commit_of_step0 = (cache / f"models--{REPO.replace('/', '--')}" / "refs" / "step0").read_text()
    assert not [r for r in budget_run["requests"] if commit_of_step0 in r[1] or "/revision/step0" in r[1]]
    assert "HF cache: 0.000 GiB in use" in budget_run["status"].stdout


def fault_sweeps(hub: LoopbackHub, corpus: Path, directory: Path) -> dict:
    """One sweep of 4 revisions through four faults (500 twice, a cut mid-file, a 404, corrupted bytes of the right
    size), its status, then a rerun with the faults lifted."""
    home = directory / "hf"
    path = job(directory, "faults", corpus, 'revisions = ["step1", "step2", "step4", "step8"]\ndownload_retries = 2\n')
    hub.clear()
    hub.fault("500", file="model.safetensors", revision="step1", times=2)
    hub.fault("cut", file="model.safetensors", revision="step2", after=80_000, times=1)
    hub.fault("404", revision="step4")
    hub.fault("corrupt", file="model.safetensors", revision="step8")
    first = run_cli(hub, home, "run", path, "--num-cpus", "1")
    requests = list(hub.requests)
    status = run_cli(hub, home, "status", path)
    hub.clear()
    again = run_cli(hub, home, "run", path, "--num-cpus", "1")
    status_again = run_cli(hub, home, "status", path)
    return {
        "first": first,
        "status": status,
        "again": again,
        "status_again": status_again,
        "requests": requests,
        "store": directory / "faults",
        "home": home,
    }


def test_500_twice_then_ok(fault_runs):
    gets = [r for r in fault_runs["requests"] if r[0] == "GET" and r[1].endswith("model.safetensors")]
    commit = __import__("hashlib").sha1(f"{REPO}@step1".encode()).hexdigest()
    mine = [status for _, path, status in gets if commit in path]
    assert mine == [500, 500, 200], mine
    assert "step1" not in "".join(line for line in fault_runs["status"].stdout.splitlines() if "failed" in line)


def test_cut_mid_file_resumes_to_the_same_bytes(fault_runs, budget_run):
    commit = __import__("hashlib").sha1(f"{REPO}@step2".encode()).hexdigest()
    mine = [
        status
        for method, path, status in fault_runs["requests"]
        if method == "GET" and commit in path and path.endswith("model.safetensors")
    ]
    assert mine == [200, 206], mine  # cut, then resumed with a Range request
    resumed, clean = layer_files(fault_runs["store"], "step2"), layer_files(budget_run["store"], "step2")
    assert resumed and {Path(k).name for k in resumed} == {Path(k).name for k in clean}
    assert sorted(resumed.values()) == sorted(clean.values())


def test_404_fails_alone_and_a_rerun_completes_it(fault_runs):
    first = fault_runs["first"]
    assert first.returncode == 2, first.stderr[-3000:]
    assert "2 of 4 revisions failed, the others are stored" in first.stderr
    failed = [line for line in fault_runs["status"].stdout.splitlines() if line.startswith("failed")]
    assert any("pythia-14m@step4" in line and "revision not found on the hub (404)" in line for line in failed), failed
    # step1 and step2 finished (3 layers each); step4 and step8 not extracted (their layers counted from the Pythia table)
    assert re.search(r"units: 6/\d+ done", fault_runs["status"].stdout), fault_runs["status"].stdout
    again = fault_runs["again"]
    assert again.returncode == 0, again.stderr[-3000:]
    assert "units: 12/12 done (100.0%)" in fault_runs["status_again"].stdout
    assert not [line for line in fault_runs["status_again"].stdout.splitlines() if line.startswith("failed")]


def test_corrupted_file_is_refused_by_checksum_and_never_loaded(fault_runs):
    failed = [line for line in fault_runs["status"].stdout.splitlines() if line.startswith("failed")]
    line = next(line for line in failed if "pythia-14m@step8" in line)
    assert "checksum" in line and "sha256" in line and "model.safetensors" in line, line
    assert layer_files(fault_runs["store"], "step8") != {}  # stored by the rerun, from the hub's bytes
    commit = __import__("hashlib").sha1(f"{REPO}@step8".encode()).hexdigest()
    assert not (fault_runs["home"] / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit).exists()
