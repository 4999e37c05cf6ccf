"""Sweep scaling and cost figures, on tiny offline Pythia models and this machine's CPUs.

    python bench/bench_sweep.py               # the same sweep with 1 and with 2 Ray workers, 3 runs each: speed-up
    python bench/bench_sweep.py --estimate    # measured PGA unit cost at N=2000 -> full-suite estimate

Each run is a fresh subprocess with its own local Ray (loopback), with worker processes warmed up
first (imports, one model build), so the time is the sweep itself. Runs alternate between 1 and 2
workers and the medians are compared. Results of all runs must be identical. With
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

ROOT = Path(__file__).resolve().parents[1]
REVISIONS = {"step0": 0, "step1000": 1, "step2000": 2, "step4000": 3}


def setup(directory: Path, n_texts: int) -> Path:
    from raygeom.testing import TINY_TEXT, write_tiny_pythia

    cache = directory / "hub"
    write_tiny_pythia(cache, "EleutherAI/pythia-14m", REVISIONS, hidden_size=128, layers=4)
    write_tiny_pythia(cache, "EleutherAI/pythia-31m", REVISIONS, hidden_size=192, layers=4)
    sentences = [s for s in TINY_TEXT.split(" . ") if s]
    corpus = directory / "corpus.txt"
    corpus.write_text("\n".join(f"{sentences[i % 5]} item {i} {sentences[(3 * i + 1) % 5]} {sentences[(7 * i + 2) % 5]}"
                                for i in range(n_texts)))
    return corpus


def child(workers: int, corpus: str, out: str, n: int) -> None:
    from raygeom.engine.ray_env import prepare_local_ray_environment

    prepare_local_ray_environment()
    import ray

    from raygeom.engine import orchestrate
    from raygeom.jobs.pipeline import pga_units_for
    from raygeom.replica.request import ExtractionRequest
    from raygeom.sources.corpus import load_corpus
    from raygeom.replica.extract import ExtractionSettings
    from raygeom.sources.models import resolve_model
    from raygeom.params import PGAParams
    from raygeom.store.tree import Store

    orchestrate.start_ray(num_cpus=workers)

    @ray.remote(num_cpus=1)
    def warm() -> int:
        """Pay each worker process's one-time costs (imports, first model build, first kernels) before timing:
        a sweep of 154 revisions amortises them, a benchmark of 8 would count them once per worker."""
        import numpy as np

        from raygeom.sources.models import load_model
        from raygeom.numerics import pga

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
        for revision in REVISIONS:
            request = ExtractionRequest(resolve_model(model, revision), texts, settings)
            items.append(orchestrate.SweepItem(request))
    params = PGAParams(k=16, n_null=48, null_chunks=2, seed=0)
    before, machine_before = _cpu_seconds(), _machine_busy_seconds()
    start = time.perf_counter()
    store = Store(out)
    replicas = int(os.environ.get("RAYGEOM_BENCH_REPLICAS", "0")) or None
    rows = orchestrate.run_sweep(store, items, pga_units_for(store, params), max_in_flight=replicas)
    seconds = time.perf_counter() - start
    after, machine = _cpu_seconds(), _machine_busy_seconds() - machine_before
    if os.environ.get("RAYGEOM_BENCH_TIMELINE"):
        ray.timeline(filename=f"{os.environ['RAYGEOM_BENCH_TIMELINE']}-{workers}.json")
    cpu = {kind: after.get(kind, 0.0) - before.get(kind, 0.0) for kind in after}
    print(json.dumps({"workers": workers, "seconds": seconds, "units": len(rows), "cpu": cpu, "machine": machine,
                      "z": sorted((r["model"], r["revision"], r["layer"], r["z"]) for r in rows)}))


def _machine_busy_seconds() -> float:
    """Busy CPU seconds of the whole machine (/proc/stat): every process of the sweep, whoever reaped it; on a quiet
    machine what else runs is noise next to it (the bench prints the load average)."""
    fields = [float(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _cpu_seconds() -> dict[str, float]:
    """CPU seconds of the live processes of the sweep: this driver, the Ray task workers (PGA units) and Ray's own
    processes. A stopped replica actor is gone by the end, and Ray does not reap it where ``children_*`` times would
    keep it, so the replicas are the machine's busy time (``_machine_busy_seconds``) less these."""
    import psutil

    me = psutil.Process()
    totals: dict[str, float] = {}
    for process in [me, *me.children(recursive=True)]:
        try:
            times, name = process.cpu_times(), process.name()
        except psutil.Error:
            continue
        kind = "driver" if process.pid == me.pid else "workers" if name.startswith("ray::") else "ray system"
        totals[kind] = totals.get(kind, 0.0) + times.user + times.system
    return totals


