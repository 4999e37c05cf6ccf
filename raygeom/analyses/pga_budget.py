"""What PGA costs in ``raygeom plan``: its reference rate before a store has measured units, and the null budget of
``n_null = "auto"`` for the units still to compute (bounds for Gaussian nulls, and the expected count from a pilot's
z). Reads the plan duck-typed (``plan.job``, ``plan.revisions``, ``plan.store``), so it imports nothing of jobs/."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from raygeom.params import AUTO_NULL_BLOCK as AUTO_FIRST_BLOCK

# CPU-seconds of one PGA unit (N=2000, k=100, CCR-1, 100 nulls) by width d, measured on one thread of a 2-core CI
# machine by `python bench/bench_sweep.py --estimate`; used by `raygeom plan` before a store has measured units.
REFERENCE_PGA_UNIT_SECONDS = {128: 6.9, 512: 6.7, 2048: 9.1, 5120: 11.9}
REFERENCE_SCORINGS = 101 * 2000**2  # (n_null + 1) x N^2 of the reference unit


def reference_seconds_per_work(d: int) -> float:
    """CPU-seconds per (n_null + 1) x N^2 at width ``d`` (interpolated between the measured widths)."""
    widths = sorted(REFERENCE_PGA_UNIT_SECONDS)
    return float(np.interp(d, widths, [REFERENCE_PGA_UNIT_SECONDS[w] for w in widths])) / REFERENCE_SCORINGS


@dataclass
class AutoBudget:
    """What ``n_null = "auto"`` is expected to cost for the units still to compute (:func:`auto_budget`)."""

    rule: str  # the stopping rule in words
    units: int  # units to compute
    fixed_nulls: int  # at the job's fixed n_null
    low_nulls: int  # every unit stops at its first block
    high_nulls: int  # every unit needs the most the rule can ask for Gaussian nulls (at |z| where the targets meet)
    expected_nulls: float | None  # from the pilot's z, for the units of models with a pilot
    pilot_rows: int  # stored units the expectation comes from
    pilot_units: int  # units to compute whose model has a pilot
    cpu_seconds: dict[str, float | None]  # fixed, low, high, expected (None where a rate or a width is unknown)


def pilot_z(store) -> tuple[dict[tuple[str, str], tuple[float, float]], int]:
    """(model, layer) -> (median z, median (z_se / delta-method se)^2) over every intact PGA unit of the store (a pilot
    of 100 nulls per unit, or any earlier run of the same model), and the number of rows behind it."""
    table = store.read_results("pga") if (store.root / "results" / "pga").is_dir() else pa.table({})
    if not table.num_rows or not {"model", "layer", "z", "n_null"} <= set(table.column_names):
        return {}, 0
    rows = table.select([c for c in ("model", "layer", "z", "z_se", "n_null") if c in table.column_names]).to_pylist()
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        if row["z"] is not None and np.isfinite(row["z"]):
            groups.setdefault((row["model"], row["layer"]), []).append(row)
    out = {}
    for key, group in groups.items():
        ratios = [
            (r["z_se"] / np.sqrt((1 + r["z"] ** 2 / 2) / r["n_null"])) ** 2
            for r in group
            if r.get("z_se") is not None and np.isfinite(r["z_se"]) and r["n_null"]
        ]
        out[key] = (float(np.median([r["z"] for r in group])), float(np.median(ratios)) if ratios else 1.0)
    return out, sum(len(group) for group in groups.values())


def auto_budget(plan, params, missing: list[tuple[object, str]], rate: float | None = None) -> AutoBudget:
    """Nulls and CPU time of ``n_null = "auto"`` under ``params``' rule (max(z_half_width, z_rel_width |z|), cap
    n_null_cap) for the ``missing`` (revision plan, layer) units: bounds for Gaussian nulls (the first block; the
    most the rule asks, 900 at |z| = 5 for the defaults), and, where the store holds a pilot or an earlier run of the
    same model and layer, the expected count ``expected_auto_nulls(z, inflation)`` from its z. ``rate``: the store's
    measured CPU-seconds per (n_null + 1) x N^2, else the reference rate at each revision's width."""
    from raygeom.numerics.uncertainty import expected_auto_nulls

    rule = {
        "target_half_width": params.z_half_width,
        "relative_target": params.z_rel_width or None,
        "cap": params.n_null_cap,
        "min_null": AUTO_FIRST_BLOCK,
        "block": AUTO_FIRST_BLOCK,
        "decide_cap": params.n_null_decide,
    }
    per_unit_high = float(expected_auto_nulls(np.linspace(0.0, 200.0, 20_001), **rule).max())

    def per_scoring(revision) -> float | None:  # CPU-seconds of one subspace's Spearman over all N^2 pairs
        per_work = rate if rate is not None else None if revision.d is None else reference_seconds_per_work(revision.d)
        return None if per_work is None else per_work * plan.job.n_samples**2

    per_null = {r.key: per_scoring(r) for r, _ in missing}
    pilot, pilot_rows = pilot_z(plan.store)
    expected = {}
    for revision, layer in missing:
        if (revision.spec.slug, layer) in pilot:
            z, inflation = pilot[(revision.spec.slug, layer)]
            expected[(revision.key, layer)] = float(expected_auto_nulls(z, inflation=inflation, **rule))
    known = all(per_null[r.key] is not None for r, _ in missing)

    def cpu(per_unit) -> float | None:
        if not known:
            return None
        return sum(per_null[r.key] * (per_unit(r, layer) + 1) for r, layer in missing)

    cpu_seconds = {
        "fixed": cpu(lambda r, layer: params.n_null),
        "low": cpu(lambda r, layer: AUTO_FIRST_BLOCK),
        "high": cpu(lambda r, layer: per_unit_high),
        "expected": cpu(lambda r, layer: expected.get((r.key, layer), 0.0)) if expected else None,
    }
    words = (
        (
            f"stop at max({params.z_half_width:g}, {params.z_rel_width:g} x |z|)"
            if params.z_rel_width
            else f"stop at {params.z_half_width:g}"
        )
        + (f", on while 0 or ±2 is inside, up to {params.n_null_decide:,}" if params.n_null_decide else "")
        + f", cap {params.n_null_cap:,}"
    )
    return AutoBudget(
        words,
        len(missing),
        params.n_null * len(missing),
        AUTO_FIRST_BLOCK * len(missing),
        int(per_unit_high * len(missing)),
        sum(expected.values()) if expected else None,
        pilot_rows,
        len(expected),
        cpu_seconds,
    )


