"""Sweeps over models x revisions x layers, from the store's point of view: unit keys, the plan,
progress, cost estimates from measured unit times, checkpoint integrity, the tidy results table,
collapse zones and the training-dynamics plots.

No Ray here (the sweep's Ray side is engine.orchestrate.run_sweep, driven by raygeom.jobs.pipeline), so
`raygeom plan` and `raygeom status` read the store without starting or importing Ray.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from raygeom.extras import has, note_missing
from raygeom.report.figures import figure_to_draw, pyplot, save_figure
from raygeom.sources import revisions as pythia
from raygeom.sources.corpus import Corpus
from raygeom.replica.request import READOUT_COMPONENTS, extraction_key
from raygeom.sources.layers import layer_names, select_layers
from raygeom.sources.models import ModelSpec
from raygeom.analyses.pga import PGA_VERSION, pga_unit_key  # noqa: F401 - part of the plan's API
from raygeom.params import AUTO_NULL_BLOCK as AUTO_FIRST_BLOCK
from raygeom.store.tree import Store, atomic_write_text, encode_segment, read_table

MANIFEST = "sweep/manifest.json"


# ------------------------------------------------------------------------------------------ plan

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


def _cached_config(spec: ModelSpec) -> dict | None:
    if spec.kind in ("local", "checkpoint"):
        path = spec.path / "config.json"
    elif spec.kind == "hub":
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(spec.source, "config.json", revision=spec.revision)
        path = Path(found) if isinstance(found, str) else None
    else:
        from raygeom.sources.models import known_config

        return known_config(spec)
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _config_params(config: dict) -> int | None:
    try:
        d, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    except KeyError:
        return None
    ffn = config.get("intermediate_size", 4 * d)
    tied = config.get("tie_word_embeddings", False)
    return int(layers * (4 * d * d + 2 * d * ffn) + vocab * d * (1 if tied else 2))


def corpus_manifest(job) -> dict:
    return {"corpus": job.corpus, "n_samples": job.n_samples, "sample_seed": job.sample_seed}


def write_manifest(store: Store, job, corpus: Corpus) -> None:
    atomic_write_text(json.dumps({**corpus_manifest(job), "fingerprint": corpus.fingerprint()}, indent=2),
                      store.root / MANIFEST)


def corpus_fingerprint(job, store: Store) -> str:
    """From the store's manifest when a run wrote one for this corpus, else by loading the corpus."""
    path = store.root / MANIFEST
    if path.is_file():
        try:
            manifest = json.loads(path.read_text())
            if {k: manifest.get(k) for k in corpus_manifest(job)} == corpus_manifest(job):
                return manifest["fingerprint"]
        except (OSError, json.JSONDecodeError, KeyError):
            pass
    from raygeom.sources.corpus import load_corpus

    return load_corpus(job.corpus).sample(job.n_samples, job.sample_seed).fingerprint()


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


def planned_labels(job) -> dict:
    """The job's planned analyses by a label that tells apart the grid points of one analysis (``pga r=5``)."""
    from dataclasses import fields

    planned = job.planned()
    labels = {}
    for item in planned:
        same = [other.params for other in planned if other.analysis == item.analysis]
        varying = [f.name for f in fields(item.params) if len({getattr(p, f.name) for p in same}) > 1]
        labels[" ".join([item.analysis, *(f"{name}={getattr(item.params, name)}" for name in varying)])] = item
    return labels