def speedup(n_texts: int, repeats: int) -> None:
    """Runs alternate 1, 2, 1, 2, ... so that slow spells of a shared host hit both configurations alike."""
    import statistics

    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        directory = Path(tmp)
        os.environ["HF_HUB_CACHE"] = str(directory / "hub")
        os.environ["HF_HUB_OFFLINE"] = "1"
        corpus = setup(directory, n_texts)
        env = dict(os.environ, PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
        seconds: dict[int, list[float]] = {1: [], 2: []}
        z: dict[int, list] = {}
        for repeat in range(repeats):
            for workers in (1, 2):
                out = directory / f"out{workers}-{repeat}"
                done = subprocess.run([sys.executable, __file__, "--child", str(workers), str(corpus), str(out), str(n_texts)],
                                      env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    sys.exit(f"benchmark run with {workers} workers failed:\n{done.stderr[-2000:]}")
                result = json.loads(done.stdout.strip().splitlines()[-1])
                seconds[workers].append(result["seconds"])
                if z.setdefault(workers, result["z"]) != result["z"]:
                    sys.exit(f"results differ between two runs with {workers} workers")
                cpu = result["cpu"]
                live = sum(cpu.values())
                print(f"run {repeat + 1}, {workers} Ray worker(s): {result['units']} units (8 revisions, N={n_texts}) in "
                      f"{result['seconds']:.1f} s; busy CPU-s of the machine {result['machine']:.1f} = PGA task workers "
                      f"{cpu.get('workers', 0):.1f} + replicas (start, load, extraction; stopped by the end) "
                      f"{max(0.0, result['machine'] - live):.1f} + driver {cpu.get('driver', 0):.1f} + Ray system "
                      f"{cpu.get('ray system', 0):.1f}; cores obtained {result['machine'] / result['seconds']:.2f}")
                shutil.rmtree(out)
        identical = z[1] == z[2]
        one, two = statistics.median(seconds[1]), statistics.median(seconds[2])
        print(f"median of {repeats}: 1 worker {one:.1f} s, 2 workers {two:.1f} s -> speed-up with 2 workers: {one / two:.2f}x "
              f"(expected >= 1.7x on 2 cores); best of {repeats}: {min(seconds[1]) / min(seconds[2]):.2f}x; "
              f"results identical: {identical}")
        print(f"load average at the end: {os.getloadavg()[0]:.1f} (other processes on this machine slow both runs)")
        if not identical:
            sys.exit("results differ between 1 and 2 workers")


def estimate() -> None:
    """Measure one PGA unit's cost at the full suite's N=2000, k=100, per rho, on one CPU thread."""
    import numpy as np
    import torch

    from raygeom.sources import revisions as pythia
    from raygeom.analyses import sweep
    from raygeom.numerics import pga

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
        print(f"PGA at N={n}, d={d}, k={k}: prepare {prepare:.2f} CPU-s, {rho:.3f} CPU-s per subspace rho "
              f"-> {unit[d]:.1f} CPU-s per unit of {n_null} nulls (1 thread)")
    widths = sorted(unit)

    def unit_seconds(d: int) -> float:
        return float(np.interp(d, widths, [unit[w] for w in widths]))

    # Forward passes: 2 FLOPs per parameter per token, on an A100 at an assumed 40% of its 312 TFLOPS (fp16)
    # for batches of 32 x 128 tokens. Loading: fp16 weights from local NVMe at an assumed 2 GB/s per replica.
    flops_per_second = 0.40 * 312e12
    result = sweep.full_suite_estimate(extract_rate_gpu=2 / flops_per_second, load_seconds_per_param=2 / 2e9,
                                       pga_unit_seconds=unit_seconds)
    print(f"full suite: {len(pythia.PYTHIA_SIZES)} sizes x {result['revisions_per_model']} revisions, {result['units']:,} units, "
          f"{result['total_params'] / 1e9:.2f}B parameters per revision set")
    print(f"  extraction: forward {result['forward_gpu_hours']:.1f} GPU-h + weight loading {result['load_gpu_hours']:.1f} GPU-h "
          f"= {result['extract_gpu_hours']:.1f} GPU-h -> {result['node_wall_hours']:.2f} h on one 8-GPU node")
    print(f"  PGA (N={n}, k={k}, {n_null} nulls, all layers): {result['pga_cpu_hours']:.0f} CPU-h at the measured rate "
          f"-> {result['pga_cpu_hours'] / 96:.1f} h on the 96 vCPUs of a p4de node")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=4, metavar=("WORKERS", "CORPUS", "OUT", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--estimate", action="store_true", help="measure PGA at N=2000 and estimate the full Pythia suite")
    parser.add_argument("--n-texts", type=int, default=240)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of each configuration; the median is reported")
    args = parser.parse_args()
    if args.child:
        workers, corpus, out, n = args.child
        child(int(workers), corpus, out, int(n))
    elif args.estimate:
        estimate()
    else:
        speedup(args.n_texts, args.repeats)


if __name__ == "__main__":
    main()
