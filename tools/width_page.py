"""docs/results/width.md: a width-and-depth ladder's page, the PGA paper's width claims read against a [train] grid of
runs that differ only in d, depth and seed, every number decided on its interval.

Built from the rows alone: ``raygeom run jobs/width.toml`` exports the tidy rows the page cites beside it
(raygeom.jobs.width.export_rows: Parquet in ``<page>/`` and ``meta.json`` with what ran), and :func:`render_page`
builds the page and its figures from those files (``python -m tools.results_pages docs/results/width.md``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from raygeom.jobs.gap_ranking import agreement, claim_verdict, correlation_text, step_name
from raygeom.jobs.width import _at, _is, plot_heatmaps, shapes
from raygeom.numerics.uncertainty import bounded_mean_interval, bounds_of, log_linear_change, spearman_with_ci
from raygeom.report.figures import drawn_once, interval_bounds, pyplot, save_figure
from raygeom.report.pga_sweep import collapse_zones

SPECTRAL = ("rankme", "alpha_req", "isotropy")
# The columns of a table of spectral metrics against z over points (after the points' own columns)
SPECTRAL_TABLE = [
    ("points", "points"),
    ("z range", "z_range"),
    ("RankMe", "rankme"),
    ("alpha-ReQ", "alpha_req"),
    ("isotropy", "isotropy"),
]


REGENERATE = "python -m tools.results_pages"


# What the paper states each claim for (the seeds' summary of it): a reading outside the range tests nothing it claims.
RESTORATION_MIN_D = 768


SMALL_REGIME_MAX_D = 1024


def _fmt(value: float | None, digits: int = 2, sign: bool = True) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def with_interval(row: dict, name: str = "z", digits: int = 2) -> str:
    bounds = interval_bounds(row, name)
    text = _fmt(row.get(name), digits)
    return text + (f" [{_fmt(bounds[0], digits)}, {_fmt(bounds[1], digits)}]" if bounds else "")


def _seed_mean(values: list[float], digits: int = 2, within: list[tuple] = (), name: str = "") -> str:
    """Seed mean [interval]: the seed-to-seed t interval, on the logit scale for a bounded quantity, widened to hold
    the seeds' own intervals (numerics.uncertainty.bounded_mean_interval)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return "n/a"
    t = bounded_mean_interval(finite, within, bounds_of(name) if name else None)
    return _fmt(t["mean"], digits) + (f" [{_fmt(t['lo'], digits)}, {_fmt(t['hi'], digits)}]" if math.isfinite(t["lo"]) else "")


def _shape(shape: tuple[int, int]) -> str:
    return f"d = {shape[0]}, {shape[1]} blocks"


def _layer_order(rows: list[dict]) -> list[str]:
    return [name for _, name in sorted({(r["layer_index"], r["layer"]) for r in rows})]


def collapse_table(pga: list[dict], configs: list[dict], settings) -> list[dict]:
    """Per (PGA setting, width, depth): how many trained (run, checkpoint) depth profiles hold a collapse zone (late
    non-final layers whose whole interval is below collapse_z while an earlier layer's is above positive_z), and
    how many at step 0, the random initialisation, counted apart: a zone there is no reorganisation by training."""
    out = []
    for config in configs:
        rows = [r for r in pga if _is(r, **config)]
        for shape in shapes(rows):
            zones = collapse_zones(_at(rows, shape), settings.collapse_z, settings.positive_z)
            step = {(r["model"], r["revision"]): r["step"] for r in rows}
            trained = [z for z in zones if step[(z["model"], z["revision"])] != 0]
            at_init = [z for z in zones if step[(z["model"], z["revision"])] == 0]
            hits = [z for z in trained if z["collapsed"]]
            run = {r["model"]: r["run"] for r in rows}
            out.append(
                {
                    **config,
                    "width": shape[0],
                    "depth": shape[1],
                    "profiles": len(trained),
                    "collapsed": len(hits),
                    "at_init": f"{sum(z['collapsed'] for z in at_init)} of {len(at_init)}",
                    "where": ", ".join(f"{run[z['model']]}@{z['revision']} ({z['zone_layers']})" for z in hits[:3])
                    + (" ..." if len(hits) > 3 else ""),
                }
            )
    return out


def restoration(pga: list[dict], k_per_d: float, settings) -> list[dict]:
    """Per (width, depth): trained (run, step, layer) points whose z at CCR-0 is below collapse_z on its whole
    interval, and how many CCR-1/5/10 lift above positive_z (whole interval). Step 0 is left out: the initialisation
    has nothing to restore."""
    by_point: dict[tuple, dict[int, dict]] = {}
    for r in pga:
        if r.get("k_per_d") == k_per_d and r["step"] != 0:
            by_point.setdefault((r["width"], r["depth"], r["run"], r["step"], r["layer"]), {})[r["r"]] = r
    out = []
    for shape in sorted({key[:2] for key in by_point}):
        mine = {key: ranks for key, ranks in by_point.items() if key[:2] == shape}
        low = [
            ranks
            for ranks in mine.values()
            if 0 in ranks and (interval_bounds(ranks[0], "z") or (ranks[0]["z"],) * 2)[1] < settings.collapse_z
        ]
        row = {
            "width": shape[0],
            "depth": shape[1],
            "low_at_ccr0": len(low),
            "points": len(mine),
            "scope": "inside" if shape[0] >= RESTORATION_MIN_D else "outside",
        }
        for rank in (1, 5, 10):
            lifted = [
                ranks[rank]
                for ranks in low
                if rank in ranks and (interval_bounds(ranks[rank], "z") or (ranks[rank]["z"],) * 2)[0] > settings.positive_z
            ]
            row[f"organised_at_ccr{rank}"] = len(lifted)
        out.append(row)
    return out