def build_plan(job, store: Store | None = None, fingerprint: str | None = None) -> SweepPlan:
    store = store or Store(job.out)
    fingerprint = fingerprint or corpus_fingerprint(job, store)
    plans = []
    params_of_model: dict[str, int] = {}
    every = planned_labels(job)
    labels = {label: item for label, item in every.items() if item.spec.extraction == "pooled"}
    specs = job_specs(job)
    own = {label: item.spec.planned_units(store, job, specs, item.params) for label, item in every.items()
           if item.spec.extraction != "pooled"}
    for spec in specs:
        key = extraction_key(spec, fingerprint, job.extraction, job.layers, READOUT_COMPONENTS)
        marker = store.completion(spec.slug, spec.revision, key)
        if marker is not None and marker.get("key") != key:
            marker = None
        size = pythia.size_of(spec.source)
        config = None if marker else _cached_config(spec)
        if marker:
            layers, source, params = list(marker["layers"]), "store", marker.get("params")
        elif config and "num_hidden_layers" in config:
            layers, source, params = select_layers(layer_names(config["num_hidden_layers"]), job.layers), "config", _config_params(config)
        elif size is not None:
            layers, source, params = select_layers(layer_names(size.n_blocks), job.layers), "pythia table", size.params
        else:
            layers, source, params = [], "unknown", None
        if params:
            params_of_model.setdefault(spec.source, params)
        units = {layer: pga_unit_key(key, layer, job.pga) for layer in layers}
        done = {layer for layer, unit in units.items() if store.has_result("pga", unit)}
        d = (marker or {}).get("d") or (config or {}).get("hidden_size") or (size.d if size else None)
        analysis_units = {label: {layer: item.spec.unit_key(key, layer, item.spec.for_width(item.params, d))
                                  for layer in layers} for label, item in labels.items()}
        analysis_done = {label: {layer for layer, unit in keys.items() if store.has_result(labels[label].analysis, unit)}
                         for label, keys in analysis_units.items()}
        plans.append(RevisionPlan(spec, key, layers, source, params, units, marker is not None, done, marker,
                                  analysis_units, analysis_done))
    for plan in plans:  # revisions not yet loaded take the measured size of their model
        if plan.marker is None and plan.spec.source in params_of_model:
            measured = [p.marker.get("params") for p in plans if p.marker and p.spec.source == plan.spec.source]
            plan.params = next((m for m in measured if m), plan.params or params_of_model[plan.spec.source])
    return SweepPlan(job, store, fingerprint, plans, own)


# ------------------------------------------------------------------------------------ integrity

@dataclass
class IntegrityReport:
    duplicates: dict[str, list[list[str]]]  # model -> groups of revisions with identical weights
    partial: dict[str, dict[str, tuple[str, float]]]  # model -> revision -> (other, share of tensors)
    notes: dict[tuple[str, str], str]  # (model, revision) -> known-bad note from the Pythia issues
    steps: dict[tuple[str, str], int | None] = field(default_factory=dict)  # (model, revision) -> training step

    def flag(self, model: str, revision: str) -> str | None:
        for group in self.duplicates.get(model, []):
            if revision in group:
                return "same weights as " + ", ".join(r for r in group if r != revision)
        if revision in self.partial.get(model, {}):
            other, share = self.partial[model][revision]
            return f"{share:.0%} of weight matrices identical to {other}"
        return None

    @property
    def flagged(self) -> list[tuple[str, str, str]]:
        out = []
        for model in sorted(set(self.duplicates) | set(self.partial)):
            revisions = {r for g in self.duplicates.get(model, []) for r in g} | set(self.partial.get(model, {}))
            step = lambda r: self.steps.get((model, r), pythia.step_of(r))  # noqa: E731
            for revision in sorted(revisions, key=lambda r: (step(r) if step(r) is not None else -1, r)):
                out.append((model, revision, self.flag(model, revision)))
        return out


def integrity(plan: SweepPlan) -> IntegrityReport:
    """Compare the weight fingerprints recorded when each revision was loaded, within each model."""
    duplicates, partial, notes, all_steps = {}, {}, {}, {}
    for model, revisions in plan.by_model().items():
        markers = {r.spec.revision: r.marker for r in revisions if r.marker}
        steps = {r.spec.revision: r.spec.step for r in revisions}
        all_steps.update({(model, rev): step for rev, step in steps.items()})
        groups = pythia.duplicate_groups({rev: m["fingerprint"] for rev, m in markers.items() if m.get("fingerprint")}, steps)
        if groups:
            duplicates[model] = groups
        shared = pythia.shared_tensors({rev: m["tensor_fingerprints"] for rev, m in markers.items() if m.get("tensor_fingerprints")},
                                       steps=steps)
        if shared:
            partial[model] = shared
        for r in revisions:
            note = pythia.known_bad_note(r.spec.source, r.spec.revision)
            if note:
                notes[(model, r.spec.revision)] = note
    return IntegrityReport(duplicates, partial, notes, all_steps)


# ------------------------------------------------------------------------------------ estimates

