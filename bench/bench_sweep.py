"""Sweep scaling and cost figures, on tiny offline Pythia models and this machine's CPUs.

    python bench/bench_sweep.py               # the same sweep with 1 and with 2 Ray workers, 3 runs each: speed-up
    python bench/bench_sweep.py --revisions 8 # 8 revisions per model instead of 4: the replicas' starts weigh less
    python bench/bench_sweep.py --estimate    # measured PGA unit cost at N=2000 -> full-suite estimate
    python bench/bench_sweep.py --hub         # downloads through the loopback hub overlapping extraction and PGA
                                              # (bench/hub_sweep.py): each stage alone, the sweep, wall / slowest stage

Each run is a fresh subprocess with its own local Ray (loopback), with worker processes warmed up
first (imports, one model build), so the time is the sweep itself. Runs alternate between 1 and 2
workers and the medians are compared. Results of all runs must be identical. Every process of the sweep is
accounted for (driver, PGA task workers, replica actors, Ray's own), and the bench prints where the time goes: how
much more work 2 workers did, in which processes, and what one replica's start costs. With
RAYGEOM_BENCH_TIMELINE=PREFIX each run also writes Ray's task timeline to PREFIX-<workers>.json; with
RAYGEOM_BENCH_REPLICAS=N at most N replicas run at once (the sweep's max_in_flight; default: as many as fit).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from markdown_section import section_if_asked  # --markdown

ROOT = Path(__file__).resolve().parents[1]


def revisions(per_model: int) -> dict[str, int]:
    """Real Pythia revision names (step0, step1000, step2000, ...), each its own weights."""
    return {f"step{1000 * index}": index for index in range(per_model)}


def setup(directory: Path, n_texts: int, per_model: int) -> Path:
    from raygeom.testing import TINY_TEXT, write_tiny_pythia

    cache = directory / "hub"
    write_tiny_pythia(cache, "EleutherAI/pythia-14m", revisions(per_model), hidden_size=128, layers=4)
    write_tiny_pythia(cache, "EleutherAI/pythia-31m", revisions(per_model), hidden_size=192, layers=4)
    sentences = [s for s in TINY_TEXT.split(" . ") if s]
    corpus = directory / "corpus.txt"
    corpus.write_text(
        "\n".join(
            f"{sentences[i % 5]} item {i} {sentences[(3 * i + 1) % 5]} {sentences[(7 * i + 2) % 5]}" for i in range(n_texts)
        )
    )
    return corpus


def child(workers: int, corpus: str, out: str, n: int, per_model: int) -> None:
    from raygeom.engine.ray_env import prepare_local_ray_environment

    prepare_local_ray_environment()
    import ray
    from sweep_units import pga_units_for

    from raygeom.engine import orchestrate
    from raygeom.params import PGAParams
    from raygeom.replica.extract import ExtractionSettings
    from raygeom.replica.request import ExtractionRequest
    from raygeom.sources.corpus import load_corpus
    from raygeom.sources.models import resolve_model
    from raygeom.store.tree import Store

    orchestrate.start_ray(num_cpus=workers)

    @ray.remote(num_cpus=1)
    def warm() -> int:
        """Pay each worker process's one-time costs (imports, first model build, first kernels) before timing:
        a sweep of 154 revisions amortises them, a benchmark of 8 would count them once per worker."""
        import numpy as np

        from raygeom.numerics import pga
        from raygeom.sources.models import load_model

        model, tokenizer = load_model(resolve_model("EleutherAI/pythia-14m", "step0"), device="cpu")
        model(**tokenizer(["warm up"], return_tensors="pt"))
        pga.null_rhos(pga.prepare_layer(np.random.default_rng(0).standard_normal((40, 16)), 1), 4, 0, range(2), "cpu")
        time.sleep(1.0)
        return os.getpid()

    ray.get([warm.remote() for _ in range(2 * workers)])
    texts = load_corpus(corpus).sample(n, 0)
    settings = ExtractionSettings(seq_len=64, batch_size=16)
    items = []
    for model in ("EleutherAI/pythia-14m", "EleutherAI/pythia-31m"):
        for revision in revisions(per_model):
            request = ExtractionRequest(resolve_model(model, revision), texts, settings)
            items.append(orchestrate.SweepItem(request))
    params = PGAParams(k=16, n_null=48, null_chunks=2, seed=0)
    sampler = ProcessSampler()
    machine_before = _machine_busy_seconds()
    start = time.perf_counter()
    store = Store(out)
    replicas = int(os.environ.get("RAYGEOM_BENCH_REPLICAS", "0")) or None
    rows = orchestrate.run_sweep(store, items, pga_units_for(store, params), max_in_flight=replicas)
    seconds = time.perf_counter() - start
    cpu, replicas = sampler.stop()
    machine = _machine_busy_seconds() - machine_before
    if os.environ.get("RAYGEOM_BENCH_TIMELINE"):
        ray.timeline(filename=f"{os.environ['RAYGEOM_BENCH_TIMELINE']}-{workers}.json")
    print(
        json.dumps(
            {
                "workers": workers,
                "seconds": seconds,
                "units": len(rows),
                "cpu": cpu,
                "machine": machine,
                "replicas": replicas,
                "z": sorted((r["model"], r["revision"], r["layer"], r["z"]) for r in rows),
            }
        )
    )


def _machine_busy_seconds() -> float:
    """Busy CPU seconds of the whole machine (/proc/stat): every process of the sweep, whoever reaped it; on a quiet
    machine what else runs is noise next to it (the bench prints the load average)."""
    fields = [float(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class ProcessSampler:
    """CPU seconds of every process of the sweep, by kind: this driver, Ray's task workers (PGA units), the replica
    actors and Ray's own processes. Replicas are stopped before the sweep ends and Ray does not reap them where
    ``children_*`` times would keep them, so a thread reads every descendant's times every ``every`` seconds and keeps
    each process's last reading: a replica's last ``every`` seconds before it stops are all that is missed."""

    def __init__(self, every: float = 0.2):
        import threading

        import psutil

        self.me, self.every = psutil.Process(), every
        self.first: dict[int, float] = {}  # pid -> CPU-s when first seen (0 for processes started during the sweep)
        self.last: dict[int, float] = {}
        self.kind: dict[int, str] = {}
        self._read(started=False)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self, started: bool = True) -> None:
        import psutil

        for process in [self.me, *self.me.children(recursive=True)]:
            try:
                with process.oneshot():
                    times, name = process.cpu_times(), process.name()
            except psutil.Error:
                continue
            pid, used = process.pid, times.user + times.system
            self.first.setdefault(pid, 0.0 if started else used)
            self.last[pid] = used
            kind = (
                "driver"
                if pid == self.me.pid
                else "replicas"
                if "Replica" in name
                else "workers"
                if name.startswith("ray::")
                else "ray system"
            )
            if self.kind.get(pid) != "replicas":  # an actor's process is named ray::IDLE until its class is set
                self.kind[pid] = kind

    def _run(self) -> None:
        while not self._done.wait(self.every):
            self._read()

    def stop(self) -> tuple[dict[str, float], list[float]]:
        self._done.set()
        self._thread.join()
        self._read()
        totals: dict[str, float] = {}
        for pid, used in self.last.items():
            totals[self.kind[pid]] = totals.get(self.kind[pid], 0.0) + used - self.first[pid]
        replicas = [self.last[pid] - self.first[pid] for pid in self.last if self.kind[pid] == "replicas"]
        return totals, replicas


START = """
import time
import ray, torch, transformers
from raygeom.sources.models import load_model, resolve_model
model, tokenizer = load_model(resolve_model("EleutherAI/pythia-14m", "step0"), device="cpu")
print(time.process_time())
"""


def replica_start_seconds(env: dict[str, str], times: int = 3) -> float:
    """CPU-s of what every new replica process pays before its first batch, measured alone in a fresh process: Ray's
    worker imports, torch, transformers and the first model build (its modeling modules import on first use).
    Ray starts each actor in a process of its own, so a second replica pays it again."""
    import statistics

    costs = []
    for _ in range(times):
        done = subprocess.run([sys.executable, "-c", START], env=env, capture_output=True, text=True, check=True)
        costs.append(float(done.stdout.strip().splitlines()[-1]))
    return statistics.median(costs)


def where_the_time_goes(seconds: dict[int, list[float]], busy: dict[int, list[dict[str, float]]], start_cost: float) -> None:
    """Speed-up = (work with 1 worker / cores it kept busy) / (work with 2 / cores busy): print both factors, medians
    over runs, and which processes did the extra work."""
    import statistics

    def median(workers: int, kind: str) -> float:
        return statistics.median(run.get(kind, 0.0) for run in busy[workers])

    cores = {w: statistics.median(run["machine"] / s for run, s in zip(busy[w], seconds[w])) for w in (1, 2)}
    work = {w: median(w, "machine") for w in (1, 2)}
    kinds = ("workers", "replicas", "driver", "ray system")
    names = {"workers": "PGA task workers", "replicas": "replicas", "driver": "driver", "ray system": "Ray system"}
    extra = ", ".join(f"{names[kind]} {median(2, kind) - median(1, kind):+.1f}" for kind in kinds)
    replicas = {w: median(w, "count") for w in (1, 2)}
    print(
        f"where the time goes (medians): busy CPU-s {work[1]:.1f} with 1 worker, {work[2]:.1f} with 2 ({extra}); "
        f"cores kept busy {cores[1]:.2f} and {cores[2]:.2f} of 2"
    )
    print(
        f"  replicas: {replicas[1]:.0f} with 1 worker, {replicas[2]:.0f} with 2; each new replica process pays {start_cost:.1f} CPU-s "
        f"before its first batch (Ray worker, torch and transformers imports, first model build; measured alone)"
    )
    print(
        f"  speed-up = ({work[1]:.1f} / {cores[1]:.2f}) / ({work[2]:.1f} / {cores[2]:.2f}); with 2 workers doing only the "
        f"work of 1 it would be {cores[2] / cores[1]:.2f}x: a longer sweep pays the extra starts once "
        f"(--revisions)"
    )


def speedup(n_texts: int, repeats: int, per_model: int) -> None:
    """Runs alternate 1, 2, 1, 2, ... so that slow spells of a shared host hit both configurations alike."""
    import statistics

    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        directory = Path(tmp)
        os.environ["HF_HUB_CACHE"] = str(directory / "hub")
        os.environ["HF_HUB_OFFLINE"] = "1"
        corpus = setup(directory, n_texts, per_model)
        env = dict(os.environ, PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
        seconds: dict[int, list[float]] = {1: [], 2: []}
        busy: dict[int, list[dict[str, float]]] = {1: [], 2: []}
        start_cost = replica_start_seconds(env)
        z: dict[int, list] = {}
        for repeat in range(repeats):
            for workers in (1, 2):
                out = directory / f"out{workers}-{repeat}"
                done = subprocess.run(
                    [sys.executable, __file__, "--child", str(workers), str(corpus), str(out), str(n_texts), str(per_model)],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if done.returncode != 0:
                    sys.exit(f"benchmark run with {workers} workers failed:\n{done.stderr[-2000:]}")
                result = json.loads(done.stdout.strip().splitlines()[-1])
                seconds[workers].append(result["seconds"])
                busy[workers].append({**result["cpu"], "machine": result["machine"], "count": len(result["replicas"])})
                if z.setdefault(workers, result["z"]) != result["z"]:
                    sys.exit(f"results differ between two runs with {workers} workers")
                cpu = result["cpu"]
                each = " + ".join(f"{value:.1f}" for value in result["replicas"])
                print(
                    f"run {repeat + 1}, {workers} Ray worker(s): {result['units']} units ({2 * per_model} revisions, N={n_texts}) in "
                    f"{result['seconds']:.1f} s; busy CPU-s of the machine {result['machine']:.1f} = PGA task workers "
                    f"{cpu.get('workers', 0):.1f} + {len(result['replicas'])} replica(s) (start, load, extraction) "
                    f"{cpu.get('replicas', 0):.1f} ({each}) + driver {cpu.get('driver', 0):.1f} + Ray system "
                    f"{cpu.get('ray system', 0):.1f} + the rest {result['machine'] - sum(cpu.values()):.1f}; "
                    f"cores obtained {result['machine'] / result['seconds']:.2f}"
                )
                shutil.rmtree(out)
        identical = z[1] == z[2]
        one, two = statistics.median(seconds[1]), statistics.median(seconds[2])
        print(
            f"median of {repeats}: 1 worker {one:.1f} s, 2 workers {two:.1f} s -> speed-up with 2 workers: {one / two:.2f}x "
            f"(expected >= 1.7x on 2 cores); best of {repeats}: {min(seconds[1]) / min(seconds[2]):.2f}x; "
            f"results identical: {identical}"
        )
        where_the_time_goes(seconds, busy, start_cost)
        print(f"load average at the end: {os.getloadavg()[0]:.1f} (other processes on this machine slow both runs)")
        if not identical:
            sys.exit("results differ between 1 and 2 workers")


def estimate() -> None:
    """Measure one PGA unit's cost at the full suite's N=2000, k=100, per rho, on one CPU thread."""
    import numpy as np
    import torch
    from sweep_units import full_suite_estimate

    from raygeom.numerics import pga
    from raygeom.sources import revisions as pythia

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    n, k, n_null, timed = 2000, 100, 100, 4
    unit = {}
    for d in (128, 512, 2048, 5120):
        h = rng.standard_normal((n, d)).astype(np.float32)
        # CPU time of this process, not wall time: other load on the machine must not inflate the rate.
        start = time.process_time()
        layer = pga.prepare_layer(h, 1)
        prepare = time.process_time() - start
        start = time.process_time()
        pga.null_rhos(layer, k, 0, range(timed), "cpu")
        rho = (time.process_time() - start) / timed
        unit[d] = prepare + (n_null + 1) * rho
        print(
            f"PGA at N={n}, d={d}, k={k}: prepare {prepare:.2f} CPU-s, {rho:.3f} CPU-s per subspace rho "
            f"-> {unit[d]:.1f} CPU-s per unit of {n_null} nulls (1 thread)"
        )
    widths = sorted(unit)

    def unit_seconds(d: int) -> float:
        return float(np.interp(d, widths, [unit[w] for w in widths]))

    # Forward passes: 2 FLOPs per parameter per token, on an A100 at an assumed 40% of its 312 TFLOPS (fp16)
    # for batches of 32 x 128 tokens. Loading: fp16 weights from local NVMe at an assumed 2 GB/s per replica.
    flops_per_second = 0.40 * 312e12
    result = full_suite_estimate(
        extract_rate_gpu=2 / flops_per_second, load_seconds_per_param=2 / 2e9, pga_unit_seconds=unit_seconds
    )
    print(
        f"full suite: {len(pythia.PYTHIA_SIZES)} sizes x {result['revisions_per_model']} revisions, {result['units']:,} units, "
        f"{result['total_params'] / 1e9:.2f}B parameters per revision set"
    )
    print(
        f"  extraction: forward {result['forward_gpu_hours']:.1f} GPU-h + weight loading {result['load_gpu_hours']:.1f} GPU-h "
        f"= {result['extract_gpu_hours']:.1f} GPU-h -> {result['node_wall_hours']:.2f} h on one 8-GPU node"
    )
    print(
        f"  PGA (N={n}, k={k}, {n_null} nulls, all layers): {result['pga_cpu_hours']:.0f} CPU-h at the measured rate "
        f"-> {result['pga_cpu_hours'] / 96:.1f} h on the 96 vCPUs of a p4de node"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=5, metavar=("WORKERS", "CORPUS", "OUT", "N", "REVISIONS"), help=argparse.SUPPRESS)
    parser.add_argument("--estimate", action="store_true", help="measure PGA at N=2000 and estimate the full Pythia suite")
    parser.add_argument("--n-texts", type=int, default=240)
    parser.add_argument(
        "--revisions",
        type=int,
        default=4,
        help="revisions per model (2 models); a replica's start is paid "
        "once per replica, so more revisions show how a long sweep scales",
    )
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of each configuration; the median is reported")
    parser.add_argument("--hub", action="store_true", help="a sweep downloading its revisions through the loopback hub")
    parser.add_argument(
        "--bandwidth",
        default="auto",
        help="--hub: the link's bytes per second, or auto (download alone takes as long as compute alone)",
    )
    args = parser.parse_args()
    if args.child:
        workers, corpus, out, n, per_model = args.child
        child(int(workers), corpus, out, int(n), int(per_model))
    elif args.estimate:
        estimate()
    elif args.hub:
        sys.path.insert(0, str(Path(__file__).parent))
        import hub_sweep

        hub_sweep.run(args.n_texts, max(args.revisions, 8), args.bandwidth, hidden=128, layers=4)
    else:
        if args.revisions < 1:
            sys.exit("--revisions must be at least 1")
        speedup(args.n_texts, args.repeats, args.revisions)


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # each figure as it is measured, also into a pipe or a log
    with section_if_asked(__file__):
        main()