def pc1_by_shape(pc1: list[dict], last: dict[str, int]) -> list[dict]:
    """PC1 readout share of each layer at step 0 (the initialisation) and at the last checkpoint, per (width, depth):
    seed mean [logit-scale t interval over seeds, at least the seeds' own half-sample intervals]."""
    out = []
    for shape in shapes(pc1):
        rows = _at(pc1, shape)
        for layer in _layer_order(rows):
            at = {
                when: [r for r in rows if r["layer"] == layer and r["step"] == (0 if when == "first" else last[r["run"]])]
                for when in ("first", "last")
            }
            chance = next((r["pc1_readout_chance"] for r in at["last"]), float("nan"))

            def mean(points):
                return _seed_mean(
                    [r["pc1_readout_share"] for r in points],
                    3,
                    [interval_bounds(r, "pc1_readout_share") or (None, None) for r in points],
                    "pc1_readout_share",
                )

            out.append(
                {
                    "width": shape[0],
                    "depth": shape[1],
                    "layer": layer,
                    "step0": mean(at["first"]),
                    "last": mean(at["last"]),
                    "last_runs": "; ".join(with_interval(r, "pc1_readout_share", 3) for r in at["last"]),
                    "chance": chance,
                }
            )
    return out


def spectral_against_z(pga: list[dict], spectral: list[dict], config: dict, seed: int) -> list[dict]:
    """Per (width, depth): Spearman of z (one PGA setting) against each spectral metric over every (run, checkpoint,
    block) point, with its Fisher interval (or, over fewer than 10 points, its exact permutation p-value)."""
    z_of = {(r["run"], r["step"], r["layer"]): r["z"] for r in pga if _is(r, **config)}
    out = []
    for shape in shapes(spectral):
        rows = [r for r in _at(spectral, shape) if (r["run"], r["step"], r["layer"]) in z_of and r["layer"] != "embed"]
        z = np.array([z_of[(r["run"], r["step"], r["layer"])] for r in rows], dtype=float)
        row = {
            "width": shape[0],
            "depth": shape[1],
            "points": len(rows),
            "z_range": float(np.nanmax(z) - np.nanmin(z)) if len(z) else float("nan"),
        }
        for metric in SPECTRAL:
            values = np.array([r.get(metric, float("nan")) for r in rows], dtype=float)
            keep = np.isfinite(values) & np.isfinite(z)
            try:
                fit = spearman_with_ci(z[keep], values[keep], seed=seed)
            except Exception:  # noqa: BLE001 - fewer than 4 finite points: no correlation to state
                row[metric] = "n/a"
                continue
            if fit["note"]:
                row[metric] = f"{fit['rho']:+.2f} (p = {fit['p_perm']:.2g}, {fit['note']})"
                row[f"{metric}_excludes_0"] = fit["p_perm"] < 0.05
            else:
                row[metric] = f"{fit['rho']:+.2f} [{fit['lo']:+.2f}, {fit['hi']:+.2f}]"
                row[f"{metric}_excludes_0"] = fit["lo"] > 0 or fit["hi"] < 0
        out.append(row)
    return out


def seed_agreement(pga: list[dict], config: dict, last: dict[str, int], settings) -> list[dict]:
    """At the last checkpoint, per (width, depth, layer): each seed's z with its within-run interval, the seed mean
    with its seed-to-seed t interval (at least the seeds' own intervals), and whether the seeds decide alike."""
    out = []
    rows = [r for r in pga if _is(r, **config) and r["step"] == last.get(r["run"])]
    for shape in shapes(rows):
        at = _at(rows, shape)
        for layer in _layer_order(at):
            seeds = sorted((r for r in at if r["layer"] == layer), key=lambda r: r["run_seed"])
            decisions = {(r["z"] > 0, (interval_bounds(r, "z") or (r["z"],) * 2)[0] > settings.positive_z) for r in seeds}
            out.append(
                {
                    "width": shape[0],
                    "depth": shape[1],
                    "layer": layer,
                    "seeds": "; ".join(with_interval(r) for r in seeds),
                    "mean": _seed_mean([r["z"] for r in seeds], 2, [interval_bounds(r, "z") or (None, None) for r in seeds]),
                    "same_decision": len(decisions) == 1,
                }
            )
    return out


# Held-out perplexity has flattened when it falls by less than this share over the last quarter of training: the
# fitted fall's one-sided 95% upper bound is below it (an equivalence test, TOST, hence the 90% interval).
FLAT_FALL = 0.02


FLAT_LEVEL = 0.90