@dataclass
class CostEstimate:
    measured_extractions: int
    measured_units: int
    extract_rate: float | None  # device-seconds per (parameter x token) of forward pass
    load_rate: float | None  # seconds per parameter to load a revision
    pga_rate: float | None  # CPU-seconds per ((n_null + 1) x N^2)
    remaining_extract_seconds: float | None
    remaining_pga_seconds: float | None
    device: str


def estimate(plan: SweepPlan) -> CostEstimate:
    """Scale measured unit times to the units still missing: forward passes by parameters x tokens,
    loading by parameters, PGA by (n_null + 1) x N^2 (all pairs of N samples for every subspace)."""
    markers = [r.marker for r in plan.revisions if r.marker and r.marker.get("forward_seconds") is not None and r.marker.get("params")]
    extract_rate = load_rate = None
    device = "none measured"
    if markers:
        extract_rate = sum(m["forward_seconds"] for m in markers) / sum(m["params"] * m["tokens"] for m in markers)
        load_rate = sum(m["load_seconds"] for m in markers) / sum(m["params"] for m in markers)
        device = ", ".join(sorted({m.get("device", "?") for m in markers}))
    keys = [unit for r in plan.revisions for layer, unit in r.units.items() if layer in r.done]
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
    missing_units = sum(len(r.units) - len(r.done) for r in plan.revisions)
    remaining_pga = pga_rate * missing_units * (job.pga.n_null + 1) * job.n_samples ** 2 if pga_rate is not None else None
    return CostEstimate(len(markers), len(keys), extract_rate, load_rate, pga_rate, remaining_extract, remaining_pga, device)


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
    scale = (job.pga.n_null + 1) * job.n_samples ** 2 / (101 * 2000 ** 2)
    gpu = cpu = 0.0
    for revision in plan.revisions:
        size = pythia.size_of(revision.spec.source)
        d = (revision.marker or {}).get("d") or (size.d if size else None)
        if revision.params is None or d is None:
            return None
        if not revision.extracted and not revision.complete:
            gpu += revision.params * (2 * job.n_samples * job.extraction.seq_len / REFERENCE_GPU_FLOPS
                                      + 2 / REFERENCE_LOAD_BYTES_PER_SECOND)
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
        out[revision.key] = None if d is None else float(
            np.interp(d, widths, [REFERENCE_PGA_UNIT_SECONDS[w] for w in widths])) * (n / 2000) ** 2 / 101
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
        ratios = [(r["z_se"] / np.sqrt((1 + r["z"] ** 2 / 2) / r["n_null"])) ** 2 for r in group
                  if r.get("z_se") is not None and np.isfinite(r["z_se"]) and r["n_null"]]
        out[key] = (float(np.median([r["z"] for r in group])), float(np.median(ratios)) if ratios else 1.0)
    return out, sum(len(group) for group in groups.values())


def auto_budget(plan: SweepPlan, cost: CostEstimate | None = None) -> AutoBudget:
    """Nulls and CPU time of ``--n-null auto`` under the job's rule (max(z_half_width, z_rel_width |z|), cap
    n_null_cap) for the units still missing: bounds for Gaussian nulls (the first block; the most the rule asks,
    900 at |z| = 5 for the defaults), and, where the store holds a pilot or an earlier run of the same model and
    layer, the expected count ``expected_auto_nulls(z, inflation)`` from its z."""
    from raygeom.numerics.uncertainty import expected_auto_nulls

    pga = plan.job.pga
    rule = {"target_half_width": pga.z_half_width, "relative_target": pga.z_rel_width or None, "cap": pga.n_null_cap,
            "min_null": AUTO_FIRST_BLOCK, "block": AUTO_FIRST_BLOCK, "decide_cap": pga.n_null_decide}
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

    cpu_seconds = {"fixed": cpu(lambda r, layer: pga.n_null), "low": cpu(lambda r, layer: AUTO_FIRST_BLOCK),
                   "high": cpu(lambda r, layer: per_unit_high),
                   "expected": cpu(lambda r, layer: expected.get((r.key, layer), 0.0)) if expected else None}
    words = (f"stop at max({pga.z_half_width:g}, {pga.z_rel_width:g} x |z|)" if pga.z_rel_width
             else f"stop at {pga.z_half_width:g}") + (f", on while 0 or ±2 is inside, up to {pga.n_null_decide:,}"
                                                       if pga.n_null_decide else "") + f", cap {pga.n_null_cap:,}"
    return AutoBudget(words, len(missing), pga.n_null * len(missing), AUTO_FIRST_BLOCK * len(missing),
                      int(per_unit_high * len(missing)), sum(expected.values()) if expected else None, pilot_rows,
                      len(expected), cpu_seconds)


