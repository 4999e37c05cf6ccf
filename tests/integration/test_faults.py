"""Faults on real Ray clusters on this machine, loopback only.

- A multi-node ray.cluster_utils.Cluster loses a worker node mid-sweep (remove_node): the sweep finishes
  with every unit present exactly once and identical to an uninterrupted run. The same cluster then
  gets a node with 2 fake GPUs, on which extraction replicas are placed by their num_gpus request.
- The driver of a sweep is killed (SIGKILL) mid-run: a rerun computes only the missing units.
- docs/sweeps.md's `ray job submit` recipe runs a sweep on a `ray start --head` cluster started outside the venv,
  resubmitting it resumes, and its last lines stop that head and no other Ray.

Each separate cluster runs in a subprocess, because this process already holds the session's Ray.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console
from test_sweep import UNITS, first_run, tidy, write_sweep_job

from raygeom.jobspec import load_job
from raygeom.testing import write_tiny_job

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

CLUSTER_SCRIPT = textwrap.dedent("""
    import json, subprocess, sys, threading, time
    from pathlib import Path
    from raygeom.engine.ray_env import prepare_local_ray_environment

    prepare_local_ray_environment()
    import ray
    from ray.cluster_utils import Cluster
    from rich.console import Console

    from raygeom.jobspec import load_job
    from raygeom.jobs.run import run

    job_file, report_path = sys.argv[1], sys.argv[2]
    report = {}
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}})
    workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    report["nodes"] = len([n for n in ray.nodes() if n["Alive"]])
    report["node_ips"] = sorted({n["NodeManagerAddress"] for n in ray.nodes()})

    job = load_job(job_file)
    results = Path(job.out) / "results" / "pga"
    outcome = {}

    def sweep():
        try:
            outcome["outputs"] = run(job, Console(quiet=True), address=cluster.address)
        except BaseException as error:
            outcome["error"] = repr(error)

    thread = threading.Thread(target=sweep)
    thread.start()
    while thread.is_alive() and len(list(results.glob("*.parquet"))) < 4:
        time.sleep(0.05)
    report["units_before_kill"] = len(list(results.glob("*.parquet")))
    import os
    marker = os.environ["RAY_TMPDIR"]
    pids = {str(os.getpid())}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes().replace(b"\\0", b" ").decode(errors="replace"):
                pids.add(entry.name)
        except OSError:
            pass
    sockets = [line for line in subprocess.run(["ss", "-tnpH"], capture_output=True, text=True).stdout.splitlines()
               if any(f"pid={pid}," in line for pid in pids)]
    report["cluster_processes"] = len(pids)
    cluster.remove_node(workers[1])
    report["killed"] = True
    thread.join(timeout=300)
    report["error"] = outcome.get("error")
    report["rows"] = len(outcome["outputs"].over_revisions["pga"].rows) if "outputs" in outcome else None
    report["alive_after"] = len([n for n in ray.nodes() if n["Alive"]])

    # Fake GPUs: a node with 2 GPUs and no CPUs; replicas go there by their num_gpus alone.
    from raygeom.engine import replica_actor
    from raygeom.jobs.extract import replica_gpus
    from raygeom.sources.revisions import PYTHIA_SIZES

    gpu_node = cluster.add_node(num_cpus=0, num_gpus=2, resources={"gpu_node": 1})
    cluster.wait_for_nodes()
    gpu_node_id = gpu_node.node_id

    @ray.remote
    def probe(seconds):
        start = time.time()
        time.sleep(seconds)
        return ray.get_runtime_context().get_node_id(), [str(g) for g in ray.get_gpu_ids()], start, time.time()

    def run(gpus, count):
        options, device, device_map = replica_actor.replica_options(gpus)
        return [ray.get(r) for r in [probe.options(**options).remote(0.6) for _ in range(count)]], device, device_map

    def most_at_once(spans):
        return max(sum(1 for _, _, s, e in spans if s <= t < e) for _, _, t, _ in spans)

    @ray.remote(num_cpus=0)
    class Barrier:
        def __init__(self):
            self.arrived = 0

        def arrive(self):
            self.arrived += 1

        def count(self):
            return self.arrived

    @ray.remote
    def meet(barrier, target):
        ray.get(barrier.arrive.remote())
        deadline = time.time() + 60
        while ray.get(barrier.count.remote()) < target and time.time() < deadline:
            time.sleep(0.05)
        return ray.get_runtime_context().get_node_id(), [str(g) for g in ray.get_gpu_ids()], ray.get(barrier.count.remote())

    # Four half-GPU replicas must be able to run at once (they wait for each other), two on each GPU.
    barrier = Barrier.remote()
    options, _, _ = replica_actor.replica_options(replica_gpus(None, job, 2, PYTHIA_SIZES["1b"].params))
    met = ray.get([meet.options(**options).remote(barrier, 4) for _ in range(4)])
    half, device, _ = run(replica_gpus(None, job, 2, PYTHIA_SIZES["1b"].params), 8)
    whole, _, sharded_map = run(replica_gpus(None, job.__class__(**{**job.__dict__, "sweep": job.sweep.__class__(gpu_memory_gib=24, gpus_per_node=2)}), 2, PYTHIA_SIZES["12b"].params), 2)
    cpu_side = ray.get([probe.remote(0.0) for _ in range(4)])
    report["gpu"] = {
        "half_on_gpu_node": all(n == gpu_node_id for n, *_ in half + met), "half_at_once": most_at_once(half),
        "met": [count for *_, count in met], "met_ids": sorted(g[0] for _, g, _ in met if len(g) == 1),
        "half_ids": sorted({tuple(g) for _, g, *_ in half}), "device": device,
        "sharded_ids": [g for _, g, *_ in whole], "sharded_at_once": most_at_once(whole), "sharded_map": sharded_map,
        "cpu_tasks_off_gpu_node": all(n != gpu_node_id for n, *_ in cpu_side)}
    report["peers"] = [line.split()[4] for line in sockets if len(line.split()) > 4]
    Path(report_path).write_text(json.dumps(report))
    ray.shutdown()
    cluster.shutdown()