def job_budget(plan, rate: float | None = None) -> AutoBudget | None:
    """:func:`auto_budget` of the plan's PGA grid points with ``n_null = "auto"`` (None: it has none), over their
    units still missing, under the first such point's rule."""
    labels = {label: item for label, item in plan.planned_labels().items() if item.analysis == "pga" and item.params.n_null_auto}
    if not labels:
        return None
    missing = [
        (revision, layer)
        for revision in plan.revisions
        for label, units in revision.analysis_units.items()
        if label in labels
        for layer in units
        if layer not in revision.analysis_done.get(label, set())
    ]
    return auto_budget(plan, next(iter(labels.values())).params, missing, rate)


def budget_lines(budget: AutoBudget) -> list[str]:
    """The nulls and CPU time ``n_null = "auto"`` takes for the units to compute, as ``raygeom plan`` prints them."""

    def hours(key: str) -> str:
        value = budget.cpu_seconds[key]
        return "? CPU-h" if value is None else f"{value / 3600:,.0f} CPU-h"

    if not budget.units:
        return []
    lines = [
        f"--n-null auto ({budget.rule}) for the {budget.units:,} units to compute:",
        f"  pga: {budget.low_nulls:,} to {budget.high_nulls:,} nulls ({budget.low_nulls // budget.units:,} to "
        f"{budget.high_nulls // budget.units:,} per unit for Gaussian nulls), {hours('low')} to {hours('high')}; "
        f"fixed --n-null: {budget.fixed_nulls:,} nulls, {hours('fixed')}",
    ]
    if budget.expected_nulls is None:
        lines.append(
            "  expected: no pilot in this store; run 100 nulls per unit on a few revisions of each model "
            "(`raygeom run JOB --n-null 100`), then plan again"
        )
    else:
        lines.append(
            f"  expected from the z of {budget.pilot_rows:,} stored units (a pilot or an earlier run of the same "
            f"model and layer): {budget.expected_nulls:,.0f} nulls for {budget.pilot_units:,} of the "
            f"{budget.units:,} units, {hours('expected')} (the need (1.96 / h)^2 (1 + z^2/2) at the stop half-width h, "
            "times the pilot's (z_se / delta-method se)^2, in blocks of 100; docs/METRICS.md)"
        )
    return lines
