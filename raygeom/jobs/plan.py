"""A job's plan over models x revisions x layers, from the store's point of view: each revision's layers and the unit
keys of every planned analysis, what is done, and the cost estimates: forward passes from measured extractions (or
a reference GPU), and each analysis from the CPU-seconds the engine measured on its stored units, scaled by the work
it declares (``Analysis.work``; before any is measured, its ``reference_seconds``). What an analysis adds to the plan
of its own (PGA: the null budget of ``n_null = "auto"``) is its ``plan_lines``.

No Ray here (the sweep's Ray side is engine.orchestrate.run_sweep, driven by raygeom.jobs.run), so
`raygeom plan` and `raygeom status` read the store without starting or importing Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pyarrow as pa

from raygeom.analyses import registry
from raygeom.jobs.passes import planned_labels, pooled_reader
from raygeom.replica.request import READOUT_COMPONENTS, extraction_key
from raygeom.sources import revisions as pythia
from raygeom.sources.layers import layer_names, select_layers
from raygeom.sources.models import ModelSpec, cached_config, config_params
from raygeom.store.manifest import corpus_fingerprint
from raygeom.store.tree import Store, read_table


@dataclass
class RevisionPlan:
    spec: ModelSpec
    key: str
    layers: list[str]
    layers_from: str  # store | config | pythia table | unknown
    params: int | None
    d: int | None  # width: the store's, the config's or the Pythia table's
    extracted: bool
    marker: dict | None = None
    # Every planned analysis (raygeom.analyses.registry), by its label in planned_labels: layer -> unit key, and done keys
    analysis_units: dict[str, dict[str, str]] = field(default_factory=dict)
    analysis_done: dict[str, set[str]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Every unit of every planned analysis that reads this revision's pooled extraction is stored."""
        return all(len(self.analysis_done.get(name, ())) == len(units) for name, units in self.analysis_units.items())


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
        return self.all_units()[0]

    @property
    def n_done(self) -> int:
        return self.all_units()[1]

    def all_units(self) -> tuple[int, int]:
        """(units, done) of every planned analysis."""
        per = self.per_analysis()
        return sum(t for t, _ in per.values()), sum(d for _, d in per.values())

    def per_analysis(self) -> dict[str, tuple[int, int]]:
        """Planned analysis label -> (units, done) over every revision."""
        out: dict[str, tuple[int, int]] = {}
        for revision in self.revisions:
            for name, units in revision.analysis_units.items():
                total, done = out.get(name, (0, 0))
                out[name] = (total + len(units), done + len(revision.analysis_done.get(name, ())))
        return {**out, **self.own}

    def planned_labels(self) -> dict:
        """The job's planned analyses by label (:func:`raygeom.jobs.passes.planned_labels`)."""
        return planned_labels(self.job)

    def by_model(self) -> dict[str, list[RevisionPlan]]:
        groups: dict[str, list[RevisionPlan]] = {}
        for revision in self.revisions:
            groups.setdefault(revision.spec.name, []).append(revision)
        return groups


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
    specs = job.model_specs()
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
            RevisionPlan(spec, key, layers, source, params, d, marker is not None, marker, analysis_units, analysis_done)
        )
    for plan in plans:  # revisions not yet loaded take the measured size of their model
        if plan.marker is None and plan.spec.source in params_of_model:
            measured = [p.marker.get("params") for p in plans if p.marker and p.spec.source == plan.spec.source]
            plan.params = next((m for m in measured if m), plan.params or params_of_model[plan.spec.source])
    return SweepPlan(job, store, fingerprint, plans, own)


# ------------------------------------------------------------------------------------ estimates


@dataclass
class AnalysisCost:
    """What one planned analysis costs: CPU-seconds per unit of its declared ``work`` (``Analysis.work``), measured
    on this store's units, and the CPU-seconds of its units still missing (None: nothing measured to scale from)."""

    words: str  # what its work counts, e.g. "(n_null + 1) x N^2"
    rate: float | None
    measured: int  # stored units the rate comes from
    remaining_seconds: float | None