""")


@pytest.fixture(scope="module")
def sweep_setup(hub_cache, ray_local, tmp_path_factory):
    """The session's uninterrupted run (shared with test_sweep): the reference every faulty run must match."""
    run = first_run(hub_cache, tmp_path_factory)
    return run["root"], run["root"] / "corpus.txt", run["reference"]


def subprocess_env(tmp: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), RAY_TMPDIR=str(tmp))


@pytest.fixture
def ray_tmp():
    # Short: Ray's socket paths under it must stay within the 107-byte Unix limit.
    path = Path(tempfile.mkdtemp(prefix="rgf-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def processes_under(marker: str) -> list[int]:
    """Processes whose command line mentions ``marker`` (this test's own Ray temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_losing_a_worker_node_mid_sweep_changes_nothing(sweep_setup, tmp_path, ray_tmp):
    root, corpus, reference = sweep_setup
    job_file = write_sweep_job(tmp_path, tmp_path / "out", corpus)
    script = tmp_path / "cluster_sweep.py"
    script.write_text(CLUSTER_SCRIPT)
    report_path = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(script), str(job_file), str(report_path)],
        env=subprocess_env(ray_tmp),
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["nodes"] == 3 and report["node_ips"] == ["127.0.0.1"]
    assert report["cluster_processes"] > 5 and report["peers"], report
    assert all(peer.startswith(("127.0.0.1:", "[::1]:", "[::ffff:127.0.0.1]:")) for peer in report["peers"]), report["peers"]
    assert report["killed"] and 4 <= report["units_before_kill"] < UNITS, report
    assert report["error"] is None and report["rows"] == UNITS and report["alive_after"] == 2
    assert tidy(tmp_path / "out" / "results" / "pga.parquet") == reference
    assert len(list((tmp_path / "out" / "results" / "pga").glob("*.parquet"))) == UNITS
    gpu = report["gpu"]
    assert gpu["half_on_gpu_node"] and gpu["device"] == "cuda" and gpu["cpu_tasks_off_gpu_node"]
    assert gpu["met"] == [4, 4, 4, 4] and gpu["met_ids"] == ["0", "0", "1", "1"]  # two replicas per GPU, at once
    assert gpu["half_at_once"] <= 4  # and never more
    assert gpu["half_ids"] == [["0"], ["1"]]
    assert gpu["sharded_ids"] == [["0", "1"], ["0", "1"]] and gpu["sharded_at_once"] == 1 and gpu["sharded_map"] == "auto"


def test_killing_the_driver_then_rerunning_computes_only_the_missing_units(sweep_setup, tmp_path, ray_tmp):
    from raygeom.jobs.run import run

    root, corpus, reference = sweep_setup
    out = tmp_path / "out"
    job_file = write_sweep_job(tmp_path, out, corpus)
    results = out / "results" / "pga"
    driver = subprocess.Popen(
        [sys.executable, "-m", "raygeom.cli", "run", str(job_file), "--num-cpus", "2"],
        env=subprocess_env(ray_tmp),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        while len(list(results.glob("*.parquet"))) < 4 and driver.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert driver.poll() is None, "the sweep finished before it could be interrupted"
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
    finally:
        # Ray's reaper ends the driver's local cluster; anything of it still alive is ended here by pid.
        deadline = time.time() + 20
        while processes_under(str(ray_tmp)) and time.time() < deadline:
            time.sleep(0.2)
        for pid in processes_under(str(ray_tmp)):
            os.kill(pid, signal.SIGKILL)
    survivors = sorted(results.glob("*.parquet"))
    assert 4 <= len(survivors) < UNITS
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in survivors}
    markers = {p: p.stat().st_mtime_ns for p in (out / "activations").rglob("_COMPLETE.json")}

    outputs = run(load_job(job_file), Console(quiet=True))

    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in results.glob("*.parquet")}
    assert {name: after[name] for name in before} == before  # finished units were not rewritten
    assert outputs.computed_units == UNITS - len(before) == len(after) - len(before)
    assert all(p.stat().st_mtime_ns == t for p, t in markers.items())  # nor were finished extractions redone
    assert tidy(outputs.files["pga"][0]) == reference


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def documented_recipe() -> str:
    text = (ROOT / "docs" / "sweeps.md").read_text()
    found = re.search(r"<!-- recipe: job-submit -->\n```bash\n(.*?)```", text, re.DOTALL)
    assert found, "docs/sweeps.md lost its job-submit recipe"
    return found.group(1)


def is_ray_node(pid: int) -> bool:
    try:
        return any(name in Path(f"/proc/{pid}/cmdline").read_bytes() for name in (b"gcs_server", b"raylet"))
    except OSError:
        return False


def test_the_documented_job_submit_recipe_runs_a_sweep_and_resubmitting_resumes(sweep_setup, tmp_path):
    """docs/sweeps.md's recipe, as written, against a loopback head started *outside* the venv (PATH without it,
    as when `ray start` ran from another shell), its submit line run twice: the entrypoint names the venv's
    interpreter, the head has its own --temp-dir, and the recipe's last lines stop that head and no other Ray."""
    root, corpus, reference = sweep_setup
    out = tmp_path / "out"
    # One checkpoint of the session's sweep (4 units, one model load; its lowest z is at final_norm, the longest
    # layer name in the log's table): the recipe is under test here, not the sweep.
    job_file = write_tiny_job(
        tmp_path / "sweep.toml", "tiny-sweep", out, corpus, sweep='sizes = ["31m"]\nrevisions = ["step1000"]\n'
    )
    reference = [row for row in reference if (row["model"], row["revision"]) == ("EleutherAI--pythia-31m", "step1000")]
    units = len(reference)
    assert units == 4
    recipe = documented_recipe()
    # What a test must change: this checkout's venv, free ports (this session's own Ray holds the defaults), the
    # offline hub cache of tiny models, the tiny sweep in place of the Pythia one, and the output directory.
    agent_ports = " ".join(
        f"--{name}={free_port()}"
        for name in (
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "runtime-env-agent-port",
            "metrics-export-port",
            "ray-client-server-port",
        )
    )
    script = (
        recipe.replace("VENV=$PWD/.venv", f"VENV={sys.prefix}")
        .replace("--port=6390", f"--port={free_port()}")
        .replace("8266", str(free_port()))
        .replace("--disable-usage-stats", f"--disable-usage-stats {agent_ports}")
        .replace('"HF_HUB_OFFLINE": "1"', f'"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": {json.dumps(os.environ["HF_HUB_CACHE"])}')
        .replace("jobs/pythia-sweep.toml", str(job_file))
        .replace("/tmp/js/out", str(out))
    )
    script = script.replace(
        "RAY_TEMP=$(mktemp -d /tmp/rayhead-XXXXXX)",
        'RAY_TEMP=$(mktemp -d /tmp/rayhead-XXXXXX); echo "head temp dir $RAY_TEMP"',
        1,
    )
    submit_start = script.index('"$VENV/bin/ray" job submit')
    submit_end = script.index(f"--out {out}") + len(f"--out {out}")
    submit = script[submit_start:submit_end]
    # Right after `ray start` the head may answer 'No available agent to submit job, please try again later'. While
    # the head is up, its processes and sockets are listed; then the same line is submitted again.
    script = (
        script[:submit_start] + f'for try in $(seq 10); do {submit} > "$RAY_TEMP/first.log" 2>&1; rc=$?; '
        'grep -q "No available agent" "$RAY_TEMP/first.log" || break; sleep 2; done; '
        'cat "$RAY_TEMP/first.log"; echo "first submit exit $rc"\n'
        f'pgrep -f -- "$RAY_TEMP" > {tmp_path}/head_pids; ss -tanpH > {tmp_path}/sockets\n'
        f'echo "second submit:"; {submit}; echo "second submit exit $?"' + script[submit_end:]
    )
    outside = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("VIRTUAL_ENV", "PYTHON", "RAY_", "COLUMNS", "LINES"))
    }
    outside.update(PATH="/usr/local/bin:/usr/bin:/bin", RAYGEOM=str(ROOT), HOME=str(tmp_path))
    # this session's own Ray (started by this process, so its GCS server and raylet are our children)
    import psutil

    others = [child.pid for child in psutil.Process().children(recursive=True) if is_ray_node(child.pid)]
    assert others
    temp = None
    try:
        done = subprocess.run(["bash", "-c", script], env=outside, capture_output=True, text=True, timeout=600, check=False)
        printed = done.stdout + done.stderr
        temp = re.search(r"head temp dir (/tmp/rayhead-\w+)", printed)
        first, _, second = printed.partition("second submit:")
        assert "first submit exit 0" in first and "succeeded" in first, printed[-4000:]
        assert f"{units} units, 0 already done" in " ".join(first.split()), first[-3000:]
        rows = [line for line in first.splitlines() if line.startswith("│")]  # the log is not a terminal: names whole
        assert rows and any("final_norm" in row for row in rows) and not any("…" in row for row in rows), first[-3000:]
        assert "second submit exit 0" in second and f"{units} already done, 0 to" in " ".join(second.split()), second[-3000:]
        assert tidy(out / "results" / "pga.parquet") == reference
        head = set((tmp_path / "head_pids").read_text().split())
        ours = [
            line.split() for line in (tmp_path / "sockets").read_text().splitlines() if any(f"pid={pid}," in line for pid in head)
        ]
        assert ours, "the head's processes should hold sockets"
        loopback = ("127.0.0.1:", "[::1]:", "[::ffff:127.0.0.1]:")
        assert all(
            fields[3].startswith(loopback) and (fields[0] == "LISTEN" or fields[4].startswith(loopback)) for fields in ours
        ), ours
        # the recipe's last lines stopped its head ...
        assert temp, printed[-2000:]
        deadline = time.time() + 30
        while processes_under(temp.group(1)) and time.time() < deadline:
            time.sleep(0.5)
        survivors = processes_under(temp.group(1))
        assert not survivors, [Path(f"/proc/{pid}/cmdline").read_bytes()[:300] for pid in survivors]
        # ... and nothing else: this session's own Ray is still up
        import ray

        assert ray.is_initialized() and ray.cluster_resources().get("CPU", 0) >= 1
        assert all(Path(f"/proc/{pid}").exists() for pid in others)
    finally:
        if temp:
            for pid in processes_under(temp.group(1)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            shutil.rmtree(temp.group(1), ignore_errors=True)
