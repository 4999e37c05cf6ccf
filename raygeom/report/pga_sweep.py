"""PGA over a sweep's revisions, its renderer's ``sweep`` part (raygeom.report.renderers): the collapse zones
(results/collapse.parquet), the step x layer heatmaps and depth profiles under plots/, and the console's sweep table,
all of the plan's PGA units as the store holds them, each row with its revision's columns."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from rich.console import Console

from raygeom.params import canonical_value
from raygeom.report.figures import sweep_table
from raygeom.report.sweep_plots import plot_depth_profiles, plot_heatmaps

# The columns a sweep's plots, collapse zones and console table add to a PGA row (from its revision's row of
# results/revisions.parquet)
JOINED = ("repo", "size", "deduped", "params", "weights_flag", "known_bad_note")


def swept_rows(plan, revisions: list[dict]) -> list[dict]:
    """This plan's finished PGA units, each row with its revision's columns (:data:`JOINED`): what the sweep's
    plots, collapse zones and console table are drawn from (the table on disk is the run's, results/pga.parquet)."""
    labels = plan.planned_labels()
    keys = [
        unit
        for r in plan.revisions
        for label, units in r.analysis_units.items()
        if labels[label].analysis == "pga"
        for layer, unit in units.items()
        if layer in r.analysis_done.get(label, set())
    ]
    stored = plan.store.read_results("pga", keys).to_pylist() if keys else []
    by_revision = {(r["model"], r["revision"]): r for r in revisions}
    out = []
    for row in stored:
        revision = by_revision[(row["model"], row["revision"])]
        out.append(
            {
                **row,
                **{c: revision[c] for c in JOINED},
                "step": revision["step"],
                "k_per_d": canonical_value("k_per_d", row.get("k_per_d")),
            }
        )
    order = {(r["model"], r["revision"]): i for i, r in enumerate(revisions)}
    out.sort(key=lambda r: (order[(r["model"], r["revision"])], r["layer_index"], r.get("relative_depth") or 0.0))
    return out


def _lower(row: dict) -> float:
    value = row.get("z_lo")
    return row["z"] if value is None or value != value else value


def _upper(row: dict) -> float:
    value = row.get("z_hi")
    return row["z"] if value is None or value != value else value


def collapse_zones(rows: list[dict], threshold: float = 0.0, positive_z: float = 2.0, final_layers: int = 2) -> list[dict]:
    """Per (model, revision): late (relative depth > 0.5), non-final (not the last ``final_layers``) layers
    whose z is below ``threshold`` while some earlier non-embedding layer has z > ``positive_z``.

    Decided on intervals where rows carry them (z_lo, z_hi): a layer is low only when its whole interval
    is below ``threshold``, and an early layer is organised only when its whole interval is above ``positive_z``."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["revision"]), []).append(row)
    out = []
    for (model, revision), group in groups.items():
        group = sorted(group, key=lambda r: (r["layer_index"], r.get("relative_depth") or 0.0))
        candidates = group[:-final_layers] if final_layers else group
        early = [r for r in group if 0 < r["relative_depth"] <= 0.5]
        late = [r for r in candidates if r["relative_depth"] > 0.5]
        low = [r for r in late if _upper(r) < threshold]
        early_max = max((r["z"] for r in early), default=float("nan"))
        collapsed = bool(low) and max((_lower(r) for r in early), default=float("nan")) > positive_z
        out.append(
            {
                "model": model,
                "revision": revision,
                "step": group[0].get("step"),
                "collapsed": collapsed,
                "zone_layers": ",".join(r["layer"] for r in low) if collapsed else "",
                "zone_start_depth": low[0]["relative_depth"] if collapsed else None,
                "zone_end_depth": low[-1]["relative_depth"] if collapsed else None,
                "zone_min_z": min(r["z"] for r in low) if collapsed else None,
                "early_max_z": early_max,
                "n_layers": len(group),
            }
        )
    return sorted(out, key=lambda r: (r["model"], r["step"] if r["step"] is not None else -1, r["revision"]))


@dataclass
class SweptPGA:
    rows: list[dict]  # this plan's PGA units, each with its revision's columns (JOINED and its step)
    zones: list[dict]  # one per (model, revision): collapse_zones
    collapse: Path  # results/collapse.parquet
    plots: list[Path]


def pga_sweep(console: Console, swept) -> SweptPGA:
    """What a sweep leaves of PGA beside its table (``swept``: raygeom.report.renderers.Swept): the collapse zones and
    plots of the plan's units, then the sweep table, the count of collapse zones and the files, on ``console``."""
    import pyarrow.parquet as pq

    from raygeom.store.tree import atomic_write_table

    settings, root = swept.settings, swept.plan.store.root
    mine = swept_rows(swept.plan, swept.revisions)
    zones = collapse_zones(mine, settings.collapse_threshold, settings.positive_z)
    collapse = root / "results" / "collapse.parquet"
    atomic_write_table(pa.Table.from_pylist(zones) if zones else pa.table({}), collapse)
    plots = []
    if settings.plots and mine:
        joined = pa.Table.from_pylist(mine)
        plots = plot_heatmaps(joined, root / "plots" / "heatmaps") + plot_depth_profiles(joined, root / "plots" / "by_revision")
    if mine:  # a job whose PGA is only in [analyses.pga] has its tables printed above, per setting
        console.print(sweep_table(mine, zones))
        collapsed = [z for z in zones if z["collapsed"]]
        console.print(f"collapse zones: {len(collapsed)} of {len(zones)} (model, revision) profiles")
        console.print(
            f"results: {swept.table} ({pq.read_metadata(swept.table).num_rows} rows)\nrevisions: {swept.revisions_table}\n"
            f"collapse: {collapse}\n"
            f"plots:   {len(plots)} in {root / 'plots'}",
            markup=False,
        )
    return SweptPGA(mine, zones, collapse, plots)
