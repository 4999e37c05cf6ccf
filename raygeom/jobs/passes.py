"""The forward passes a job makes on each (model, revision), planned once from what its analyses read
(:class:`raygeom.analyses.registry.Reads`): analyses that read the same thing share one pass. ``plan`` lists them,
``run`` counts those that ran, and the pooled pass reads the texts its readers need (e.g. convergence's aligned
texts), so a job whose analyses can share a pass makes it once."""

from __future__ import annotations

from dataclasses import dataclass, fields

from raygeom.analyses.extraction import pooled_corpus, pooled_reader  # noqa: F401 - the pooled pass's texts

POOLED = "pooled"


def planned_labels(job) -> dict:
    """The job's planned analyses by a label that tells apart the grid points of one analysis (``pga r=5``)."""
    planned = job.planned()
    labels = {}
    for item in planned:
        same = [other.params for other in planned if other.analysis == item.analysis]
        varying = [f.name for f in fields(item.params) if len({getattr(p, f.name) for p in same}) > 1]
        labels[" ".join([item.analysis, *(f"{name}={getattr(item.params, name)}" for name in varying)])] = item
    return labels


@dataclass(frozen=True)
class Pass:
    """One forward pass per (model, revision): its kind, the planned analyses it serves (by label, and the first of
    them, whose declaration makes and finds its extraction) and what it reads."""

    kind: str
    serves: tuple[str, ...]
    first: object  # the Planned item that makes it
    why: str


def job_passes(job) -> list[Pass]:
    """The fewest passes that serve every planned analysis: the pooled pass first (on the first text set a pooled
    reader asks for), then one per distinct extraction of its own, in the order the job names them."""
    labels = planned_labels(job)
    reads = {label: item.spec.reads(item.params, job) for label, item in labels.items()}
    texts = next((r.texts for r in reads.values() if r.kind == POOLED and r.texts is not None and r.shared), None)
    groups: dict[tuple, list[str]] = {}
    for label, r in reads.items():
        key = (POOLED, repr(r.texts if r.texts is not None else texts)) if r.kind == POOLED else (r.kind, repr(r.settings))
        groups.setdefault(key, []).append(label)
    passes = []
    for (kind, _), served in sorted(groups.items(), key=lambda group: group[0][0] != POOLED or group[0][1] != repr(texts)):
        # what the pass reads, in the words of the first analysis that says it (a pooled reader of the sample as it
        # is says nothing)
        why = next((reads[label].why for label in served if reads[label].why), "one vector per text and layer")
        passes.append(Pass(kind, tuple(served), labels[served[0]], why))
    return passes


def stored_passes(store, job, specs: list, pooled_key) -> dict[tuple[str, str, int], bool]:
    """(model slug, revision, index of the pass) -> whether the store holds that pass's extraction (freed layer files
    included): what ``run`` compares before and after to count the passes that ran. ``pooled_key(spec)``: the
    pooled extraction's key."""
    stored = {}
    for index, one in enumerate(job_passes(job)):
        for spec in specs:
            if index == 0 and one.kind == POOLED:
                key = pooled_key(spec)  # None: not known here (never "the revision's one extraction")
                found = key is not None and (
                    store.is_complete(spec.slug, spec.revision, key) or store.is_freed(spec.slug, spec.revision, key)
                )
            else:
                found = one.first.spec.extracted(store, job, spec, one.first.params)
            stored[(spec.slug, spec.revision, index)] = found
    return stored


def describe(passes: list[Pass]) -> str:
    """``3 (pooled: pga, twonn; chunks: token_dispersion, gap; knn: knn_lm)``."""
    return f"{len(passes)} (" + "; ".join(f"{p.kind}: {', '.join(p.serves)}" for p in passes) + ")"


def analyses_of(job) -> list[str]:
    """The job's planned analyses by name, in the order it names them (a grid's points once)."""
    return list(dict.fromkeys(item.analysis for item in job.planned()))


def needs_pooled(job) -> bool:
    """Whether any planned analysis reads the job's [extract] extraction (else no forward pass is made for it)."""
    return any(item.spec.extraction == POOLED for item in job.planned())


def needs_nll(job) -> bool:
    """Whether the pooled pass computes per-sample NLL: a reader of it asks (diagnostics' loss beside geometry)."""
    return any(item.spec.needs.nll for item in job.planned() if item.spec.reads(item.params, job).kind == POOLED)
