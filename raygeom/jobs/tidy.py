"""A sweep's tidy table (one row per finished PGA unit, with model size, training step and integrity flags), its
collapse zones, and what a sweep leaves in its store: results/sweep_pga.parquet, results/collapse.parquet and the
plots."""

from __future__ import annotations

import pyarrow as pa

from raygeom.jobs.plan import SweepPlan
from raygeom.params import canonical_value
from raygeom.report.sweep_plots import plot_depth_profiles, plot_heatmaps
from raygeom.sources import revisions as pythia
from raygeom.store.manifest import IntegrityReport, integrity

# Column -> type of the sweep's tidy table: identity, the settings that made the row (provenance), the numbers
# with their uncertainty, and the integrity flags.
TIDY_SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("repo", pa.string()),
        ("size", pa.string()),
        ("deduped", pa.bool_()),
        ("params", pa.int64()),
        ("d", pa.int64()),
        ("revision", pa.string()),
        ("step", pa.int64()),
        ("layer", pa.string()),
        ("layer_index", pa.int64()),
        ("relative_depth", pa.float64()),
        ("corpus", pa.string()),
        ("corpus_fingerprint", pa.string()),
        ("n", pa.int64()),
        ("seq_len", pa.int64()),
        ("pool", pa.string()),
        ("skip_first", pa.bool_()),
        ("max_words", pa.int64()),
        ("k", pa.int64()),
        ("k_per_d", pa.float64()),
        ("r", pa.int64()),
        ("n_null", pa.int64()),
        ("seed", pa.int64()),
        ("raygeom_version", pa.string()),
        ("rho_readout", pa.float64()),
        ("null_mean", pa.float64()),
        ("null_std", pa.float64()),
        ("z", pa.float64()),
        ("z_se", pa.float64()),
        ("z_lo", pa.float64()),
        ("z_hi", pa.float64()),
        ("p_upper", pa.float64()),
        ("p_lower", pa.float64()),
        ("rho_texts_lo", pa.float64()),
        ("rho_texts_hi", pa.float64()),
        ("margin_texts_lo", pa.float64()),
        ("margin_texts_hi", pa.float64()),
        ("fingerprint", pa.string()),
        ("weights_flag", pa.string()),
        ("known_bad_note", pa.string()),
        ("unit_key", pa.string()),
    ]
)
TIDY_COLUMNS = tuple(TIDY_SCHEMA.names)


def tidy_table(plan: SweepPlan, report: IntegrityReport | None = None) -> pa.Table:
    """One row per finished unit of this plan, with model size, training step and integrity flags."""
    report = report or integrity(plan)
    keys = [unit for r in plan.revisions for layer, unit in r.units.items() if layer in r.done]
    table = plan.store.read_results("pga", keys) if keys else pa.table({})
    by_key = {(r.spec.slug, r.spec.revision): r for r in plan.revisions}
    out = []
    for row in table.to_pylist():
        revision = by_key[(row["model"], row["revision"])]
        spec = revision.spec
        size = pythia.size_of(spec.source)
        out.append(
            {
                **{c: row.get(c) for c in TIDY_COLUMNS},
                "repo": spec.source,
                "size": size.name if size else None,
                "deduped": spec.source.endswith("-deduped"),
                "params": revision.params,
                "step": spec.step,
                "k_per_d": canonical_value("k_per_d", row.get("k_per_d")),
                "weights_flag": report.flag(spec.name, spec.revision),
                "known_bad_note": report.notes.get((spec.name, spec.revision)),
            }
        )
    out.sort(
        key=lambda r: (
            r["params"] or 0,
            r["repo"],
            r["step"] if r["step"] is not None else -1,
            r["revision"],
            r["layer_index"],
            r.get("relative_depth") or 0.0,
        )
    )
    return pa.Table.from_pylist(out, schema=TIDY_SCHEMA)


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


def write_outputs(plan: SweepPlan, threshold: float = 0.0, positive_z: float = 2.0, plots: bool = True) -> dict:
    """The tidy table, the collapse table and the plots, all from the store."""
    from raygeom.store.tree import atomic_write_table

    report = integrity(plan)
    table = tidy_table(plan, report)
    root = plan.store.root
    atomic_write_table(table, root / "results" / "sweep_pga.parquet")
    zones = collapse_zones(table.to_pylist(), threshold, positive_z)
    atomic_write_table(pa.Table.from_pylist(zones) if zones else pa.table({}), root / "results" / "collapse.parquet")
    outputs = {
        "table": root / "results" / "sweep_pga.parquet",
        "collapse": root / "results" / "collapse.parquet",
        "zones": zones,
        "report": report,
        "rows": table.num_rows,
        "table_rows": table.to_pylist(),
        "plots": [],
    }
    if plots and table.num_rows:
        outputs["plots"] = plot_heatmaps(table, root / "plots" / "heatmaps") + plot_depth_profiles(
            table, root / "plots" / "by_revision"
        )
    return outputs
