"""`bench_sweep.py --hub`: a sweep of tiny Pythia revisions downloaded through the loopback hub (tests/hub.py) at a set
bandwidth, with downloads, extraction and PGA overlapping. It measures:

- download alone: every revision fetched (raygeom.sources.download, one at a time as the sweep does) into an empty cache;
- compute alone: the same sweep with every revision already in the cache (extraction and PGA, nothing to fetch);
- the sweep from an empty cache at that bandwidth: its wall time, and each stage's busy time in it (the union of the
  intervals in which some download, extraction or revision's PGA was under way);

and prints wall / slowest stage alone (1.0: the stages overlap perfectly; 2.0: they run one after the other).
``--bandwidth auto`` sets the link so that download alone takes about as long as compute alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPO = "EleutherAI/pythia-14m"


def _revisions(count: int) -> list[str]:
    return [f"step{1000 * i}" for i in range(count)]


def busy(intervals: list[tuple]) -> float:
    """Seconds covered by the union of the (start, end, ...) intervals."""
    total, end = 0.0, float("-inf")
    for start, stop, *_ in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def child(corpus: str, out: str, n: int, count: int, budget: int) -> None:
    """One sweep in this process (its own local Ray, online, HF cache and hub from the environment): JSON on stdout."""
    from raygeom.engine.ray_env import prepare_local_ray_environment

    prepare_local_ray_environment()
    from sweep_units import pga_units_for

    from raygeom.engine import orchestrate
    from raygeom.engine.weights import WeightsSettings
    from raygeom.params import PGAParams
    from raygeom.replica.extract import ExtractionSettings
    from raygeom.replica.request import ExtractionRequest
    from raygeom.sources.corpus import load_corpus
    from raygeom.sources.models import ModelSpec
    from raygeom.store.tree import Store

    orchestrate.start_ray()
    texts = load_corpus(corpus).sample(n, 0)
    settings = ExtractionSettings(seq_len=64, batch_size=16)
    items = [
        orchestrate.SweepItem(ExtractionRequest(ModelSpec(REPO, "hub", revision), texts, settings))
        for revision in _revisions(count)
    ]
    store = Store(out)
    stages: dict = {}
    start = time.monotonic()
    rows = orchestrate.run_sweep(
        store,
        items,
        pga_units_for(store, PGAParams(k=16, n_null=48, null_chunks=2, seed=0)),
        weights=WeightsSettings(budget),
        stages=stages,
    )
    wall = time.monotonic() - start
    timeline = [(name, label, began - start, end - start) for name, spans in stages.items() for began, end, label in spans]
    busy_times = {name: busy(spans) for name, spans in stages.items() if name != "replica_start"}
    starts = len(stages.get("replica_start", []))
    print(json.dumps({"wall": wall, "units": len(rows), "replica_starts": starts, "timeline": timeline, **busy_times}))


def print_timeline(timeline: list) -> None:
    """Per revision: when its download, extraction and PGA ran (seconds from the sweep's start); * a new replica."""
    rows: dict[str, dict] = {}
    for name, label, began, end in timeline:
        rows.setdefault(label.split("@")[-1], {})[name] = (began, end)
    print("  timeline of the sweep (s from its start; * = a new replica process started for it):")
    for revision, row in sorted(rows.items(), key=lambda item: min(v[0] for v in item[1].values())):
        spans = "  ".join(
            f"{name} {row[name][0]:5.1f}-{row[name][1]:5.1f}" if name in row else f"{name} {'-':>11}"
            for name in ("download", "extract", "analyse")
        )
        print(f"    {revision:>10}  {spans}{'  *' if 'replica_start' in row else ''}")


def _run_child(env: dict, corpus: Path, out: Path, n: int, count: int, budget: int) -> dict:
    result = subprocess.run(
        [sys.executable, str(Path(__file__)), "--child", str(corpus), str(out), str(n), str(count), str(budget)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if result.returncode != 0:
        sys.exit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def run(n_texts: int, count: int, bandwidth: str, hidden: int, layers: int) -> None:
    sys.path.insert(0, str(ROOT))
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="raygeom-bench-hub-") as folder:
        measured = _measure(Path(folder), n_texts, count, bandwidth, hidden, layers)
    _report(load_before, count, hidden, layers, n_texts, *measured)


def _measure(work: Path, n_texts: int, count: int, bandwidth: str, hidden: int, layers: int) -> tuple:
    from raygeom.testing import TINY_TEXT, write_tiny_pythia
    from tests.hub import LoopbackHub

    source = write_tiny_pythia(work / "source", REPO, _revisions(count), hidden_size=hidden, layers=layers)
    sentences = [s for s in TINY_TEXT.split(" . ") if s]
    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(f"{sentences[i % 5]} item {i} {sentences[(3 * i + 1) % 5]}" for i in range(n_texts)))
    with LoopbackHub() as hub:
        hub.add(source, REPO)
        size = max(hub.revision_bytes(REPO, r) for r in _revisions(count))
        total = sum(hub.revision_bytes(REPO, r) for r in _revisions(count))
        budget = 4 * size + 4096

        def env(home: Path) -> dict:
            return dict(
                os.environ,
                PYTHONPATH=str(ROOT),
                HF_HOME=str(home),
                HF_HUB_CACHE=str(home / "hub"),
                HF_HUB_OFFLINE="0",
                HF_ENDPOINT=hub.url,
                HF_HUB_DISABLE_PROGRESS_BARS="1",
            )

        # compute alone: every revision already cached (fetched at full speed first)
        warm = work / "warm"
        os.environ.update({k: v for k, v in env(warm).items() if k.startswith("HF_")})
        from raygeom.sources import download

        for revision in _revisions(count):
            download.fetch(REPO, revision)
        compute = _run_child(env(warm), corpus, work / "store-compute", n_texts, count, budget)
        rate = total / compute["wall"] if bandwidth == "auto" else float(bandwidth)
        hub.bandwidth = rate
        # download alone, one at a time as the sweep fetches
        os.environ.update({k: v for k, v in env(work / "cold-download").items() if k.startswith("HF_")})
        start = time.monotonic()
        for revision in _revisions(count):
            download.fetch(REPO, revision)
        download_alone = time.monotonic() - start
        # the sweep from an empty cache at that bandwidth
        sweep = _run_child(env(work / "cold"), corpus, work / "store-sweep", n_texts, count, budget)
    return size, total, rate, budget, download_alone, compute, sweep


def _report(load_before, count, hidden, layers, n_texts, size, total, rate, budget, download_alone, compute, sweep) -> None:
    slowest = max(download_alone, compute["wall"])
    print(f"load average (1 min) before the runs {load_before:.2f}, after {os.getloadavg()[0]:.2f}")
    print(
        f"hub sweep: {count} revisions of a tiny Pythia (d={hidden}, {layers} blocks, {size / 1e6:.2f} MB each, "
        f"{total / 1e6:.1f} MB in all), {n_texts} texts, link {rate / 1e6:.2f} MB/s, budget {budget / 1e6:.2f} MB"
    )
    print(f"  download alone: {download_alone:6.1f} s")
    print(
        f"  compute alone:  {compute['wall']:6.1f} s   (extraction busy {compute.get('extract', 0):.1f} s, "
        f"PGA busy {compute.get('pga', 0):.1f} s; {compute['replica_starts']} replica processes)"
    )
    print(
        f"  sweep:          {sweep['wall']:6.1f} s   (busy: download {sweep.get('download', 0):.1f} s, extraction "
        f"{sweep.get('extract', 0):.1f} s, PGA {sweep.get('pga', 0):.1f} s; {sweep['units']} units; "
        f"{sweep['replica_starts']} replica processes)"
    )
    print(
        f"  wall / slowest stage alone = {sweep['wall']:.1f} / {slowest:.1f} = {sweep['wall'] / slowest:.2f}   "
        f"(sum of the stages alone: {(download_alone + compute['wall']) / slowest:.2f})"
    )
    print_timeline(sweep["timeline"])


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    corpus_, out_, n_, count_, budget_ = sys.argv[2:7]
    child(corpus_, out_, int(n_), int(count_), int(budget_))