@dataclass
class CostEstimate:
    measured_extractions: int
    measured_units: int  # stored units of every planned analysis
    extract_rate: float | None  # device-seconds per (parameter x token) of forward pass
    load_rate: float | None  # seconds per parameter to load a revision
    remaining_extract_seconds: float | None
    device: str
    stored: dict[str, int] = field(default_factory=dict)  # planned analysis label -> its stored units
    analyses: dict[str, AnalysisCost] = field(default_factory=dict)  # by analysis name

    @property
    def remaining_analysis_seconds(self) -> float | None:
        """CPU-seconds of every analysis's missing units; None when one of them has nothing measured."""
        seconds = [cost.remaining_seconds for cost in self.analyses.values()]
        return None if any(s is None for s in seconds) else float(sum(seconds))


def missing_work(plan: SweepPlan) -> dict[str, list[dict]]:
    """Analysis name -> the settings of each unit still missing, as its rows will carry them (its parameters at the
    revision's width, ``n`` and ``d``): what its ``work`` and ``reference_seconds`` price. An analysis with an
    extraction of its own counts its missing units only (a row each of its parameters)."""
    from dataclasses import asdict

    labels = planned_labels(plan.job)
    out: dict[str, list[dict]] = {item.analysis: [] for item in labels.values()}
    for revision in plan.revisions:
        for label, units in revision.analysis_units.items():
            item = labels[label]
            settings = {**asdict(item.spec.for_width(item.params, revision.d)), "n": plan.job.n_samples, "d": revision.d}
            done = revision.analysis_done.get(label, set())
            out[item.analysis] += [{**settings, "layer": layer} for layer in units if layer not in done]
    for label, (total, done) in plan.own.items():
        item = labels[label]
        out[item.analysis] += [asdict(item.params)] * (total - done)
    return out


def measured_rows(plan: SweepPlan, analysis) -> list[dict]:
    """One stored row per unit of ``analysis`` with the CPU-seconds the engine measured (``cpu_seconds``): the units
    this plan counts as done (a pooled analysis's), or every unit of it the store holds for this plan's (model,
    revision)s, whatever its settings (one with its own extraction, whose unit keys the plan does not know)."""
    labels = planned_labels(plan.job)
    if analysis.extraction == "pooled":
        keys = [
            unit
            for revision in plan.revisions
            for label, units in revision.analysis_units.items()
            if labels[label].analysis == analysis.name
            for layer, unit in units.items()
            if layer in revision.analysis_done.get(label, set())
        ]
        if not keys:
            return []
        table = plan.store.read_results(analysis.results_dir, keys)
    else:  # its units' rows, or, for one that merges its rows anew each run (diagnostics), the table it wrote
        results = plan.store.root / "results"
        if (results / analysis.results_dir).is_dir():
            table = plan.store.read_results(analysis.results_dir)
        elif (results / f"{analysis.results_dir}.parquet").is_file():
            table = read_table(results / f"{analysis.results_dir}.parquet")
        else:
            table = pa.table({})
    if "cpu_seconds" not in table.column_names:
        return []
    pairs = {(name, r.spec.revision) for r in plan.revisions for name in (r.spec.slug, r.spec.name, r.spec.source)}
    once = {}
    for row in table.to_pylist():
        if "model" in row and (row["model"], row.get("revision")) not in pairs:
            continue  # another job's (model, revision) in a shared store
        if row.get("cpu_seconds") is not None and (row.get("note") or "") == "":
            once.setdefault(row.get("unit_key") or len(once), row)  # the rows of one unit share its seconds
    return list(once.values())