def flattening(losses: list[dict], steps: int) -> list[dict]:
    """Per run: final and lowest held-out perplexity (a run past its lowest point overfits its training text), and
    the fall over the last quarter of training fitted through every evaluation in it (log perplexity against step,
    :func:`log_linear_change`), with its 90% interval. Flattened: "yes" when the whole interval is below
    ``FLAT_FALL`` (a rise counts), "no" when it is above, "undecided" otherwise or with fewer than 3 evaluations."""
    out = []
    for run in sorted({r["run"] for r in losses}):
        curve = sorted((r for r in losses if r["run"] == run), key=lambda r: r["step"])
        last = curve[-1]
        lowest = min(curve, key=lambda r: r["heldout_perplexity"])
        tail = [r for r in curve if r["step"] >= 0.75 * steps]
        fit = (
            log_linear_change([r["step"] for r in tail], [r["heldout_perplexity"] for r in tail], steps / 4, FLAT_LEVEL)
            if len(tail) >= 2
            else {"change": math.nan, "lo": math.nan, "hi": math.nan}
        )
        fall, fall_lo, fall_hi = -fit["change"], -fit["hi"], -fit["lo"]
        out.append(
            {
                "run": run,
                "width": last["width"],
                "depth": last["depth"],
                "seed": last["run_seed"],
                "final_perplexity": last["heldout_perplexity"],
                "lowest_perplexity": lowest["heldout_perplexity"],
                "lowest_step": lowest["step"],
                "tail_from": tail[0]["step"] if tail else None,
                "tail_points": len(tail),
                "last_quarter_fall": fall,
                "last_quarter_fall_lo": fall_lo,
                "last_quarter_fall_hi": fall_hi,
                "flattened": "yes" if fall_hi < FLAT_FALL else "no" if fall_lo > FLAT_FALL else "undecided",
            }
        )
    return sorted(out, key=lambda r: (r["width"], r["depth"], r["seed"], r["run"]))


def gap_summaries(rows: list[dict], trajectory) -> list[dict]:
    """Per run: Spearman(G, -perplexity) over its checkpoints (gap_ranking.agreement), from the shipped rows."""
    out = []
    for run in sorted(
        {r["run"] for r in rows}, key=lambda name: next((r["width"], r["depth"], r["run_seed"]) for r in rows if r["run"] == name)
    ):
        mine = sorted((r for r in rows if r["run"] == run), key=lambda r: r["step"])
        for s in agreement(mine, trajectory.late_from, trajectory.bootstrap, trajectory.seed):
            out.append({**s, "run": run, "width": mine[0]["width"], "depth": mine[0]["depth"], "seed": mine[0]["run_seed"]})
    return out


def gap_table(summaries: list[dict]) -> list[dict]:
    """One line per (run, subset of checkpoints): Spearman(G, -held-out perplexity), and the checkpoint G picks."""
    out = []
    for s in summaries:
        ok = math.isfinite(s.get("spearman", float("nan")))
        interval = (
            f"[{s['fisher_lo']:+.2f}, {s['fisher_hi']:+.2f}]"
            if ok and not s.get("note")
            else f"{s.get('note') or 'n/a'}; {s['p_method']} permutation p = {s['p_perm']:.3g}"
            if ok
            else s.get("note", "n/a")
        )
        out.append(
            {
                "width": s["width"],
                "depth": s["depth"],
                "seed": s["seed"],
                "subset": s["subset"],
                "n": s["n"],
                "spearman": f"{s['spearman']:+.2f}" if ok else "n/a",
                "interval": interval,
                "pick": f"{step_name(s.get('select_pick_step'))} (perplexity rank {s.get('pick_perplexity_rank')} of {s['n']})"
                if s.get("select_pick")
                else "",
            }
        )
    return out


def dispersion_by_shape(rows: list[dict], last: dict[str, int]) -> list[dict]:
    """Sample-level dispersion of each layer at the last checkpoint, per (width, depth): each seed with its jackknife
    interval, and the seed mean with its interval."""
    out = []
    for shape in shapes(rows):
        at = [r for r in _at(rows, shape) if r["step"] == last.get(r["run"])]
        for layer in _layer_order(at):
            seeds = sorted((r for r in at if r["layer"] == layer), key=lambda r: r["run_seed"])
            out.append(
                {
                    "width": shape[0],
                    "depth": shape[1],
                    "layer": layer,
                    "seeds": "; ".join(with_interval(r, "dispersion", 3) for r in seeds),
                    "mean": _seed_mean(
                        [r["dispersion"] for r in seeds],
                        3,
                        [interval_bounds(r, "dispersion") or (None, None) for r in seeds],
                        "dispersion",
                    ),
                }
            )
    return out


def late_layers(rows: list[dict]) -> set[str]:
    """The late, non-final layers of a profile as collapse_zones reads them: relative depth > 0.5, not the last two."""
    order = sorted({(r["layer_index"], r["layer"], r["relative_depth"]) for r in rows})
    return {name for _, name, depth in order[:-2] if depth > 0.5}


def pc1_reading(pc1: list[dict], last: dict[str, int]) -> list[dict]:
    """Per (width, depth): at the last checkpoint, how many (run, late non-final layer) points have PC1's share of
    the readout subspace below chance on their whole half-sample interval (PC1 has left V_k), and how many above."""
    out = []
    for shape in shapes(pc1):
        mine = [r for r in _at(pc1, shape) if r["step"] == last.get(r["run"])]
        late = late_layers(mine)
        at = [r for r in mine if r["layer"] in late]
        bounds = [(interval_bounds(r, "pc1_readout_share"), r["pc1_readout_chance"]) for r in at]
        out.append(
            {
                "shape": shape,
                "points": len(at),
                "below": sum(1 for b, chance in bounds if b and b[1] < chance),
                "above": sum(1 for b, chance in bounds if b and b[0] > chance),
            }
        )
    return out


