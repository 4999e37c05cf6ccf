"""A sweep's hub weights: downloads run ahead of extraction as far as a byte budget allows, and each revision the
sweep downloaded is deleted again once its extraction is stored (raygeom.sources.download does the I/O).

Downloads are Ray tasks of no CPU, so they run while replicas extract and analysis tasks take the CPUs. The budget counts
every file of a revision from the moment its download starts until it is released (shared blobs counted once per
revision: the count is never below what the cache holds). Revisions cached before the sweep are neither counted nor
deleted (``keep``: nothing is; the budget then bounds what is fetched ahead). The cache is the HF cache of the node a download ran on: on one node (or a shared cache) the budget is the
cache's; on several nodes a replica elsewhere fetches its own copy, outside the budget.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import ray

from raygeom.sources import download
from raygeom.sources.models import ModelSpec

fetch_task = ray.remote(num_cpus=0, max_retries=0)(download.fetch_outcome)


@dataclass(frozen=True)
class WeightsSettings:
    budget_bytes: int
    keep: bool = False
    retries: int = download.DEFAULT_RETRIES
    backoff_s: float = download.DEFAULT_BACKOFF_S
    # One at a time, in sweep order: the revision extraction waits for next lands soonest when no other download
    # shares the link (at a link's bandwidth, two at once made the pipeline's fill twice as long in bench_sweep --hub).
    downloads_at_once: int = 1


class Weights:
    """``pump`` starts what fits; ``refs`` to wait on; ``handle`` a finished one; ``state(spec)`` is ready, failed or
    waiting; ``done_with(spec)`` once its extraction is stored (or failed) releases what this sweep downloaded."""

    def __init__(self, specs: list[ModelSpec], settings: WeightsSettings):
        self.settings = settings
        self.order = list(dict.fromkeys(s for s in specs if s.kind == "hub"))
        self.uses = Counter(specs)  # extractions still to come per revision: released at the last
        self.active = bool(self.order) and download.online()
        self.preexisting = download.cached_revisions() if self.active else set()
        self.preexisting_commits = download.cached_commits() if self.active else set()
        self.states: dict[ModelSpec, str] = {}
        self.reasons: dict[ModelSpec, str] = {}
        self.sizes: dict[ModelSpec, int] = {}
        self.commits: dict[ModelSpec, str] = {}
        self.listings: dict[ModelSpec, download.Listing] = {}  # asked once: a revision waiting for room is not asked again
        self.waiting: dict[ray.ObjectRef, tuple[ModelSpec, float]] = {}
        self.held = 0
        self.peak = 0
        self.downloaded = 0
        self.intervals: list[tuple[float, float, str]] = []  # (start, end, model@revision) of every download

    def _needs(self, spec: ModelSpec) -> bool:
        return self.active and spec.kind == "hub" and (spec.source, spec.revision) not in self.preexisting

    def state(self, spec: ModelSpec) -> str:
        if not self._needs(spec):
            return "ready"
        return self.states.get(spec, "waiting")

    def reason(self, spec: ModelSpec) -> str | None:
        return self.reasons.get(spec)

    def refs(self) -> list[ray.ObjectRef]:
        return list(self.waiting)

    def pump(self) -> None:
        """Start downloads in sweep order while they fit in the budget (and at most ``downloads_at_once``)."""
        for spec in self.order:
            if len(self.waiting) >= self.settings.downloads_at_once:
                return
            if not self._needs(spec) or spec in self.states:
                continue
            try:
                listed = self.listings.get(spec) or download.listing(
                    spec.source, spec.revision, self.settings.retries, self.settings.backoff_s
                )
            except download.DownloadError as error:
                self._failed(spec, str(error))
                continue
            self.listings[spec] = listed
            if listed.size > self.settings.budget_bytes:
                self._failed(
                    spec,
                    f"{spec.name}@{spec.revision}: its files take {_gib(listed.size)}, more than the "
                    f"weights budget of {_gib(self.settings.budget_bytes)} ([sweep] weights_budget_gib)",
                )
                continue
            if self.held + listed.size > self.settings.budget_bytes:
                return  # in order: the next one waits for a release
            self.held += listed.size
            self.peak = max(self.peak, self.held)
            self.sizes[spec], self.commits[spec] = listed.size, listed.commit
            self.states[spec] = "downloading"
            ref = fetch_task.remote(spec.source, spec.revision, self.settings.retries, self.settings.backoff_s)
            self.waiting[ref] = (spec, time.monotonic())

    def _failed(self, spec: ModelSpec, reason: str) -> None:
        self.states[spec] = "failed"
        self.reasons[spec] = reason

    def handle(self, ref: ray.ObjectRef) -> bool:
        """True when ``ref`` was a download (ready or failed now)."""
        if ref not in self.waiting:
            return False
        spec, began = self.waiting.pop(ref)
        self.intervals.append((began, time.monotonic(), f"{spec.name}@{spec.revision}"))
        try:
            outcome = ray.get(ref)
        except ray.exceptions.RayError as error:  # the download's worker died
            outcome = {"ok": False, "reason": f"{spec.name}@{spec.revision}: download task lost: {str(error).splitlines()[0]}"}
        if outcome["ok"]:
            self.states[spec] = "ready"
            self.downloaded += outcome["downloaded"]
        else:
            self._failed(spec, outcome["reason"])
            self._release(spec)  # files it did fetch
        return True

    def done_with(self, spec: ModelSpec) -> None:
        self.uses[spec] -= 1
        if self.uses[spec] <= 0 and self.states.get(spec) in ("ready", "failed") and spec in self.sizes:
            self._release(spec)
            if self.states[spec] == "ready":
                self.states[spec] = "released"

    def _release(self, spec: ModelSpec) -> None:
        """Out of the budget; deleted unless kept, or its commit was cached before the sweep under another name."""
        self.held -= self.sizes.pop(spec, 0)
        commit = self.commits.get(spec)
        if not self.settings.keep and commit and (spec.source, commit) not in self.preexisting_commits:
            download.release(spec.source, commit)


def _gib(size: int) -> str:
    return f"{size / 2**30:.3g} GiB"
