"""A sweep's records in its store: the corpus manifest (so `plan` and `status` need not load the corpus to know
its fingerprint) and the integrity check of the checkpoints' weights (revisions serving the same weights, and
the known-bad ones of the Pythia issues), from the fingerprints recorded when each revision was loaded."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from raygeom.sources import revisions as pythia
from raygeom.sources.corpus import Corpus
from raygeom.store.tree import Store, atomic_write_text

MANIFEST = "sweep/manifest.json"


def corpus_manifest(job) -> dict:
    return {"corpus": job.corpus, "n_samples": job.n_samples, "sample_seed": job.sample_seed}


def write_manifest(store: Store, job, corpus: Corpus) -> None:
    atomic_write_text(json.dumps({**corpus_manifest(job), "fingerprint": corpus.fingerprint()}, indent=2), store.root / MANIFEST)


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
            step = lambda r, model=model: self.steps.get((model, r), pythia.step_of(r))  # noqa: E731
            for revision in sorted(revisions, key=lambda r: (step(r) if step(r) is not None else -1, r)):
                out.append((model, revision, self.flag(model, revision)))
        return out


def integrity(plan) -> IntegrityReport:
    """Compare the weight fingerprints recorded when each revision was loaded, within each model (``plan``: a
    raygeom.jobs.plan.SweepPlan)."""
    duplicates, partial, notes, all_steps = {}, {}, {}, {}
    for model, revisions in plan.by_model().items():
        markers = {r.spec.revision: r.marker for r in revisions if r.marker}
        steps = {r.spec.revision: r.spec.step for r in revisions}
        all_steps.update({(model, rev): step for rev, step in steps.items()})
        groups = pythia.duplicate_groups({rev: m["fingerprint"] for rev, m in markers.items() if m.get("fingerprint")}, steps)
        if groups:
            duplicates[model] = groups
        shared = pythia.shared_tensors(
            {rev: m["tensor_fingerprints"] for rev, m in markers.items() if m.get("tensor_fingerprints")}, steps=steps
        )
        if shared:
            partial[model] = shared
        for r in revisions:
            note = pythia.known_bad_note(r.spec.source, r.spec.revision)
            if note:
                notes[(model, r.spec.revision)] = note
    return IntegrityReport(duplicates, partial, notes, all_steps)