def spectral_reading(flat: list[dict]) -> list[str]:
    """Per (width, depth): the spectral metrics whose Spearman with z is decided away from 0."""
    out = []
    for row in flat:
        moving = [f"{metric} {row[metric]}" for metric in SPECTRAL if row.get(f"{metric}_excludes_0")]
        out.append(
            f"{_shape((row['width'], row['depth']))} (z range {row['z_range']:.1f}): "
            + ("; ".join(moving) + " (moves with z)" if moving else "no spectral metric tracks z (none decided away from 0)")
        )
    return out


def gap_reading(summaries: list[dict]) -> list[str]:
    """Per run, over all its checkpoints: the dispersion paper's claim (higher G, lower perplexity) read on the
    interval or the exact permutation p-value, naming the checkpoint G picks (step 0 is the initialisation)."""
    out = []
    for s in summaries:
        if s["subset"] != "all checkpoints" or not math.isfinite(s.get("spearman", float("nan"))):
            continue
        pick = f"; G picks {step_name(s['select_pick_step'])}, perplexity rank {s['pick_perplexity_rank']} of {s['n']}" + (
            " (the worst)" if s["pick_perplexity_rank"] == s["n"] else ""
        )
        out.append(f"d = {s['width']}, {s['depth']} blocks, seed {s['seed']}: {correlation_text(s)}: {claim_verdict(s)}{pick}")
    return out


def gap_sign_reading(summaries: list[dict]) -> str:
    """Across runs (over all checkpoints each): how many correlations have the paper's sign, and the one-sided
    binomial p of as few or fewer were each run's sign a fair coin: a reading of the ladder as a whole."""
    from scipy.stats import binomtest

    signs = [s["spearman"] for s in summaries if s["subset"] == "all checkpoints" and math.isfinite(s.get("spearman", math.nan))]
    if not signs:
        return ""
    agree = sum(1 for rho in signs if rho > 0)
    p = binomtest(agree, len(signs), 0.5, alternative="less").pvalue
    verdict = (
        _verdict("contradicted", f"the sign is the opposite of the paper's in {len(signs) - agree} of {len(signs)} runs")
        if p < 0.05
        else _verdict("undecided", f"{agree} of {len(signs)} runs have the paper's sign")
    )
    return (
        f"**Across the runs**: Spearman(G, -perplexity) is positive, the paper's sign, in {agree} of {len(signs)} runs; "
        f"were each run's sign a fair coin, {agree} or fewer would have one-sided binomial p = {p:.2g}: {verdict}. "
        "G ranks the checkpoints against perplexity with the opposite sign wherever it is negative: higher G at "
        "worse perplexity."
    )


@drawn_once
def plot_depth(pga: list[dict], config: dict, last: dict[str, int], path: Path, title: str) -> Path | None:
    """z at the last checkpoint against relative depth: one line per (width, depth) (seed mean), each seed's interval
    as a band."""
    rows = [r for r in pga if _is(r, **config) and r["step"] == last.get(r["run"])]
    if not rows:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    points = shapes(rows)
    colours = plt.get_cmap("viridis")
    widths = sorted({w for w, _ in points})
    styles = {depth: style for depth, style in zip(sorted({d for _, d in points}), ("-", "--", ":", "-."))}
    for shape in points:
        colour = colours(widths.index(shape[0]) / max(1, len(widths) - 1))
        at = _at(rows, shape)
        depths = sorted({r["relative_depth"] for r in at})
        mean = [np.mean([r["z"] for r in at if r["relative_depth"] == x]) for x in depths]
        ax.plot(depths, mean, marker="o", ms=3, color=colour, ls=styles.get(shape[1], "-"), label=_shape(shape))
        for seed in sorted({r["run_seed"] for r in at}):
            line = sorted((r for r in at if r["run_seed"] == seed), key=lambda r: r["relative_depth"])
            bounds = [interval_bounds(r, "z") or (r["z"], r["z"]) for r in line]
            ax.fill_between(
                [r["relative_depth"] for r in line],
                [b[0] for b in bounds],
                [b[1] for b in bounds],
                color=colour,
                alpha=0.12,
                lw=0,
            )
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("relative depth (embedding = 0, final norm = 1)")
    ax.set_ylabel("z (bands: each seed's 95% interval)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return save_figure(fig, path)


@drawn_once
def plot_losses(losses: list[dict], path: Path) -> Path | None:
    """Held-out perplexity over training, one line per run (colour: width, line style: depth)."""
    if not losses:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    widths = sorted({r["width"] for r in losses})
    styles = {depth: style for depth, style in zip(sorted({r["depth"] for r in losses}), ("-", "--", ":", "-."))}
    colours = plt.get_cmap("viridis")
    for run in sorted({r["run"] for r in losses}):
        points = sorted((r for r in losses if r["run"] == run and r["step"] > 0), key=lambda r: r["step"])
        first = points[0]
        ax.plot(
            [r["step"] for r in points],
            [r["heldout_perplexity"] for r in points],
            marker="o",
            ms=2,
            lw=1,
            color=colours(widths.index(first["width"]) / max(1, len(widths) - 1)),
            ls=styles[first["depth"]],
            label=run,
        )
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("held-out perplexity")
    ax.set_title("Held-out perplexity over training (colour: width; line style: depth)", fontsize=9)
    ax.legend(fontsize=5, ncol=3)
    fig.tight_layout()
    return save_figure(fig, path)


def markdown_table(rows: list[dict], columns: list[tuple[str, str]]) -> list[str]:
    lines = ["| " + " | ".join(title for title, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(name)) for _, name in columns) + " |")
    return lines


