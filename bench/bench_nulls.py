"""How many nulls `--n-null auto` spends, and what it decides, under the old rule and the new, side by side.

    make models && python bench/bench_nulls.py      # SmolLM2-135M and Gemma-3-270M, 400 texts (the issue's scale)
    python bench/bench_nulls.py --models smollm2 --n-texts 120 --ref-nulls 1000 --coverage-seeds 20   # smaller

On real layers of the built-in models (extracted through raygeom's own API, `raygeom.load_builtin` and
`raygeom.layer_activations`, BBC texts cut to 64 words, last-token pooling, CCR-1, k=100), for every layer:

- the **old rule** stops at a 95 % half-width of z <= 0.25 (`--z-rel-width 0`); the **new rule** at
  <= max(0.25, 0.05 |z|) (the default), both checked at blocks of 100 nulls on the same seeded draws
  (`raygeom.numerics.uncertainty.auto_null_count`). Where the old rule needs more than `--old-cap`
  draws, its count is extrapolated from the half-width reached, n (h / 0.25)^2, and marked `~`;
  the **new rule + decide** is the default of today's CLI: the new rule and, below `--decide` (500) nulls, on
  while z's interval holds 0, -2 or 2 (`--n-null-decide`);
- nulls and CPU time: each rule's count times the layer's measured CPU seconds per null;
- decisions (sign of z, |z| > 2, collapse zone as `raygeom.report.pga_sweep.collapse_zones` decides it on the
  intervals, and each model's lowest layer) of `--replicates` independent runs of the new rule with and without
  the decision clause (and of the old rule's run on seed 0), against a reference run of `--ref-nulls` nulls on a
  seed of its own; and what <= 1 % differing decisions would cost a rule that knew every z (`decision_floor`);
- the stored N = 400 run of docs/results/pga: each rule's expected need from the stored z, and each rule
  simulated 300 times around the stored z (normal model) for its nulls and differing decisions;
- coverage: `--coverage-seeds` independent runs of 100 nulls on 3 layers (|z| smallest, nearest 10, largest)
  against a truth of `--truth-nulls` nulls: how often z_lo <= truth <= z_hi, for the interval with z's
  jackknife bias term (today's) and without it (the bootstrap SE alone, before).

Activations are cached in .cache/bench_nulls/ (gitignored) and reruns skip extraction; null draws are cached
there too, so a rerun at the same scale only reprints.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
from markdown_section import section_if_asked  # --markdown

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "bench_nulls"
K, R, BLOCK = 100, 1, 100
REF_SEED, COVERAGE_SEED = 10_000, 20_000


def extract(model_name: str, n_texts: int, max_words: int) -> dict:
    """Every layer (N x d, float32) and the readout basis (d x K) of one built-in model, cached as .npz."""
    path = CACHE / f"{model_name}_n{n_texts}_w{max_words}.npz"
    if path.is_file():
        data = np.load(path)
        return {
            "layers": {k[6:]: data[k] for k in data.files if k.startswith("layer_")},
            "basis": data["basis"],
            "seconds": float(data["seconds"]),
        }
    import raygeom
    from raygeom.numerics import pga
    from raygeom.replica.extract import ExtractionSettings

    start = time.perf_counter()
    model, tokenizer = raygeom.load_builtin(model_name)
    texts, _ = raygeom.load_texts("bbc", n=n_texts, seed=0)
    texts = [" ".join(t.split()[:max_words]) for t in texts]
    layers, _ = raygeom.layer_activations(model, tokenizer, texts, ExtractionSettings(seq_len=128, pool="last"), nll=False)
    basis, _ = pga.readout_basis(raygeom.unembedding_matrix(model), K)
    seconds = time.perf_counter() - start
    CACHE.mkdir(parents=True, exist_ok=True)
    np.savez(path, basis=basis, seconds=seconds, **{f"layer_{k}": v.astype(np.float32) for k, v in layers.items()})
    return {"layers": {k: v.astype(np.float32) for k, v in layers.items()}, "basis": basis, "seconds": seconds}


class Draws:
    """Seeded null rhos of one layer (null i of seed s depends on (s, i) alone), drawn on demand and cached."""

    def __init__(self, path: Path, h: np.ndarray, basis: np.ndarray):
        from raygeom.numerics import pga

        self.path, self.h, self.basis = path, h, basis
        self.cache = dict(np.load(path)) if path.is_file() else {}
        self.layer = None
        self.seconds = float(self.cache.get("seconds", 0.0))
        self.session = 0.0  # CPU-s of the draws made by this run
        self.drawn = int(self.cache.get("drawn", 0))
        if "rho" not in self.cache:
            self.layer = pga.prepare_layer(h, R)
            self.cache["rho"] = np.array(pga.subspace_rho(self.layer, basis[:, :K]))
        self.rho = float(self.cache["rho"])

    def get(self, seed: int, n: int) -> np.ndarray:
        from raygeom.numerics import pga

        name = f"s{seed}"
        have = self.cache.get(name, np.empty(0))
        if have.size < n:
            if self.layer is None:
                self.layer = pga.prepare_layer(self.h, R)
            start = time.process_time()
            more = pga.null_rhos(self.layer, K, seed, range(have.size, n))
            self.seconds += time.process_time() - start
            self.session += time.process_time() - start
            self.drawn += more.size
            self.cache[name] = have = np.concatenate([have, more])
        return have[:n]

    def seconds_per_null(self, count: int = 30) -> float:
        """CPU-seconds of one null of this layer, timed afresh on ``count`` nulls of a seed no rule uses (process
        time, so other load on the machine does not count; on one free core it is the wall time too)."""
        from raygeom.numerics import pga

        if self.layer is None:
            self.layer = pga.prepare_layer(self.h, R)
        pga.null_rhos(self.layer, K, 999_999, range(2))  # warm
        start = time.process_time()
        pga.null_rhos(self.layer, K, 999_999, range(count))
        return (time.process_time() - start) / count

    def save(self) -> None:
        np.savez(self.path, **{**self.cache, "seconds": self.seconds, "drawn": self.drawn})


def run_rule(draws: Draws, seed: int, relative: float | None, cap: int, decide: int = 0) -> tuple[int, np.ndarray, bool]:
    """(count, nulls, reached) of `--n-null auto` on seed ``seed``: the rule checked at each block end in turn, as
    `auto_null_count` checks it (the first end where `null_target_reached` holds, or ``cap``); ``reached``: the
    half-width target met, not just the cap."""
    from raygeom.numerics.uncertainty import null_target_reached

    n = BLOCK
    while True:
        nulls = draws.get(seed, min(n, cap))
        if null_target_reached(draws.rho, nulls, 0.25, cap=cap, seed=seed, relative_target=relative, decide_cap=decide):
            reached = nulls.size < cap or null_target_reached(
                draws.rho, nulls, 0.25, cap=10**9, seed=seed, relative_target=relative
            )
            return nulls.size, nulls, reached
        n += BLOCK


def row(model: str, layer: str, names: list[str], rho: float, nulls: np.ndarray, seed: int) -> dict:
    from raygeom.numerics.uncertainty import z_uncertainty

    u = z_uncertainty(rho, nulls, seed=seed)
    index = names.index(layer)
    return {
        "model": model,
        "revision": "main",
        "step": None,
        "layer": layer,
        "layer_index": index,
        "relative_depth": index / (len(names) - 1),
        "n_null": nulls.size,
        **u,
    }


def _zones(rows: list[dict]) -> set[tuple[str, str]]:
    from raygeom.report.pga_sweep import collapse_zones

    return {(z["model"], layer) for z in collapse_zones(rows) for layer in z["zone_layers"].split(",") if layer}


def _at(r: dict, end: str) -> dict:
    """The row as if its z were known exactly at one end of its interval."""
    return {**r, "z": r[end], "z_lo": r[end], "z_hi": r[end]}


def decisions(rows: list[dict]) -> dict[tuple, tuple[object, bool]]:
    """Every decision a reader takes from one run, with whether the run's own 95 % interval backs it: per layer the
    sign and |z| > 2 (backed when the interval excludes 0, or -2 and 2), the collapse zone as
    `raygeom.report.pga_sweep.collapse_zones` decides it on the intervals (backed when every z inside the intervals
    gives the same answer: a late layer's zone membership grows as its own z falls and as the early layers' z rise, so
    the two extreme corners decide it); per model the lowest layer (backed when its interval lies below every other
    layer's)."""
    zones = _zones(rows)
    widest = _zones([_at(r, "z_lo" if r["relative_depth"] > 0.5 else "z_hi") for r in rows])  # most in a zone
    narrowest = _zones([_at(r, "z_hi" if r["relative_depth"] > 0.5 else "z_lo") for r in rows])  # fewest
    out = {}
    for r in rows:
        lo, hi, key = r["z_lo"], r["z_hi"], (r["model"], r["layer"])
        out[(*key, "sign")] = (r["z"] > 0, lo > 0 or hi < 0)
        out[(*key, "|z|>2")] = (abs(r["z"]) > 2, lo > 2 or hi < -2 or (lo > -2 and hi < 2))
        out[(*key, "collapse zone")] = (key in zones, (key in widest) == (key in narrowest))
    for model in {r["model"] for r in rows}:
        group = [r for r in rows if r["model"] == model]
        low = min(group, key=lambda r: r["z"])
        out[(model, "lowest layer")] = (low["layer"], all(low["z_hi"] < r["z_lo"] for r in group if r is not low))
    return out


def compare(got: dict, reference: dict, kinds: list[str]) -> tuple[list[str], int, int, int, int]:
    """Per kind 'differing/compared (backed by the run's own interval)', and the totals: differing, differing and
    backed, compared, backed (whether or not they differ)."""
    cells, differ, wrong, total, decided = [], 0, 0, 0, 0
    for kind in kinds:
        keys = [key for key in reference if key[-1] == kind]
        bad = [key for key in keys if got[key][0] != reference[key][0]]
        sure = sum(got[key][1] for key in bad)
        differ, wrong, total = differ + len(bad), wrong + sure, total + len(keys)
        decided += sum(got[key][1] for key in keys)
        cells.append(f"{len(bad)}/{len(keys)} ({sure})")
    return cells, differ, wrong, total, decided


def expected_differences(rows: list[dict], counts: np.ndarray, per_null_sd: np.ndarray, zones: set | None = None) -> np.ndarray:
    """Per layer, the expected number of its decisions (sign, |z| > 2, collapse-zone membership; the model's lowest
    layer on that layer's row) that a run of ``counts`` nulls takes differently from ``rows``, the reference, whose
    z is taken as true. z of a run is normal around it with sd ``per_null_sd / sqrt(count)`` (the normal model the
    intervals use); the zone is decided on intervals, as `collapse_zones` decides it: a reference zone layer is kept
    only while its own interval stays below 0 and an early layer's stays above 2."""
    from scipy.stats import norm

    q = 1.959964
    z = np.array([r["z"] for r in rows])
    sd = per_null_sd / np.sqrt(counts)
    zones = _zones(rows) if zones is None else zones
    out = norm.cdf(-np.abs(z) / sd) + norm.cdf(-np.abs(np.abs(z) - 2) / sd)
    for model in dict.fromkeys(r["model"] for r in rows):
        index = [i for i, r in enumerate(rows) if r["model"] == model]
        early = [i for i in index if 0 < rows[i]["relative_depth"] <= 0.5]
        backed_early = max((norm.cdf((z[i] - 2) / sd[i] - q) for i in early), default=0.0)
        for i in index:
            if (model, rows[i]["layer"]) in zones:
                out[i] += 1 - norm.cdf(-z[i] / sd[i] - q) * backed_early
        low = sorted(index, key=lambda i: z[i])[:2]
        if len(low) == 2:
            out[low[0]] += norm.cdf(-(z[low[1]] - z[low[0]]) / np.hypot(sd[low[0]], sd[low[1]]))
    return out


def decision_floor(
    rows: list[dict], start: np.ndarray, per_null_sd: np.ndarray, allowed: float, cap: int = 200_000
) -> np.ndarray:
    """The fewest nulls per layer, in blocks of BLOCK, from ``start`` up, at which the expected differing
    decisions (:func:`expected_differences`) fall to ``allowed``: blocks go, one at a time, where they remove the
    most expected differences. A rule that knew every layer's z could do no better; one that must find out does
    worse."""
    counts, zones = start.astype(float).copy(), _zones(rows)
    current = expected_differences(rows, counts, per_null_sd, zones)
    while current.sum() > allowed and counts.sum() < cap * len(rows):
        gains = np.empty(len(rows))
        for i in range(len(rows)):
            trial = counts.copy()
            trial[i] += BLOCK
            gains[i] = current.sum() - expected_differences(rows, trial, per_null_sd, zones).sum()
        counts[int(np.argmax(gains))] += BLOCK
        current = expected_differences(rows, counts, per_null_sd, zones)
    return counts


STORED = Path(__file__).resolve().parents[1] / "docs" / "results" / "pga" / "diagnostics_pga.parquet"


def stored_run_table() -> None:
    """The issue's scale without drawing a null: the stored run of docs/results/pga (N = 400, CCR-1, both models,
    --n-null auto at 0.25 with the cap at 40,000: 69,200 nulls measured) against what each rule needs from each
    layer's stored z and its null's measured (z_se / delta-method se)^2 (`expected_auto_nulls`)."""
    import pyarrow.parquet as pq

    from raygeom.numerics.uncertainty import expected_auto_nulls

    if not STORED.is_file():
        return
    rows = [r for r in pq.read_table(STORED).to_pylist() if r["r"] == 1]
    print(
        f"\nThe stored N = 400 run ({STORED.relative_to(STORED.parents[3])}, old rule, cap 40,000): nulls measured, "
        "and each rule's need from the stored z x the null's measured (z_se / delta se)^2"
    )
    print(f"{'model':<16}{'layers':>7}{'measured (old)':>16}{'need old':>10}{'need new':>10}{'new, cap 1000':>15}{'ratio':>7}")
    totals = np.zeros(4)
    new_counts = []
    for model in dict.fromkeys(r["model"] for r in rows):
        group = [r for r in rows if r["model"] == model]
        z = np.array([r["z"] for r in group])
        n = np.array([r["n_null"] for r in group], dtype=float)
        inflation = (np.array([r["z_se"] for r in group]) / np.sqrt((1 + z * z / 2) / n)) ** 2
        old = expected_auto_nulls(z, 0.25, None, cap=40_000, inflation=inflation).sum()
        new = expected_auto_nulls(z, 0.25, 0.05, cap=40_000, inflation=inflation).sum()
        capped = expected_auto_nulls(z, 0.25, 0.05, cap=1000, inflation=inflation)
        new_counts.append(capped)
        capped = capped.sum()
        totals += [n.sum(), old, new, capped]
        print(
            f"{model:<16}{len(group):>7}{int(n.sum()):>16,}{int(old):>10,}{int(new):>10,}{int(capped):>15,}"
            f"{n.sum() / capped:>7.1f}"
        )
    print(
        f"{'all':<16}{len(rows):>7}{int(totals[0]):>16,}{int(totals[1]):>10,}{int(totals[2]):>10,}{int(totals[3]):>15,}"
        f"{totals[0] / totals[3]:>7.1f}"
    )
    for r in rows:
        r["revision"] = "main"
    print_decision_cost(rows, np.concatenate(new_counts), int(totals[0]), "the stored z", "the old rule's measured")
    per_null_sd = np.array([r["z_se"] * np.sqrt(r["n_null"]) for r in rows])
    print(
        f"Each rule run {SIMULATED_RUNS} times on the stored layers (z of a run normal around the stored z, with its "
        "per-null sd, its path over blocks a random walk; old rule capped at 40,000, the others at 1,000):"
    )
    for label, relative, decide, cap in (
        ("old rule", None, 0, 40_000),
        ("new rule", 0.05, 0, 1000),
        ("new + decide 500", 0.05, 500, 1000),
        ("new + decide 1000", 0.05, 1000, 1000),
    ):
        nulls, differ, at_most_one = simulate_rule(rows, per_null_sd, relative, decide, cap)
        print(
            f"  {label:<18} {nulls:>9,.0f} nulls ({int(totals[0]) / nulls:.1f}x fewer than the measured "
            f"{int(totals[0]):,}); differing decisions {differ:.2f} of {3 * len(rows) + 2} "
            f"({100 * differ / (3 * len(rows) + 2):.1f} %), a run with <= 1 of them: {100 * at_most_one:.0f} %"
        )


SIMULATED_RUNS = 300


def simulate_rule(
    rows: list[dict],
    per_null_sd: np.ndarray,
    relative: float | None,
    decide: int,
    cap: int,
    runs: int = SIMULATED_RUNS,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(mean nulls, mean differing decisions, share of runs with at most one) of ``runs`` simulated runs of the rule
    (half-width <= max(0.25, relative |z|); below ``decide`` nulls also while the interval holds 0, -2 or 2; at most
    ``cap``) on layers whose true z are the rows' z: a run's z after n nulls is z + sd B(n) / n, B a random walk
    (the mean of n independent errors), its half-width 1.96 sd / sqrt(n); decisions against the rows' own."""
    rng = np.random.default_rng(seed)
    z = np.array([r["z"] for r in rows])
    n = BLOCK * np.arange(1, cap // BLOCK + 1)
    reference = decisions([{**r, "z_lo": r["z"], "z_hi": r["z"]} for r in rows])
    totals, differing = [], []
    for _ in range(runs):
        walk = np.cumsum(rng.standard_normal((len(z), n.size)) * np.sqrt(BLOCK), axis=1)
        z_run = z[:, None] + per_null_sd[:, None] * walk / n
        half = 1.959964 * per_null_sd[:, None] / np.sqrt(n)
        target = 0.25 if relative is None else np.maximum(0.25, relative * np.abs(z_run))
        open_ = np.zeros(z_run.shape, dtype=bool)
        for threshold in (-2.0, 0.0, 2.0):
            open_ |= (z_run - half <= threshold) & (threshold <= z_run + half)
        stop = (half <= target) & ~(open_ & (n < decide))
        stop[:, -1] = True
        at = stop.argmax(axis=1)
        i = np.arange(len(z))
        got = decisions(
            [
                {**r, "z": z_run[j, at[j]], "z_lo": z_run[j, at[j]] - half[j, at[j]], "z_hi": z_run[j, at[j]] + half[j, at[j]]}
                for j, r in zip(i, rows)
            ]
        )
        differing.append(sum(got[key][0] != reference[key][0] for key in reference))
        totals.append(n[at].sum())
    return float(np.mean(totals)), float(np.mean(differing)), float(np.mean(np.array(differing) <= 1))


def print_decision_cost(rows: list[dict], new_counts: np.ndarray, old_total: int, truth: str, old: str) -> None:
    """What <= 1 % differing decisions costs: expected differences at the new rule's counts, and the floor of
    :func:`decision_floor`, taking ``truth`` (the rows' z, with their per-null sd) as the true z."""
    per_null_sd = np.array([r["z_se"] * np.sqrt(r["n_null"]) for r in rows])
    n_decisions = 3 * len(rows) + len({r["model"] for r in rows})
    floor = decision_floor(rows, new_counts, per_null_sd, 0.01 * n_decisions)
    close = [f"{r['model']}/{r['layer']} z={r['z']:+.2f} +{int(e):,}" for r, e in zip(rows, floor - new_counts) if e > 0]
    print(
        f"Decisions (sign, |z|>2, collapse zone, lowest layer: {n_decisions}), {truth} taken as true, z of a run normal "
        "around it (the intervals' model):\n"
        f"  expected differing at the new rule's counts: {expected_differences(rows, new_counts, per_null_sd).sum():.1f} "
        f"({int(new_counts.sum()):,} nulls)\n"
        f"  a rule that knew every z, drawing only where decisions are close, for <= 1 %: {int(floor.sum()):,} nulls "
        f"({expected_differences(rows, floor, per_null_sd).sum():.2f} expected), {old_total / floor.sum():.1f}x fewer "
        f"than {old} {old_total:,}\n"
        f"  its extra draws over the new rule: {'; '.join(close) or 'none'}"
    )


def layer_draws(model: str, layer: str, n_texts: int, max_words: int, data: dict) -> Draws:
    return Draws(CACHE / f"draws_{model}_n{n_texts}_w{max_words}_{layer}.npz", data["layers"][layer], data["basis"])


def run_layer(model: str, layer: str, args: dict) -> tuple[dict, dict, float]:
    """One layer's reference, new-rule replicates and old-rule run (a process of its own with --jobs > 1): its
    per-layer record, its rows per run, and the CPU-s of the draws it made."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    data = extract(model, args["n_texts"], args["max_words"])
    names = list(data["layers"])
    d = layer_draws(model, layer, args["n_texts"], args["max_words"], data)
    rows = {("ref", 0): row(model, layer, names, d.rho, d.get(REF_SEED, args["ref_nulls"]), REF_SEED)}
    new_counts, decide_counts = [], []
    for s in range(args["replicates"]):
        count, nulls, _ = run_rule(d, s, 0.05, args["new_cap"])
        rows[("new", s)] = row(model, layer, names, d.rho, nulls, s)
        new_counts.append(count)
        count, nulls, _ = run_rule(d, s, 0.05, args["new_cap"], args["decide"])
        rows[("decide", s)] = row(model, layer, names, d.rho, nulls, s)
        decide_counts.append(count)
    count, nulls, reached = run_rule(d, 0, None, args["old_cap"])
    old = rows[("old", 0)] = row(model, layer, names, d.rho, nulls, 0)
    old_count = count if reached else int(np.ceil(count * (old["z_half_width"] / 0.25) ** 2 / BLOCK) * BLOCK)
    record = {
        "model": model,
        "layer": layer,
        "z_ref": rows[("ref", 0)]["z"],
        "old": old_count,
        "old_exact": reached,
        "new": new_counts[0],
        "new_mean": float(np.mean(new_counts)),
        "decide": decide_counts[0],
        "z_new": rows[("new", 0)]["z"],
        "hw_new": rows[("new", 0)]["z_half_width"],
        "spn": d.seconds_per_null(),
    }
    d.save()
    return record, rows, d.session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="smollm2,gemma3-270m")
    parser.add_argument("--n-texts", type=int, default=400, help="texts (400: the issue's stored run)")
    parser.add_argument("--max-words", type=int, default=64)
    parser.add_argument("--ref-nulls", type=int, default=20_000, help="nulls of the reference run")
    parser.add_argument("--replicates", type=int, default=2, help="independent runs of the new rule (seeds 0..)")
    parser.add_argument("--old-cap", type=int, default=2000, help="most draws the old rule is run on; beyond, extrapolated")
    parser.add_argument("--new-cap", type=int, default=1000, help="--n-null-cap of the new rule (the CLI default)")
    parser.add_argument("--decide", type=int, default=500, help="--n-null-decide of the new rule + decide (the CLI default)")
    parser.add_argument("--coverage-seeds", type=int, default=40)
    parser.add_argument("--truth-nulls", type=int, default=10_000, help="nulls of the truth for the coverage layers")
    parser.add_argument("--jobs", type=int, default=2, help="processes drawing nulls, a layer each (one per core)")
    parser.add_argument("--extract-only", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from raygeom.numerics.uncertainty import z_jackknife_bias

    start = time.perf_counter()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    from raygeom.errors import RaygeomError

    try:
        data = {m: extract(m, args.n_texts, args.max_words) for m in models}
    except RaygeomError as error:  # a built-in model whose package is missing: `make models` installs both
        sys.exit(f"bench_nulls: {error} (or: make models)")
    for m in models:
        print(
            f"{m}: {len(data[m]['layers'])} layers, N={args.n_texts}, d={data[m]['basis'].shape[0]} "
            f"(extraction {data[m]['seconds']:.0f} s, cached in {CACHE.relative_to(CACHE.parents[1])})",
            flush=True,
        )
    if args.extract_only:
        return
    draws: dict[tuple[str, str], Draws] = {}
    per_layer, sessions = [], {}
    runs = {(rule, s): [] for rule in ("new", "decide") for s in range(args.replicates)} | {("old", 0): [], ("ref", 0): []}
    tasks = [(m, layer, vars(args)) for m in models for layer in data[m]["layers"]]
    if args.jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(run_layer, *zip(*tasks)))
    else:
        results = [run_layer(*task) for task in tasks]
    for (m, layer, _), (record, rows, session) in zip(tasks, results):
        per_layer.append(record)
        for key, r in rows.items():
            runs[key].append(r)
        sessions[(m, layer)] = session
    for m in models:
        names = list(data[m]["layers"])
        for layer in names:
            draws[(m, layer)] = layer_draws(m, layer, args.n_texts, args.max_words, data[m])
    print(f"rules run on {len(tasks)} layers in {args.jobs} processes ({time.perf_counter() - start:.0f} s so far)", flush=True)

    print(
        f"\nPer layer (CCR-1, k={K}, N={args.n_texts}; reference {args.ref_nulls:,} nulls on seed {REF_SEED}; "
        f"~ = old rule extrapolated beyond {args.old_cap:,} draws)"
    )
    print(
        f"{'model':<14}{'layer':<11}{'z ref':>8}{'old rule':>10}{'new rule':>10}{'+ decide':>10}{'new z ± 95%':>16}{'ms/null':>9}"
    )
    for p in per_layer:
        old = f"{'~' if not p['old_exact'] else ''}{p['old']:,}"
        print(
            f"{p['model']:<14}{p['layer']:<11}{p['z_ref']:>+8.2f}{old:>10}{p['new']:>10,}{p['decide']:>10,}"
            f"{p['z_new']:>+9.2f} ± {p['hw_new']:<5.2f}{1000 * p['spn']:>9.1f}"
        )

    reference = decisions(runs[("ref", 0)])
    print("\nSide by side, per model (CPU-s = nulls x the layer's CPU-s per null, timed on 30 nulls; = wall on one free core)")
    print(
        f"{'model':<14}{'layers':>7}{'nulls old':>12}{'nulls new':>11}{'ratio':>7}{'+ decide':>10}{'ratio':>7}"
        f"{'CPU-s old':>11}{'CPU-s new':>11}{'+ decide':>10}{'|z|>5 old':>11}{'|z|>5 new':>11}"
    )
    totals = np.zeros(6)
    for m in models:
        ps = [p for p in per_layer if p["model"] == m]
        old, new, dec = (sum(p[rule] for p in ps) for rule in ("old", "new", "decide"))
        cpu = [sum(p[rule] * p["spn"] for p in ps) for rule in ("old", "new", "decide")]
        far = [p for p in ps if abs(p["z_ref"]) > 5]
        totals += [old, new, dec, *cpu]
        print(
            f"{m:<14}{len(ps):>7}{old:>12,}{new:>11,}{old / new:>7.1f}{dec:>10,}{old / dec:>7.1f}{cpu[0]:>11.0f}"
            f"{cpu[1]:>11.0f}{cpu[2]:>10.0f}{sum(p['old'] for p in far):>11,}{sum(p['new'] for p in far):>11,}"
        )
    print(
        f"{'all':<14}{len(per_layer):>7}{int(totals[0]):>12,}{int(totals[1]):>11,}{totals[0] / totals[1]:>7.1f}"
        f"{int(totals[2]):>10,}{totals[0] / totals[2]:>7.1f}{totals[3]:>11.0f}{totals[4]:>11.0f}{totals[5]:>10.0f}"
    )
    print(
        f"(+ decide: the new rule with --n-null-decide {args.decide}: on while z's interval holds 0, -2 or 2, up to "
        f"{args.decide} nulls)"
    )

    print(
        f"\nDecisions against the {args.ref_nulls:,}-null reference: differing / compared (of which the run's own "
        "95 % interval excluded the reference's side: wrong and sure)"
    )
    kinds = ["sign", "|z|>2", "collapse zone", "lowest layer"]
    print(f"{'run':<22}" + "".join(f"{k:>16}" for k in kinds) + f"{'all':>16}{'sure':>8}{'backed by the run':>19}")
    names = {"new": "new rule", "decide": "new + decide", "old": "old rule"}
    pairs = [
        (f"{names[rule]} seed {seed}" + (" (*)" if rule == "old" else ""), decisions(rows), reference)
        for (rule, seed), rows in runs.items()
        if rule != "ref"
    ]
    pairs.append(("new vs old, seed 0", decisions(runs[("new", 0)]), decisions(runs[("old", 0)])))
    over_seeds: dict[str, list[int]] = {}
    for label, got, against in pairs:
        cells, differ, wrong, total, decided = compare(got, against, kinds)
        print(
            f"{label:<22}" + "".join(f"{c:>16}" for c in cells) + f"{differ:>6}/{total} {100 * differ / total:4.1f}%"
            f"{wrong:>8}{decided:>12}/{total} ({100 * wrong / max(decided, 1):.1f}% of them wrong)"
        )
        if " seed " in label and against is reference:
            counts = over_seeds.setdefault(label.split(" seed ")[0], [0, 0])
            counts[0], counts[1] = counts[0] + differ, counts[1] + total
    print("over every seed: " + "; ".join(f"{rule} {d}/{t} ({100 * d / t:.1f} %)" for rule, (d, t) in over_seeds.items()))
    print(
        "(*) where the old rule needs more than --old-cap draws, its decisions are those at --old-cap\n"
        "sure: differing where the run's own 95 % interval backs its side; backed by the run: the decisions whose side "
        "every z in the run's intervals gives (the rest it leaves open)"
    )

    print()
    print_decision_cost(
        runs[("ref", 0)],
        np.array([p["new"] for p in per_layer], dtype=float),
        sum(p["old"] for p in per_layer),
        f"the {args.ref_nulls:,}-null reference's z",
        "the old rule's",
    )

    # Coverage at 100 nulls: 3 layers (|z| smallest, nearest 10, largest over all models), against a high-null truth.
    by_z = sorted(per_layer, key=lambda p: abs(p["z_ref"]))
    picks = [by_z[0], min(by_z[1:-1], key=lambda p: abs(abs(p["z_ref"]) - 10)), by_z[-1]]
    print(
        f"\nCoverage of the 95 % interval at 100 nulls: {args.coverage_seeds} seeds x 3 layers, "
        f"truth = z from {args.truth_nulls:,} nulls (seed {REF_SEED})"
    )
    print(
        f"{'model':<14}{'layer':<11}{'z truth':>9}{'mean z(100)-truth':>19}{'jackknife bias':>16}{'covered now':>13}{'before':>8}"
    )
    from raygeom.numerics.uncertainty import z_uncertainty

    for p in picks:
        d = draws[(p["model"], p["layer"])]
        truth_nulls = d.get(REF_SEED, args.truth_nulls)
        truth = (d.rho - truth_nulls.mean()) / truth_nulls.std(ddof=1)
        now = before = 0
        zs, biases = [], []
        for j in range(args.coverage_seeds):
            nulls = d.get(COVERAGE_SEED + j, 100)
            u = z_uncertainty(d.rho, nulls, seed=j)
            bias = z_jackknife_bias(d.rho, nulls)
            sd_boot = np.sqrt(u["z_se"] ** 2 - bias**2)
            now += u["z_lo"] <= truth <= u["z_hi"]
            before += abs(u["z"] - truth) <= 1.959964 * sd_boot
            zs.append(u["z"])
            biases.append(bias)
        d.save()
        print(
            f"{p['model']:<14}{p['layer']:<11}{truth:>+9.2f}{np.mean(zs) - truth:>+19.2f}{np.mean(biases):>+16.2f}"
            f"{now:>10}/{args.coverage_seeds}{before:>5}/{args.coverage_seeds}"
        )
    stored_run_table()
    cpu = sum(sessions.values()) + sum(d.session for d in draws.values())
    print(
        f"\nscale: models {', '.join(models)}; N={args.n_texts} texts ({args.max_words} words), reference {args.ref_nulls:,} "
        f"nulls, {args.replicates} new-rule replicates, old rule up to {args.old_cap:,} draws, coverage "
        f"{args.coverage_seeds} seeds x 3 layers, truth {args.truth_nulls:,} nulls; null draws this run: "
        f"{cpu:.0f} CPU-s (draws cached by an earlier run cost nothing); wall {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # each figure as it is measured, also into a pipe or a log
    with section_if_asked(__file__):
        main()