def full_suite_estimate(extract_rate_gpu: float, load_seconds_per_param: float, pga_unit_seconds, n_samples: int = 2000,
                        seq_len: int = 128, gpus: int = 8, deduped: bool = False) -> dict:
    """Every Pythia size x 154 revisions x all layers (see docs/sweeps.md). ``extract_rate_gpu``: GPU-seconds
    per parameter-token of forward pass; ``pga_unit_seconds(d)``: CPU-seconds of one PGA unit at width d."""
    revisions = len(pythia.PYTHIA_REVISIONS) * (2 if deduped else 1)
    sizes = pythia.PYTHIA_SIZES.values()
    params = sum(s.params for s in sizes)
    forward = extract_rate_gpu * params * n_samples * seq_len * revisions
    load = load_seconds_per_param * params * revisions
    pga_cpu = sum(s.n_layers * pga_unit_seconds(s.d) for s in sizes) * revisions
    return {"revisions_per_model": revisions, "total_params": params, "units": sum(s.n_layers for s in sizes) * revisions,
            "forward_gpu_hours": forward / 3600, "load_gpu_hours": load / 3600,
            "extract_gpu_hours": (forward + load) / 3600, "pga_cpu_hours": pga_cpu / 3600,
            "node_wall_hours": (forward + load) / 3600 / gpus}


# ------------------------------------------------------------------------------- tidy table, plots

# Column -> type of the sweep's tidy table: identity, the settings that made the row (provenance), the numbers
# with their uncertainty, and the integrity flags.
TIDY_SCHEMA = pa.schema([
    ("model", pa.string()), ("repo", pa.string()), ("size", pa.string()), ("deduped", pa.bool_()), ("params", pa.int64()),
    ("d", pa.int64()), ("revision", pa.string()), ("step", pa.int64()), ("layer", pa.string()), ("layer_index", pa.int64()),
    ("relative_depth", pa.float64()), ("corpus", pa.string()), ("corpus_fingerprint", pa.string()), ("n", pa.int64()),
    ("seq_len", pa.int64()), ("pool", pa.string()), ("skip_first", pa.bool_()), ("max_words", pa.int64()),
    ("k", pa.int64()), ("r", pa.int64()), ("n_null", pa.int64()), ("seed", pa.int64()), ("raygeom_version", pa.string()),
    ("rho_readout", pa.float64()), ("null_mean", pa.float64()), ("null_std", pa.float64()), ("z", pa.float64()),
    ("z_se", pa.float64()), ("z_lo", pa.float64()), ("z_hi", pa.float64()), ("p_upper", pa.float64()),
    ("p_lower", pa.float64()), ("rho_texts_lo", pa.float64()), ("rho_texts_hi", pa.float64()),
    ("margin_texts_lo", pa.float64()), ("margin_texts_hi", pa.float64()),
    ("fingerprint", pa.string()), ("weights_flag", pa.string()), ("known_bad_note", pa.string()), ("unit_key", pa.string())])
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
        out.append({**{c: row.get(c) for c in TIDY_COLUMNS}, "repo": spec.source,
                    "size": size.name if size else None, "deduped": spec.source.endswith("-deduped"),
                    "params": revision.params, "step": spec.step,
                    "weights_flag": report.flag(spec.name, spec.revision),
                    "known_bad_note": report.notes.get((spec.name, spec.revision))})
    out.sort(key=lambda r: (r["params"] or 0, r["repo"], r["step"] if r["step"] is not None else -1, r["revision"], r["layer_index"],
                        r.get("relative_depth") or 0.0))
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
        out.append({"model": model, "revision": revision, "step": group[0].get("step"), "collapsed": collapsed,
                    "zone_layers": ",".join(r["layer"] for r in low) if collapsed else "",
                    "zone_start_depth": low[0]["relative_depth"] if collapsed else None,
                    "zone_end_depth": low[-1]["relative_depth"] if collapsed else None,
                    "zone_min_z": min(r["z"] for r in low) if collapsed else None, "early_max_z": early_max,
                    "n_layers": len(group)})
    return sorted(out, key=lambda r: (r["model"], r["step"] if r["step"] is not None else -1, r["revision"]))