def _cell(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return _fmt(value, 3, sign=False)
    return "" if value is None else str(value)


def pga_configs(pga: list[dict]) -> list[dict]:
    found = sorted({(r["k_per_d"], r["k"] if not r["k_per_d"] else None, r["r"]) for r in pga}, key=lambda c: (c[0] == 0, c[2]))
    return [{"k_per_d": k_per_d, "r": r} if k_per_d else {"k_per_d": 0.0, "k": k, "r": r} for k_per_d, k, r in found]


def read_rows(data_dir: Path) -> tuple[dict, dict[str, list[dict]]]:
    import pyarrow.parquet as pq

    meta = json.loads((data_dir / "meta.json").read_text())
    tables = dict.fromkeys(("pga", "spectral", "pc1", "probe", "sample_dispersion", "evaluations", "gap"), [])
    tables |= {path.stem: pq.read_table(path).to_pylist() for path in sorted(data_dir.glob("*.parquet"))}
    return meta, tables


def _describe(config: dict | None) -> str:
    if not config:
        return "no PGA"
    k = f"k/d = {config['k_per_d']:g}" if config.get("k_per_d") else f"fixed k = {config.get('k')}"
    return f"{k}, CCR-{config['r']}"


def _figure(paths: dict, name: str, page: Path, alt: str) -> list[str]:
    path = paths.get(name)
    return [f"![{alt}]({Path(path).relative_to(page.parent).as_posix()})", ""] if path else []


def render_page(page: Path) -> str:
    """The page's text, from the rows in ``<page>/`` (and its figures, drawn there); no store, no job."""
    page = Path(page)
    data = page.parent / page.stem
    meta, tables = read_rows(data)
    settings = SimpleNamespace(**meta["width"])
    pga, spectral, pc1, probe, spread = (tables[name] for name in ("pga", "spectral", "pc1", "probe", "sample_dispersion"))
    last = {r["run"]: max(x["step"] for x in pga if x["run"] == r["run"]) for r in pga}
    configs = pga_configs(pga)
    ladder_config = next((c for c in configs if c["k_per_d"] and c["r"] == 1), configs[0] if configs else {})
    losses = tables["evaluations"]
    paths = {
        "heatmaps": plot_heatmaps(
            pga, ladder_config, data / "heatmaps.png", f"Subspace PGA z over step x layer ({_describe(ladder_config)})"
        ),
        "depth": plot_depth(
            pga, ladder_config, last, data / "z_vs_depth.png", f"z at the last checkpoint by depth ({_describe(ladder_config)})"
        ),
        "losses": plot_losses(losses, data / "losses.png"),
    }
    trajectory = SimpleNamespace(**meta["trajectory"]) if meta.get("trajectory") else None
    summaries = gap_summaries(tables["gap"], trajectory) if tables["gap"] and trajectory else []

    def at_last(shape, layer):
        return sorted(
            (r for r in _at(probe, shape) if r["layer"] == layer and r["step"] == last[r["run"]]), key=lambda r: r["run_seed"]
        )

    probes = [
        {
            "width": shape[0],
            "depth": shape[1],
            "layer": layer,
            "seeds": "; ".join(with_interval(r, "accuracy", 3) for r in at_last(shape, layer)),
            "accuracy": _seed_mean(
                [r["accuracy"] for r in at_last(shape, layer)],
                3,
                [interval_bounds(r, "accuracy") or (None, None) for r in at_last(shape, layer)],
                "accuracy",
            ),
            "chance": next((r["chance"] for r in _at(probe, shape) if r["layer"] == layer), None),
        }
        for shape in shapes(probe)
        for layer in ("block_01", "final_norm")
    ]
    return _page(
        meta,
        page,
        paths,
        losses,
        collapse_table(pga, configs, settings),
        restoration(pga, ladder_config.get("k_per_d", 0.0), settings),
        pc1_by_shape(pc1, last),
        spectral_against_z(pga, spectral, ladder_config, settings.seed),
        seed_agreement(pga, ladder_config, last, settings),
        probes,
        configs,
        ladder_config,
        sum(len(v) for v in tables.values()),
        summaries,
        dispersion_by_shape(spread, last),
        pc1_reading(pc1, last),
        settings,
        trajectory,
        sorted({r["n_null"] for r in pga if r.get("n_null")}),
    )


def _verdict(kind: str, why: str) -> str:
    return f"**{kind}** ({why})"


def _page(
    meta,
    page,
    paths,
    losses,
    collapse,
    restored,
    pc1_rows,
    flat,
    seeds,
    probes,
    configs,
    ladder_config,
    n_rows,
    summaries,
    spread,
    pc1_counts,
    settings,
    trajectory,
    n_nulls,
) -> str:
    train = SimpleNamespace(**meta["train"])
    runs = meta["runs"]
    points = sorted({(r["width"], r["depth"]) for r in runs})
    widths = sorted({w for w, _ in points})
    flat_rows = flattening(losses, train.steps)
    tokens = train.steps * train.batch_size * train.seq_len
    data_name = page.stem
    lines = [
        "# Width-and-depth ladder: does the readout organisation depend on width and depth?",
        "",
        f"Regenerated by `{REGENERATE} docs/results/{page.name}` from the {n_rows} tidy rows in "
        f"[`{data_name}/`]({data_name}/) (`pga`, `spectral`, `pc1`, `probe`, `sample_dispersion`, `evaluations`, `gap` "
        f".parquet, and `meta.json`); those rows were written by `raygeom run jobs/{meta['job']}.toml` from its store "
        f"`{meta['store']}`. Every number below can be recomputed from them with pandas. Edit the job, not this page.",
        "",
        "## What ran",
        "",
        f"- **Ladder**: GPT-NeoX from scratch at (d, blocks) = {', '.join(f'({w}, {d})' for w, d in points)}, seeds "
        f"{', '.join(str(s) for s in sorted({r['seed'] for r in runs}))} ({len(runs)} runs); everything else shared: "
        f"heads = d / {meta['head_dim']}, {train.steps} steps of {train.batch_size} x {train.seq_len} tokens "
        f"({tokens / 1e3:.0f}k tokens a run), AdamW lr {train.lr:g} with {train.warmup} warm-up steps, a "
        f"{train.vocab_size}-token BPE trained on the training articles, the same checkpoint steps "
        f"({', '.join(map(str, meta['checkpoint_steps']))}; step 0 is the random initialisation).",
        f"- **Data**: {train.corpus}, "
        + (f"{train.max_texts} of its articles, " if train.max_texts else "")
        + f"{1 - train.heldout_fraction:.0%} of them for training"
        + (
            f" ({n_train:,} sequences, {n_train * train.seq_len / 1e3:.0f}k tokens, each seen about "
            f"{tokens / (n_train * train.seq_len):.1f} times)"
            if (n_train := meta.get("n_train_sequences"))
            else ""
        )
        + f"; every analysis runs on N = {meta['n_samples']} held-out articles, {meta['pool']}-token pooling.",
        f"- **Analyses at every checkpoint x layer of every run**: PGA at {', '.join(_describe(c) for c in configs)} "
        f"({' or '.join(map(str, n_nulls))} nulls); spectral metrics; PC1 readout share; a linear topic probe; sample-level "
        "dispersion" + ("; the dispersion gap G per checkpoint" if summaries else "") + ".",
        f"- **k**: k/d is fixed ({_describe(ladder_config)}: k = "
        f"{', '.join(str(max(1, round(ladder_config.get('k_per_d', 0) * w))) for w in widths)} at d = "
        f"{', '.join(map(str, widths))}).",
    ]
    if meta.get("note"):
        lines.append(f"- **This run**: {meta['note']}")
    wall = meta.get("wall")
    if wall:
        lines.append(
            f"- **Wall time**: the job's last invocation that trained took {wall['wall_s'] / 60:.1f} min end to end, "
            f"training included; the runs' own training times add up to {wall['train_wall_s'] / 60:.1f} min (runs "
            f"train side by side when the cores allow; finished {wall['finished']}, {wall['cpus']} CPUs shared with "
            f"other work, 1-minute load average {wall['load_1min_at_end']:.1f} at the end)."
        )
    lines += ["", "## Held-out perplexity over training: has it flattened?", ""] + _figure(paths, "losses", page, "loss curves")

    def percent(value: float) -> str:
        return f"{value:+.1%}" if value is not None and math.isfinite(value) else "n/a"

    lines += markdown_table(
        [
            {
                **r,
                "tail": f"{r['tail_points']} from step {r['tail_from']}" if r["tail_from"] is not None else "none",
                "fall": f"{percent(r['last_quarter_fall'])} [{percent(r['last_quarter_fall_lo'])}, "
                f"{percent(r['last_quarter_fall_hi'])}]",
            }
            for r in flat_rows
        ],
        [
            ("run", "run"),
            ("d", "width"),
            ("blocks", "depth"),
            ("final held-out perplexity", "final_perplexity"),
            ("lowest", "lowest_perplexity"),
            ("at step", "lowest_step"),
            ("evaluations in the last quarter", "tail"),
            (f"fitted fall over the last quarter [{FLAT_LEVEL:.0%}]", "fall"),
            (f"flattened (fall < {FLAT_FALL:.0%})?", "flattened"),
        ],
    )
    if flat_rows:
        verdicts = [r["flattened"] for r in flat_rows]
        open_runs = [r for r in flat_rows if r["flattened"] != "yes"]
        lines += [
            "",
            f"**Reading**: the fall over the last quarter is fitted through every held-out evaluation in it (log "
            f"perplexity against step; a negative fall is a rise). Flattened means the data show a fall below "
            f"{FLAT_FALL:.0%}: the interval's upper end, a one-sided 95% bound, is below it (an equivalence test); "
            f"not flattened means its lower end is above it. Flattened: {verdicts.count('yes')} of {len(flat_rows)} "
            f"runs; not flattened: {verdicts.count('no')}; undecided: {verdicts.count('undecided')}"
            + (
                " (" + "; ".join(f"{r['run']}: {percent(r['last_quarter_fall'])}, {r['flattened']}" for r in open_runs) + ")"
                if open_runs
                else ""
            )
            + ". The learning rate falls to a tenth of its peak over that quarter (cosine schedule), so part of the "
            "flattening is the schedule."
            + (
                " Where it has **not flattened** the run is short of convergence, and its readings at the last "
                "checkpoint are readings of an undertrained model."
                if "no" in verdicts
                else ""
            ),
        ]
        past = [r for r in flat_rows if r["tail_from"] is not None and r["lowest_step"] < r["tail_from"]]
        if past:
            lines += [
                "",
                f"{len(past)} of {len(flat_rows)} runs ({', '.join(r['run'] for r in past)}) reached their lowest "
                "held-out perplexity before the last quarter and rose after it: they overfit their training articles, "
                "so their last checkpoints are past the best one (the table gives its step).",
            ]
    lines += ["", "## z over step x layer, per run", ""] + _figure(paths, "heatmaps", page, "z heatmaps per run")
    lines += _figure(paths, "depth", page, "z by depth per (width, depth)")
    lines += [
        "## The claims, read against the ladder",
        "",
        "Each verdict is one of: reproduced, contradicted, undecided (what is missing), or outside the paper's "
        f"stated range (the range). The paper's small regime is d <= {SMALL_REGIME_MAX_D}, measured on Pythia models "
        "(d = 512 to 4096, 6 to 32 layers) after up to 300B tokens; restoration is claimed for d >= "
        f"{RESTORATION_MIN_D}. Step 0 is the random initialisation and is counted apart.",
        "",
        f"### 1. A collapse zone (late non-final layers with z below {settings.collapse_z:g} while an earlier layer is "
        f"above {settings.positive_z:g}, whole intervals)",
        "",
    ]
    lines += markdown_table(
        collapse,
        [
            ("k/d", "k_per_d"),
            ("CCR", "r"),
            ("d", "width"),
            ("blocks", "depth"),
            ("trained profiles", "profiles"),
            ("with a collapse zone", "collapsed"),
            ("at step 0 (initialisation)", "at_init"),
            ("where (run@checkpoint: layers)", "where"),
        ],
    )
    trained_hits = [c for c in collapse if c["collapsed"]]
    init_hits = [c for c in collapse if not c["at_init"].startswith("0 ")]
    verdict = (
        _verdict(
            "reproduced",
            "a zone in "
            + ", ".join(
                f"{_shape((c['width'], c['depth']))} ({_describe(c)}: {c['collapsed']} of {c['profiles']})" for c in trained_hits
            ),
        )
        if trained_hits
        else _verdict(
            "undecided",
            f"no trained profile holds a zone ({sum(c['profiles'] for c in collapse)} profiles); the "
            f"paper's zones are in models trained on up to 300B tokens, these saw {tokens / 1e3:.0f}k, so the "
            "checkpoints late in a long training, where the paper finds them, are missing",
        )
    )
    lines += [
        "",
        f"**Verdict**: {verdict}."
        + (
            " At step 0 (the initialisation, before any training): "
            + ", ".join(f"{_shape((c['width'], c['depth']))} {_describe(c)} {c['at_init']}" for c in init_hits)
            + "; a zone there is random weights, not the paper's reorganisation."
            if init_hits
            else ""
        ),
        "",
    ]
    lines += ["### 2. Does CCR-5/10 restore z where it falls?", ""]
    lines += markdown_table(
        restored,
        [
            ("d", "width"),
            ("blocks", "depth"),
            ("trained (run, step, layer) points", "points"),
            (f"z < {settings.collapse_z:g} at CCR-0", "low_at_ccr0"),
            (f"of those, z > {settings.positive_z:g} at CCR-1", "organised_at_ccr1"),
            ("at CCR-5", "organised_at_ccr5"),
            ("at CCR-10", "organised_at_ccr10"),
            (f"d >= {RESTORATION_MIN_D}?", "scope"),
        ],
    )
    low_total = sum(r["low_at_ccr0"] for r in restored)
    lines += [
        "",
        "**Verdict**: "
        + _verdict(
            "outside the paper's stated range",
            f"the paper claims restoration for d >= {RESTORATION_MIN_D}; every width here (d <= {max(widths)}) is below it",
        )
        + (
            f". For the record: {low_total} trained points fall below {settings.collapse_z:g} at CCR-0 (whole "
            "interval); the columns count how many each CCR rank lifts."
            if low_total
            else f". For the record: no trained point falls below {settings.collapse_z:g} at CCR-0 on its whole interval."
        ),
        "",
    ]
    lines += [
        "### 3. Does PC1 migrate out of the readout subspace in late layers?",
        "",
        "Share of PC1 in the top-k readout subspace (k/d fixed): seed mean [logit-scale t interval over seeds, widened "
        "to hold the seeds' own half-sample intervals; inside [0, 1]]; chance = k/d.",
        "",
    ]
    lines += markdown_table(
        pc1_rows,
        [
            ("d", "width"),
            ("blocks", "depth"),
            ("layer", "layer"),
            ("step 0 (initialisation)", "step0"),
            ("last step", "last"),
            ("each seed at the last step [half-sample interval]", "last_runs"),
            ("chance", "chance"),
        ],
    )
    if pc1_counts:
        below = [c for c in pc1_counts if c["below"]]
        counts = "; ".join(
            f"{_shape(c['shape'])}: {c['below']} of {c['points']} below chance, {c['above']} above" for c in pc1_counts
        )
        lines += [
            "",
            "**Verdict** (last checkpoint, late non-final layers, each run's interval against chance k/d): "
            + (
                _verdict("reproduced", "PC1 below chance in " + ", ".join(_shape(c["shape"]) for c in below))
                if below
                else _verdict(
                    "undecided",
                    "PC1 stays inside the readout subspace (above chance) in every late layer; the "
                    "paper ties the migration to collapse zones of trained models, and no trained profile here "
                    "has one",
                )
            )
            + f". {counts}.",
            "",
        ]
    lines += [
        "### 4. Do spectral metrics stay flat where z moves?",
        "",
        f"Spearman of z ({_describe(ladder_config)}) against each metric over every (run, checkpoint, block) point of a "
        "(width, depth), with its 95% Fisher interval; z range is max - min over those points.",
        "",
    ]
    lines += markdown_table(flat, [("d", "width"), ("blocks", "depth"), *SPECTRAL_TABLE])
    lines += [
        "",
        "**Verdict**: "
        + _verdict(
            "undecided",
            "the paper's claim is about collapse zones (spectral metrics flat "
            "while z swings there); with no trained collapse zone there is no zone to read "
            "it in. Across all points:",
        )
        + " "
        + "; ".join(spectral_reading(flat))
        + ".",
        "",
    ]
    lines += [
        "### 5. Probe accuracy at the last checkpoint",
        "",
        "Each seed with its Wilson 95% interval; the seed mean with the logit-scale t interval over seeds, widened to "
        "hold the seeds' mean Wilson interval (inside [0, 1], never zero width).",
        "",
    ]
    lines += markdown_table(
        probes,
        [
            ("d", "width"),
            ("blocks", "depth"),
            ("layer", "layer"),
            ("each seed [Wilson 95%]", "seeds"),
            ("seed mean [95%]", "accuracy"),
            ("chance", "chance"),
        ],
    )
    if spread:
        lines += [
            "",
            "### 6. Sample-level dispersion at the last checkpoint",
            "",
            "Mean pairwise cosine distance of the pooled held-out vectors: each seed [jackknife 95% over texts], and the "
            "seed mean [95%, as above, inside [0, 2]].",
            "",
        ]
        lines += markdown_table(
            spread, [("d", "width"), ("blocks", "depth"), ("layer", "layer"), ("each seed", "seeds"), ("seed mean", "mean")]
        )
    if summaries:
        lines += [
            "",
            "### 7. Does the dispersion gap G track held-out perplexity over training?",
            "",
            f"G at `{trajectory.gap_layer}` ({trajectory.domain_tokens} tokens against the rest; "
            f"{trajectory.chunks_per_domain} chunks of {trajectory.chunk_len} tokens per topic), ranked against the "
            "trainer's held-out perplexity over each run's checkpoints: Spearman(G, -perplexity), positive where the "
            "dispersion paper expects it. With fewer than 10 checkpoints no interval is honest, so each carries its "
            "exact permutation p-value instead.",
            "",
        ]
        lines += markdown_table(
            gap_table(summaries),
            [
                ("d", "width"),
                ("blocks", "depth"),
                ("seed", "seed"),
                ("checkpoints", "subset"),
                ("n", "n"),
                ("Spearman", "spearman"),
                ("95% Fisher, or why none", "interval"),
                ("G picks", "pick"),
            ],
        )
        readings = gap_reading(summaries)
        if readings:
            lines += ["", "**Verdict per run** (over all checkpoints, step 0 included): " + "; ".join(readings) + ".", ""]
            lines += [gap_sign_reading(summaries), ""]
    lines += [
        "",
        "### 8. Does it hold across seeds?",
        "",
        f"z at the last checkpoint ({_describe(ladder_config)}): each seed with its within-run interval, and the seed "
        "mean with the seed-to-seed 95% t interval (1 degree of freedom with 2 seeds: t = 12.7), widened to hold the "
        "seeds' own intervals.",
        "",
    ]
    lines += markdown_table(
        seeds,
        [
            ("d", "width"),
            ("blocks", "depth"),
            ("layer", "layer"),
            ("each seed [within-run 95%]", "seeds"),
            ("seed mean [95%]", "mean"),
            ("same decision (sign, z > 2)", "same_decision"),
        ],
    )
    agree = sum(1 for s in seeds if s["same_decision"])
    lines += ["", f"**Reading**: the seeds make the same decision at {agree} of {len(seeds)} (width, depth, layer) points.", ""]
    lines += [
        "## What this ladder can and cannot show",
        "",
        f"- It can show whether width and depth change the *shape* of readout organisation when nothing else changes, "
        f"from d = {widths[0]} to d = {widths[-1]} and {min(d for _, d in points)} to {max(d for _, d in points)} blocks, "
        "with the seeds' spread beside each within-run interval.",
        f"- It cannot reach the paper's regimes: these runs see {tokens / 1e3:.0f}k tokens each (Pythia saw 300B), so "
        "'late in training' does not exist here; every width is in the paper's small regime (d <= 1024) and below the "
        f"d >= {RESTORATION_MIN_D} of its restoration claim. A null result here is about this scale, not about the "
        "paper's claims.",
        "- Two seeds give a seed-to-seed interval with one degree of freedom: it flags disagreement, it cannot bound a "
        "small effect.",
        "",
    ]
    return "\n".join(lines)
