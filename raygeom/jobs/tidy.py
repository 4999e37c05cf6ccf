"""What a sweep leaves in its store beside its unit rows: results/pga.parquet (the PGA table, written by the one table
writer exactly as a run writes it), results/revisions.parquet (one row per (model, revision): Pythia size, parameters,
training step and the integrity flags), results/collapse.parquet (the collapse zones) and the plots."""

from __future__ import annotations

import pyarrow as pa

from raygeom.jobs.plan import SweepPlan
from raygeom.params import canonical_value
from raygeom.report.sweep_plots import plot_depth_profiles, plot_heatmaps
from raygeom.sources import revisions as pythia
from raygeom.store.manifest import IntegrityReport, integrity

REVISIONS_TABLE = "revisions.parquet"
# Column -> type of results/revisions.parquet: a (model, revision) as the PGA table names it, what the sweep knows
# of it beside its rows (the hub repo, Pythia size, parameters, training step) and its integrity flags.
REVISIONS_SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("revision", pa.string()),
        ("repo", pa.string()),
        ("size", pa.string()),
        ("deduped", pa.bool_()),
        ("params", pa.int64()),
        ("step", pa.int64()),
        ("weights_flag", pa.string()),
        ("known_bad_note", pa.string()),
    ]
)
REVISION_COLUMNS = tuple(REVISIONS_SCHEMA.names)
# The columns the sweep's plots, collapse zones and console table add to a PGA row (from its revision's row)
JOINED = ("repo", "size", "deduped", "params", "weights_flag", "known_bad_note")


def revisions_rows(plan: SweepPlan, report: IntegrityReport | None = None) -> list[dict]:
    """One row per (model, revision) of this plan, in size and step order."""
    report = report or integrity(plan)
    out = []
    for revision in plan.revisions:
        spec = revision.spec
        size = pythia.size_of(spec.source)
        out.append(
            {
                "model": spec.slug,
                "revision": spec.revision,
                "repo": spec.source,
                "size": size.name if size else None,
                "deduped": spec.source.endswith("-deduped"),
                "params": revision.params,
                "step": spec.step,
                "weights_flag": report.flag(spec.name, spec.revision),
                "known_bad_note": report.notes.get((spec.name, spec.revision)),
            }
        )
    return sorted(out, key=lambda r: (r["params"] or 0, r["repo"], r["step"] if r["step"] is not None else -1, r["revision"]))


def plan_rows(plan: SweepPlan, revisions: list[dict]) -> list[dict]:
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


def write_outputs(
    plan: SweepPlan,
    rows: list[dict] | None = None,
    threshold: float = 0.0,
    positive_z: float = 2.0,
    plots: bool = True,
    pga: bool = True,
) -> dict:
    """results/pga.parquet through the one table writer, as a run writes it (every PGA row of the store; ``rows``:
    this sweep's PGA rows, whose degenerate ones are not stored; ``pga``: whether the job plans PGA, else no table),
    results/revisions.parquet, the collapse table and the plots (these three of this plan's units), all from the
    store."""
    from raygeom.analyses.results_table import write_results_table
    from raygeom.store.tree import atomic_write_table

    report = integrity(plan)
    root = plan.store.root
    revisions = revisions_rows(plan, report)
    mine = plan_rows(plan, revisions)
    table = write_results_table(plan.store, "pga", list(rows or [])) if pga or mine else None
    atomic_write_table(pa.Table.from_pylist(revisions, schema=REVISIONS_SCHEMA), root / "results" / REVISIONS_TABLE)
    zones = collapse_zones(mine, threshold, positive_z)
    atomic_write_table(pa.Table.from_pylist(zones) if zones else pa.table({}), root / "results" / "collapse.parquet")
    outputs = {
        "table": table,
        "table_count": _count(table),
        "revisions": root / "results" / REVISIONS_TABLE,
        "collapse": root / "results" / "collapse.parquet",
        "zones": zones,
        "report": report,
        "rows": len(mine),
        "table_rows": mine,
        "plots": [],
    }
    if plots and mine:
        joined = pa.Table.from_pylist(mine)
        outputs["plots"] = plot_heatmaps(joined, root / "plots" / "heatmaps") + plot_depth_profiles(
            joined, root / "plots" / "by_revision"
        )
    return outputs


def _count(path) -> int:
    import pyarrow.parquet as pq

    return pq.read_metadata(path).num_rows if path is not None else 0