def _step_edges(steps: list[int]) -> np.ndarray:
    """Cell edges on a log(step + 1) axis: geometric midpoints, so log-spaced and linear steps both show."""
    x = np.log(np.asarray(steps, dtype=float) + 1.0)
    if len(x) == 1:
        return np.exp(np.array([x[0] - 0.5, x[0] + 0.5]))
    mid = (x[1:] + x[:-1]) / 2
    return np.exp(np.concatenate([[x[0] - (mid[0] - x[0])], mid, [x[-1] + (x[-1] - mid[-1])]]))


def _step_ticks(steps: list[int]) -> list[int]:
    """0, the powers of ten inside the range, and the last step."""
    ticks = [t for t in (0, *(10**i for i in range(9))) if steps[0] <= t <= steps[-1]]
    if steps[-1] not in ticks and (not ticks or np.log(steps[-1] + 1) - np.log(ticks[-1] + 1) > 0.35):
        ticks.append(steps[-1])
    return ticks


def _step_label(step: int) -> str:
    return f"{step / 1000:g}k" if step >= 1000 else str(step)


def plot_heatmaps(table: pa.Table, directory: Path) -> list[Path]:
    """Per model: z over (training step x layer); x is log(step + 1), revisions with flagged weights hatched.
    A model with revisions that have no training step gets one column per revision, labelled by name. Without
    matplotlib (the [report] extra), none."""
    if not has("matplotlib"):
        note_missing("matplotlib", "no plots drawn")
        return []
    plt = pyplot()
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.ticker import NullLocator

    rows = table.to_pylist()
    paths = []
    for model in sorted({r["model"] for r in rows}):
        group = [r for r in rows if r["model"] == model]
        path = directory / f"heatmap_{model.replace('/', '--')}.png"
        key, drawn = figure_to_draw(path, plot_heatmaps, (model, group))
        if drawn:
            paths.append(path)
            continue
        by_step = all(r["step"] is not None for r in group)
        if by_step:
            columns = sorted({r["step"] for r in group})
            column_of = lambda r: r["step"]  # noqa: E731
        else:
            columns = list(dict.fromkeys(r["revision"] for r in group))
            column_of = lambda r: r["revision"]  # noqa: E731
        depth = {r["layer"]: r.get("relative_depth") or 0.0 for r in group}  # points inside a block share its index
        layers = sorted({(r["layer_index"], r["layer"]) for r in group}, key=lambda pair: (pair[0], depth[pair[1]], pair[1]))
        grid = np.full((len(layers), len(columns)), np.nan)
        for r in group:
            grid[layers.index((r["layer_index"], r["layer"])), columns.index(column_of(r))] = r["z"]
        finite = grid[np.isfinite(grid)]
        bound = max(1e-6, float(np.abs(finite).max())) if finite.size else 1.0
        fig, ax = plt.subplots(figsize=(9, max(3.0, 0.22 * len(layers) + 1.5)), dpi=110)
        edges = _step_edges(columns) if by_step else np.arange(len(columns) + 1) - 0.5
        mesh = ax.pcolormesh(edges, np.arange(len(layers) + 1) - 0.5, grid, cmap="RdBu_r",
                             norm=TwoSlopeNorm(0.0, -bound, bound), shading="flat")
        if by_step:
            ax.set_xscale("log")
            ticks = _step_ticks(columns)
            ax.set_xticks([t + 1 for t in ticks], [_step_label(t) for t in ticks])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xlabel("training step (log scale; hatched: weights duplicate another revision's)")
        else:
            ax.set_xticks(range(len(columns)), columns, rotation=45, ha="right", fontsize=7)
            ax.set_xlabel("revision (no training step known; hatched: weights duplicate another revision's)")
        ax.set_yticks(range(len(layers)), [name for _, name in layers], fontsize=6)
        for column in sorted({column_of(r) for r in group if r["weights_flag"]}, key=columns.index):
            i = columns.index(column)
            ax.axvspan(edges[i], edges[i + 1], fill=False, hatch="xx", edgecolor="black", lw=0)
        # A dot marks a cell whose 95 % interval of z crosses 0: its sign is not established.
        unsure = [r for r in group if r.get("z_lo") is not None and r.get("z_hi") is not None and r["z_lo"] <= 0 <= r["z_hi"]]
        if unsure:
            centres = [(edges[columns.index(column_of(r))] * edges[columns.index(column_of(r)) + 1]) ** 0.5 if by_step
                       else columns.index(column_of(r)) for r in unsure]
            ax.scatter(centres, [layers.index((r["layer_index"], r["layer"])) for r in unsure], s=4, c="black",
                       marker="o", lw=0, label="95 % interval of z crosses 0")
            ax.legend(loc="upper left", bbox_to_anchor=(0, -0.12), fontsize=6, frameon=False)
        ax.set_ylabel("layer")
        ax.set_title(f"Subspace PGA z over training: {model}")
        fig.colorbar(mesh, ax=ax, label="z")
        fig.tight_layout()
        paths.append(save_figure(fig, path, key))
    return paths