def estimate(plan: SweepPlan) -> CostEstimate:
    """Scale measured times to the units still missing: forward passes by parameters x tokens, loading by
    parameters, and each analysis by its declared work (``Analysis.work``: PGA's (n_null + 1) x N^2, all pairs of N
    samples for every subspace; by default N d min(N, d), a decomposition of one layer), from the CPU-seconds the
    engine measured on its stored units."""
    markers = [
        r.marker for r in plan.revisions if r.marker and r.marker.get("forward_seconds") is not None and r.marker.get("params")
    ]
    extract_rate = load_rate = None
    device = "none measured"
    if markers:
        extract_rate = sum(m["forward_seconds"] for m in markers) / sum(m["params"] * m["tokens"] for m in markers)
        load_rate = sum(m["load_seconds"] for m in markers) / sum(m["params"] for m in markers)
        device = ", ".join(sorted({m.get("device", "?") for m in markers}))
    job = plan.job
    tokens = job.n_samples * job.extraction.seq_len
    if markers:  # measured tokens per sample beat the seq_len bound
        tokens = job.n_samples * sum(m["tokens"] for m in markers) / sum(m["n_samples"] for m in markers)
    todo = [r for r in plan.revisions if not r.extracted and not r.complete]
    remaining_extract = None
    if extract_rate is not None and all(r.params for r in todo):
        remaining_extract = sum(r.params * (tokens * extract_rate + load_rate) for r in todo)
    analyses = {}
    labels = planned_labels(job)
    own_done: dict[str, int] = {}
    for label, (_, done) in plan.own.items():
        own_done[labels[label].analysis] = own_done.get(labels[label].analysis, 0) + done
    priced: dict[str, str] = {}  # results dir -> the analysis whose units it holds, priced once
    for name, missing in missing_work(plan).items():
        spec = registry.get(name)
        if spec.results_dir in priced:  # analyses of one unit (token_dispersion and slices): its time counted once
            analyses[name] = AnalysisCost(f"unit, counted with {priced[spec.results_dir]}", None, 0, 0.0)
            continue
        priced[spec.results_dir] = name
        rows = measured_rows(plan, spec)
        if spec.extraction == "pooled":
            work = sum(spec.work(row) for row in rows)
            rate = sum(row["cpu_seconds"] for row in rows) / work if rows and work > 0 else None
            remaining = rate * sum(spec.work(row) for row in missing) if rate is not None else None
            cost = AnalysisCost(spec.work_words(rows[0] if rows else {}), rate, len(rows), remaining)
        else:  # its units are what planned_units counts (per (model, revision) or per layer): priced per unit done
            done = own_done.get(name, 0)
            rate = sum(row["cpu_seconds"] for row in rows) / done if rows and done else None
            cost = AnalysisCost("unit", rate, done, rate * len(missing) if rate is not None else None)
        if not missing:
            cost.remaining_seconds = 0.0
        analyses[name] = cost
    stored = {label: done for label, (_, done) in plan.per_analysis().items()}
    return CostEstimate(len(markers), sum(stored.values()), extract_rate, load_rate, remaining_extract, device, stored, analyses)


# Forward passes before a store has measured any: an A100 at an assumed 40% of 312 fp16 TFLOPS. An analysis's units
# are priced by its own reference_seconds (PGA's from bench/bench_sweep.py --estimate).
REFERENCE_GPU_FLOPS = 0.40 * 312e12
REFERENCE_LOAD_BYTES_PER_SECOND = 2e9


def reference_estimate(plan: SweepPlan) -> tuple[float | None, dict[str, float | None]]:
    """(GPU-seconds of extraction, None where a revision's size is unknown; analysis name -> CPU-seconds of its
    missing units from its reference rate, None where it declares none or a width is unknown)."""
    job = plan.job
    gpu: float | None = 0.0
    for revision in plan.revisions:
        if revision.extracted or revision.complete:
            continue
        if revision.params is None:
            gpu = None
            break
        gpu += revision.params * (
            2 * job.n_samples * job.extraction.seq_len / REFERENCE_GPU_FLOPS + 2 / REFERENCE_LOAD_BYTES_PER_SECOND
        )
    cpu: dict[str, float | None] = {}
    for name, missing in missing_work(plan).items():
        spec = registry.get(name)
        seconds = [spec.reference_seconds(row) for row in missing]
        cpu[name] = None if any(s is None for s in seconds) else float(sum(seconds))
    return gpu, cpu


def format_seconds(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "unknown"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
