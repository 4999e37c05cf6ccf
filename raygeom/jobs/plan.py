"""A sweep's plan over models x revisions x layers, from the store's point of view: each revision's layers and
unit keys, what is done, and the cost estimates (from measured unit times, or a reference GPU) and the null
budget of --n-null auto.

No Ray here (the sweep's Ray side is engine.orchestrate.run_sweep, driven by raygeom.jobs.run), so
`raygeom plan` and `raygeom status` read the store without starting or importing Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from raygeom.analyses.pga import PGA_VERSION, pga_unit_key  # noqa: F401 - part of the plan's API
from raygeom.jobs.passes import planned_labels, pooled_reader
from raygeom.params import AUTO_NULL_BLOCK as AUTO_FIRST_BLOCK
from raygeom.replica.request import READOUT_COMPONENTS, extraction_key
from raygeom.sources import revisions as pythia
from raygeom.sources.layers import layer_names, select_layers
from raygeom.sources.models import ModelSpec, cached_config, config_params
from raygeom.store.manifest import corpus_fingerprint
from raygeom.store.tree import Store


@dataclass
class RevisionPlan:
    spec: ModelSpec
    key: str
    layers: list[str]
    layers_from: str  # store | config | pythia table | unknown
    params: int | None
    units: dict[str, str]  # layer -> unit key
    extracted: bool
    done: set[str] = field(default_factory=set)
    marker: dict | None = None
    # Every planned analysis (raygeom.analyses.registry), by its label in planned_labels: layer -> unit key, and done keys
    analysis_units: dict[str, dict[str, str]] = field(default_factory=dict)
    analysis_done: dict[str, set[str]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        if self.analysis_units:
            return all(len(self.analysis_done.get(name, ())) == len(units) for name, units in self.analysis_units.items())
        return bool(self.units) and len(self.done) == len(self.units)


@dataclass
class SweepPlan:
    job: object  # JobSpec
    store: Store
    corpus_fingerprint: str
    revisions: list[RevisionPlan]
    # Planned analyses with an extraction of their own (registry: extraction != "pooled"): label -> (units, done)
    own: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def n_units(self) -> int:
        return sum(len(r.units) for r in self.revisions)

    @property
    def n_done(self) -> int:
        return sum(len(r.done) for r in self.revisions)

    def all_units(self) -> tuple[int, int]:
        """(units, done) of every planned analysis (the [pga] section's alone for a job without [analyses])."""
        per = self.per_analysis()
        if not per:
            return self.n_units, self.n_done
        return sum(t for t, _ in per.values()), sum(d for _, d in per.values())

    def per_analysis(self) -> dict[str, tuple[int, int]]:
        """Planned analysis label -> (units, done) over every revision."""
        out: dict[str, tuple[int, int]] = {}
        for revision in self.revisions:
            for name, units in revision.analysis_units.items():
                total, done = out.get(name, (0, 0))
                out[name] = (total + len(units), done + len(revision.analysis_done.get(name, ())))
        return {**out, **self.own}

    def by_model(self) -> dict[str, list[RevisionPlan]]:
        groups: dict[str, list[RevisionPlan]] = {}
        for revision in self.revisions:
            groups.setdefault(revision.spec.name, []).append(revision)
        return groups


def job_specs(job) -> list[ModelSpec]:
    """Every (model, revision) of the job. The run directory of the job's [train] gives the checkpoints the trainer
    writes (its plan), so a job can be checked and planned before training has made the directory."""
    return [spec for entry in job.models for spec in (_trained_specs(job, entry) or entry.specs())]


def _trained_specs(job, entry) -> list[ModelSpec] | None:
    from raygeom.sources.checkpoints import Checkpoint, RunDirectory

    if not entry.run_dir:
        return None
    source = Path(entry.source).expanduser().resolve()
    plan = next((p for p in (run.plan() for run in job.trains) if Path(p.run_dir) == source), None)
    if plan is None:
        return None
    root = Path(plan.run_dir)
    run = RunDirectory(root, tuple(Checkpoint(f"step{step}", step, root / f"step{step}") for step in plan.steps), ())
    return [ModelSpec(str(root), "checkpoint", checkpoint.label) for checkpoint in run.select(entry.revisions)]


def pooled_fingerprint(job, store: Store, specs: list[ModelSpec]) -> str:
    """The fingerprint of the pooled extraction's texts: the job's sample, or the text set its pooled pass reads."""
    if pooled_reader(job) is None:
        return corpus_fingerprint(job, store)
    from raygeom.jobs.passes import pooled_corpus
    from raygeom.sources.corpus import load_corpus

    return pooled_corpus(job, specs, load_corpus(job.corpus).sample(job.n_samples, job.sample_seed)).fingerprint()


def build_plan(job, store: Store | None = None, fingerprint: str | None = None, with_own: bool = True) -> SweepPlan:
    """``with_own``: count the units of the analyses with an extraction of their own too (False: the pooled ones only)."""
    store = store or Store(job.out)
    specs = job_specs(job)
    fingerprint = fingerprint or pooled_fingerprint(job, store, specs)
    plans = []
    params_of_model: dict[str, int] = {}
    every = planned_labels(job)
    labels = {label: item for label, item in every.items() if item.spec.extraction == "pooled"}
    own = {
        label: item.spec.planned_units(store, job, specs, item.params)
        for label, item in every.items()
        if with_own and item.spec.extraction != "pooled"
    }
    for spec in specs:
        key = extraction_key(spec, fingerprint, job.extraction, job.layers, READOUT_COMPONENTS)
        marker = store.completion(spec.slug, spec.revision, key)
        if marker is not None and marker.get("key") != key:
            marker = None
        size = pythia.size_of(spec.source)
        config = None if marker else cached_config(spec)
        if marker:
            layers, source, params = list(marker["layers"]), "store", marker.get("params")
        elif config and "num_hidden_layers" in config:
            layers, source, params = (
                select_layers(layer_names(config["num_hidden_layers"]), job.layers),
                "config",
                config_params(config),
            )
        elif size is not None:
            layers, source, params = select_layers(layer_names(size.n_blocks), job.layers), "pythia table", size.params
        else:
            layers, source, params = [], "unknown", None
        if params:
            params_of_model.setdefault(spec.source, params)
        units = {layer: pga_unit_key(key, layer, job.pga) for layer in layers}
        done = {layer for layer, unit in units.items() if store.has_result("pga", unit)}
        d = (marker or {}).get("d") or (config or {}).get("hidden_size") or (size.d if size else None)
        analysis_units = {
            label: {layer: item.spec.unit_key(key, layer, item.spec.for_width(item.params, d)) for layer in layers}
            for label, item in labels.items()
        }
        analysis_done = {
            label: {layer for layer, unit in keys.items() if store.has_result(labels[label].analysis, unit)}
            for label, keys in analysis_units.items()
        }
        plans.append(
            RevisionPlan(
                spec, key, layers, source, params, units, marker is not None, done, marker, analysis_units, analysis_done
            )
        )
    for plan in plans:  # revisions not yet loaded take the measured size of their model
        if plan.marker is None and plan.spec.source in params_of_model:
            measured = [p.marker.get("params") for p in plans if p.marker and p.spec.source == plan.spec.source]
            plan.params = next((m for m in measured if m), plan.params or params_of_model[plan.spec.source])
    return SweepPlan(job, store, fingerprint, plans, own)


# ------------------------------------------------------------------------------------ estimates


@dataclass
class CostEstimate:
    measured_extractions: int
    measured_units: int  # stored units of every planned analysis
    extract_rate: float | None  # device-seconds per (parameter x token) of forward pass
    load_rate: float | None  # seconds per parameter to load a revision
    pga_rate: float | None  # CPU-seconds per ((n_null + 1) x N^2)
    remaining_extract_seconds: float | None
    remaining_pga_seconds: float | None
    device: str
    stored: dict[str, int] = field(default_factory=dict)  # planned analysis label -> its stored units


def pga_units(plan: SweepPlan) -> list[tuple[object, str, bool]]:
    """(PGA parameters, unit key, stored) of every PGA unit the plan counts: a [pga] section's, or each grid point's
    of [analyses.pga]."""
    labels = planned_labels(plan.job)
    out = []
    for revision in plan.revisions:
        for label, units in revision.analysis_units.items():
            item = labels.get(label)
            if item is not None and item.analysis == "pga":
                done = revision.analysis_done.get(label, set())
                out += [(item.params, unit, layer in done) for layer, unit in units.items()]
    return out


def estimate(plan: SweepPlan) -> CostEstimate:
    """Scale measured unit times to the units still missing: forward passes by parameters x tokens,
    loading by parameters, PGA by (n_null + 1) x N^2 (all pairs of N samples for every subspace). The measured units
    are the stored units of every planned analysis; PGA's give its rate."""
    markers = [
        r.marker for r in plan.revisions if r.marker and r.marker.get("forward_seconds") is not None and r.marker.get("params")
    ]
    extract_rate = load_rate = None
    device = "none measured"
    if markers:
        extract_rate = sum(m["forward_seconds"] for m in markers) / sum(m["params"] * m["tokens"] for m in markers)
        load_rate = sum(m["load_seconds"] for m in markers) / sum(m["params"] for m in markers)
        device = ", ".join(sorted({m.get("device", "?") for m in markers}))
    units = pga_units(plan)
    keys = [unit for _, unit, done in units if done]
    pga_rate = None
    table = plan.store.read_results("pga", keys) if keys else pa.table({})
    if table.num_rows and "cpu_seconds" in table.column_names:
        rows = [row for row in table.select(["cpu_seconds", "n", "n_null"]).to_pylist() if row["cpu_seconds"] is not None]
        if rows:
            pga_rate = sum(r["cpu_seconds"] for r in rows) / sum((r["n_null"] + 1) * r["n"] ** 2 for r in rows)
    job = plan.job
    tokens = job.n_samples * job.extraction.seq_len
    if markers:  # measured tokens per sample beat the seq_len bound
        tokens = job.n_samples * sum(m["tokens"] for m in markers) / sum(m["n_samples"] for m in markers)
    todo = [r for r in plan.revisions if not r.extracted and not r.complete]
    remaining_extract = None
    if extract_rate is not None and all(r.params for r in todo):
        remaining_extract = sum(r.params * (tokens * extract_rate + load_rate) for r in todo)
    remaining_pga = None
    if pga_rate is not None:
        remaining_pga = pga_rate * sum((params.n_null + 1) * job.n_samples**2 for params, _, done in units if not done)
    stored = {label: done for label, (_, done) in plan.per_analysis().items()}
    return CostEstimate(
        len(markers), sum(stored.values()), extract_rate, load_rate, pga_rate, remaining_extract, remaining_pga, device, stored
    )


# CPU-seconds of one PGA unit (N=2000, k=100, CCR-1, 100 nulls) by width d, measured on one thread of a
# 2-core CI machine by `python bench/bench_sweep.py --estimate`; used by `raygeom plan` before a store has
# measured units of its own. Forward passes: an A100 at an assumed 40% of 312 fp16 TFLOPS.
REFERENCE_PGA_UNIT_SECONDS = {128: 6.9, 512: 6.7, 2048: 9.1, 5120: 11.9}
REFERENCE_GPU_FLOPS = 0.40 * 312e12
REFERENCE_LOAD_BYTES_PER_SECOND = 2e9


def reference_estimate(plan: SweepPlan) -> tuple[float, float] | None:
    """(GPU-seconds of extraction, CPU-seconds of PGA) for the missing units, from the reference rates."""
    job = plan.job
    widths = sorted(REFERENCE_PGA_UNIT_SECONDS)
    scale = (job.pga.n_null + 1) * job.n_samples**2 / (101 * 2000**2)
    gpu = cpu = 0.0
    for revision in plan.revisions:
        size = pythia.size_of(revision.spec.source)
        d = (revision.marker or {}).get("d") or (size.d if size else None)
        if revision.params is None or d is None:
            return None
        if not revision.extracted and not revision.complete:
            gpu += revision.params * (
                2 * job.n_samples * job.extraction.seq_len / REFERENCE_GPU_FLOPS + 2 / REFERENCE_LOAD_BYTES_PER_SECOND
            )
        unit = float(np.interp(d, widths, [REFERENCE_PGA_UNIT_SECONDS[w] for w in widths]))
        cpu += (len(revision.units) - len(revision.done)) * unit * scale
    return gpu, cpu


@dataclass
class AutoBudget:
    """What ``--n-null auto`` is expected to cost for the units still to compute (``auto_budget``)."""

    rule: str  # the stopping rule in words
    units: int  # units to compute
    fixed_nulls: int  # at the job's fixed n_null
    low_nulls: int  # every unit stops at its first block
    high_nulls: int  # every unit needs the most the rule can ask for Gaussian nulls (at |z| where the targets meet)
    expected_nulls: float | None  # from the pilot's z, for the units of models with a pilot
    pilot_rows: int  # stored units the expectation comes from
    pilot_units: int  # units to compute whose model has a pilot
    cpu_seconds: dict[str, float | None]  # fixed, low, high, expected (None where a rate or a width is unknown)


def _seconds_per_null(plan: SweepPlan, cost: CostEstimate | None) -> dict[str, float | None]:
    """CPU-seconds of one subspace scoring of a unit of each model revision: the store's measured rate x N^2,
    else the reference rate at the model's width (REFERENCE_PGA_UNIT_SECONDS, 101 scorings at N = 2000)."""
    n = plan.job.n_samples
    widths = sorted(REFERENCE_PGA_UNIT_SECONDS)
    out = {}
    for revision in plan.revisions:
        if cost is not None and cost.pga_rate is not None:
            out[revision.key] = cost.pga_rate * n**2
            continue
        size = pythia.size_of(revision.spec.source)
        d = (revision.marker or {}).get("d") or (size.d if size else None)
        out[revision.key] = (
            None
            if d is None
            else float(np.interp(d, widths, [REFERENCE_PGA_UNIT_SECONDS[w] for w in widths])) * (n / 2000) ** 2 / 101
        )
    return out


def pilot_z(store: Store) -> tuple[dict[tuple[str, str], tuple[float, float]], int]:
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


def auto_budget(plan: SweepPlan, cost: CostEstimate | None = None) -> AutoBudget:
    """Nulls and CPU time of ``--n-null auto`` under the job's rule (max(z_half_width, z_rel_width |z|), cap
    n_null_cap) for the units still missing: bounds for Gaussian nulls (the first block; the most the rule asks,
    900 at |z| = 5 for the defaults), and, where the store holds a pilot or an earlier run of the same model and
    layer, the expected count ``expected_auto_nulls(z, inflation)`` from its z."""
    from raygeom.numerics.uncertainty import expected_auto_nulls

    pga = plan.job.pga
    rule = {
        "target_half_width": pga.z_half_width,
        "relative_target": pga.z_rel_width or None,
        "cap": pga.n_null_cap,
        "min_null": AUTO_FIRST_BLOCK,
        "block": AUTO_FIRST_BLOCK,
        "decide_cap": pga.n_null_decide,
    }
    per_unit_high = float(expected_auto_nulls(np.linspace(0.0, 200.0, 20_001), **rule).max())
    per_null = _seconds_per_null(plan, cost)
    pilot, pilot_rows = pilot_z(plan.store)
    missing = [(r, layer) for r in plan.revisions for layer in r.layers if layer not in r.done]
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
        "fixed": cpu(lambda r, layer: pga.n_null),
        "low": cpu(lambda r, layer: AUTO_FIRST_BLOCK),
        "high": cpu(lambda r, layer: per_unit_high),
        "expected": cpu(lambda r, layer: expected.get((r.key, layer), 0.0)) if expected else None,
    }
    words = (
        (f"stop at max({pga.z_half_width:g}, {pga.z_rel_width:g} x |z|)" if pga.z_rel_width else f"stop at {pga.z_half_width:g}")
        + (f", on while 0 or ±2 is inside, up to {pga.n_null_decide:,}" if pga.n_null_decide else "")
        + f", cap {pga.n_null_cap:,}"
    )
    return AutoBudget(
        words,
        len(missing),
        pga.n_null * len(missing),
        AUTO_FIRST_BLOCK * len(missing),
        int(per_unit_high * len(missing)),
        sum(expected.values()) if expected else None,
        pilot_rows,
        len(expected),
        cpu_seconds,
    )


def format_seconds(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "unknown"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