def plot_depth_profiles(table: pa.Table, directory: Path) -> list[Path]:
    """Per revision: z against relative depth, one line per model, coloured by size (the paper's figure). Without
    matplotlib (the [report] extra), none."""
    if not has("matplotlib"):
        note_missing("matplotlib", "no plots drawn")
        return []
    plt = pyplot()
    rows = table.to_pylist()
    params = sorted({r["params"] or 0 for r in rows})
    colour = plt.get_cmap("viridis")
    paths = []
    steps = {r["revision"]: r["step"] for r in rows}
    for revision in sorted(steps, key=lambda v: (steps[v] if steps[v] is not None else -1, v)):
        group = [r for r in rows if r["revision"] == revision]
        path = directory / f"z_vs_depth_{encode_segment(str(revision))}.png"  # a revision may hold '/' or '..'
        key, drawn = figure_to_draw(path, plot_depth_profiles, (revision, params, group))
        if drawn:
            paths.append(path)
            continue
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
        for model in sorted({r["model"] for r in group}, key=lambda m: next(r["params"] or 0 for r in group if r["model"] == m)):
            line = sorted((r for r in group if r["model"] == model), key=lambda r: r["relative_depth"])
            p = line[0]["params"] or 0
            shade = colour(params.index(p) / max(1, len(params) - 1))
            label = f"{line[0]['size'] or model} (d={line[0]['d']})" + (" [weights flagged]" if line[0]["weights_flag"] else "")
            ax.plot([r["relative_depth"] for r in line], [r["z"] for r in line], marker="o", ms=2.5, color=shade, label=label,
                    ls="--" if line[0]["weights_flag"] else "-")
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xlabel("relative depth (embedding = 0, final norm = 1)")
        ax.set_ylabel("z")
        ax.set_title(f"Subspace PGA by depth at {revision}")
        ax.legend(fontsize=6)
        fig.tight_layout()
        paths.append(save_figure(fig, path, key))
    return paths


def write_outputs(plan: SweepPlan, threshold: float = 0.0, positive_z: float = 2.0, plots: bool = True) -> dict:
    """The tidy table, the collapse table and the plots, all from the store."""
    from raygeom.store.tree import atomic_write_table

    report = integrity(plan)
    table = tidy_table(plan, report)
    root = plan.store.root
    atomic_write_table(table, root / "results" / "sweep_pga.parquet")
    zones = collapse_zones(table.to_pylist(), threshold, positive_z)
    atomic_write_table(pa.Table.from_pylist(zones) if zones else pa.table({}), root / "results" / "collapse.parquet")
    outputs = {"table": root / "results" / "sweep_pga.parquet", "collapse": root / "results" / "collapse.parquet",
               "zones": zones, "report": report, "rows": table.num_rows, "table_rows": table.to_pylist(), "plots": []}
    if plots and table.num_rows:
        outputs["plots"] = plot_heatmaps(table, root / "plots" / "heatmaps") + plot_depth_profiles(table, root / "plots" / "by_revision")
    return outputs


def read_tidy(path: str | Path) -> pa.Table:
    return read_table(Path(path))


def format_seconds(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "unknown"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
