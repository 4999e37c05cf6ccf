"""Subspace PGA for one layer: raygeom's fast path against the naive scipy loop, side by side.

    python bench/bench_pga.py            # N=2000, d=2048, k=100, 100 nulls, plus N=10,000 peak memory
    python bench/bench_pga.py --quick    # N=600, for a smoke run

The naive loop is what a careful user would write from the paper: pdist of the
corrected H once, then for the readout and each null subspace pdist of the
projection and scipy.stats.spearmanr. Both use the same CCR-corrected H, whose
cost (identical code) is timed separately. The readout basis is per model, not
per layer, so it is excluded from both.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from scipy.spatial.distance import pdist
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from markdown_section import section_if_asked  # --markdown

from raygeom.numerics import pga  # noqa: E402


def synthetic_layer(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """An anisotropic layer with cluster structure partly inside the readout subspace."""
    rng = np.random.default_rng(seed)
    w_u = rng.standard_normal((4096, d)).astype(np.float32)
    w_u[:, :64] *= 4.0
    centres = rng.standard_normal((20, d)) * np.linspace(3.0, 0.2, d)
    h = centres[rng.integers(0, 20, n)] + rng.standard_normal((n, d)) * np.linspace(2.0, 0.5, d)
    h[:, 0] += 40.0 * rng.standard_normal(n)  # a dominant direction, as CCR-1 expects
    return h.astype(np.float32), w_u


def naive_pga(corrected: np.ndarray, basis: np.ndarray, k: int, n_null: int, seed: int) -> float:
    d_full = pdist(corrected, "cosine")
    rho = spearmanr(d_full, pdist(corrected @ basis, "cosine"))[0]
    nulls = np.array(
        [
            spearmanr(d_full, pdist(corrected @ pga.random_subspace(corrected.shape[1], k, seed, i), "cosine"))[0]
            for i in range(n_null)
        ]
    )
    return (rho - nulls.mean()) / nulls.std(ddof=1)


def fast_pga_in_process(corrected: np.ndarray, basis: np.ndarray, k: int, n_null: int, seed: int) -> float:
    # r=0 on an already CCR-1 corrected H only re-centres it (a no-op), so both paths start from the same matrix.
    return pga.subspace_pga(corrected, readout=basis, k=k, r=0, n_null=n_null, seed=seed).z


def fast_pga_on_ray(corrected: np.ndarray, basis: np.ndarray, k: int, n_null: int, seed: int, chunks: int) -> float:
    """The production shape: the layer is prepared once, shared by reference, nulls fan out in chunks."""
    import ray

    readout_task = ray.remote(pga.subspace_rho)
    null_task = ray.remote(pga.null_rhos)
    layer_ref = ray.put(pga.prepare_layer(corrected, 0))
    readout = readout_task.remote(layer_ref, basis, "cpu")
    parts = [null_task.remote(layer_ref, k, seed, list(map(int, c)), "cpu") for c in np.array_split(np.arange(n_null), chunks)]
    return pga.summarize_null(ray.get(readout), np.concatenate(ray.get(parts)))["z"]


def timed(function, *args):
    start = time.perf_counter()
    value = function(*args)
    return value, time.perf_counter() - start


def peak_memory_child(n: int, d: int, k: int) -> None:
    h, w_u = synthetic_layer(n, d, seed=1)
    basis, _ = pga.readout_basis(w_u, k)
    del w_u
    pga.subspace_pga(h, readout=basis, k=k, r=1, n_null=3, seed=0)
    print(json.dumps({"max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--d", type=int, default=2048)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--n-null", type=int, default=100)
    parser.add_argument("--memory-n", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.n, args.memory_n = 600, 2000
    if args.memory_child:
        peak_memory_child(args.memory_n, args.d, args.k)
        return

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(
        f"Subspace PGA, one layer: N={args.n}, d={args.d}, k={args.k}, {args.n_null} nulls, CCR-1; "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}, device {device}"
    )
    h, w_u = synthetic_layer(args.n, args.d)
    basis, _ = pga.readout_basis(w_u, args.k)
    corrected, t_ccr = timed(pga.ccr, h, 1)
    n_pairs = args.n * (args.n - 1) // 2
    print(f"shared CCR-1 correction: {t_ccr:.2f} s (same code for both; done once, excluded from both timings)")

    z_naive, t_naive = timed(naive_pga, corrected, basis, args.k, args.n_null, 0)
    print(f"naive scipy loop (pdist + spearmanr per subspace): {t_naive:8.2f} s   z = {z_naive:+.4f}")

    z_fast, t_fast = timed(fast_pga_in_process, corrected, basis, args.k, args.n_null, 0)
    print(
        f"raygeom, one process ({device}):                 {t_fast:8.2f} s   z = {z_fast:+.4f}   "
        f"x{t_naive / t_fast:.1f}   |dz| = {abs(z_fast - z_naive):.4f}"
    )

    from raygeom.engine.ray_env import prepare_local_ray_environment

    prepare_local_ray_environment()
    import ray

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    chunks = max(2, os.cpu_count())
    fast_pga_on_ray(corrected[:50], basis, args.k, 4, 0, 2)  # warm the workers
    z_ray, t_ray = timed(fast_pga_on_ray, corrected, basis, args.k, args.n_null, 0, chunks)
    print(
        f"raygeom, Ray fan-out ({chunks} tasks on {os.cpu_count()} CPUs):       {t_ray:8.2f} s   z = {z_ray:+.4f}   "
        f"x{t_naive / t_ray:.1f}   |dz| = {abs(z_ray - z_naive):.4f}"
    )
    ray.shutdown()

    values = np.random.default_rng(0).random(n_pairs).astype(np.float32)
    start = time.perf_counter()
    for _ in range(args.n_null + 1):
        np.argsort(values)
    t_floor = time.perf_counter() - start
    print(
        f"sort floor: {args.n_null + 1} argsorts of {n_pairs:,} float32 pairs: {t_floor:.2f} s "
        f"(best raygeom path is {min(t_fast, t_ray) / t_floor:.2f}x the floor; it ranks by counting, not sorting)"
    )

    child = subprocess.run(
        [sys.executable, __file__, "--memory-child", "--memory-n", str(args.memory_n), "--d", str(args.d), "--k", str(args.k)],
        capture_output=True,
        text=True,
        check=True,
    )
    rss = json.loads(child.stdout.strip().splitlines()[-1])["max_rss_gib"]
    print(f"peak memory, N={args.memory_n:,} (prepare + 3 nulls, whole process): {rss:.2f} GiB")
    best = max(t_naive / t_fast, t_naive / t_ray)
    print(
        f"SUMMARY speed-up x{best:.1f} (target >= 30), |dz| <= {max(abs(z_fast - z_naive), abs(z_ray - z_naive)):.4f} "
        f"(target <= 0.05), peak {rss:.2f} GiB at N={args.memory_n:,} (target < 8)"
    )


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # each figure as it is measured, also into a pipe or a log
    with section_if_asked(__file__):
        main()
