"""raygeom.engine.weights without a cluster: the download tasks and the hub's listing are stand-ins, so what is tested
is the bookkeeping: sweep order, the byte budget, what a release deletes and what it keeps."""

from __future__ import annotations

import pytest

from raygeom.engine import weights
from raygeom.sources import download
from raygeom.sources.models import ModelSpec

REPO = "EleutherAI/pythia-14m"
SIZE = 1000


@pytest.fixture
def hub(monkeypatch):
    state = {"started": [], "released": [], "outcomes": {}}

    class Task:
        @staticmethod
        def remote(repo, revision, retries, backoff):
            state["started"].append(revision)
            return f"ref-{revision}"

    def listing(repo, revision, retries, backoff):
        if revision == "missing":
            raise download.DownloadError(f"{repo}@{revision}: revision not found on the hub (404)")
        size = 5 * SIZE if revision == "huge" else SIZE
        return download.Listing(repo, revision, f"commit-{revision}", (download.HubFile("model.safetensors", size, None, None),))

    monkeypatch.setattr(weights, "fetch_task", Task)
    monkeypatch.setattr(weights.ray, "get", lambda ref: state["outcomes"].get(ref, {"ok": True, "downloaded": SIZE}))
    monkeypatch.setattr(download, "listing", listing)
    monkeypatch.setattr(download, "online", lambda: True)
    monkeypatch.setattr(download, "cached_revisions", lambda: {(REPO, "cached")})
    monkeypatch.setattr(download, "cached_commits", lambda: {(REPO, "commit-cached"), (REPO, "commit-alias")})
    monkeypatch.setattr(download, "release", lambda repo, commit: state["released"].append(commit) or SIZE)
    return state


def specs(*revisions):
    return [ModelSpec(REPO, "hub", revision) for revision in revisions]


def test_downloads_run_ahead_in_order_as_far_as_the_budget_allows(hub):
    revisions = specs("step0", "step1", "step2", "step3")
    hold = weights.Weights(revisions, weights.WeightsSettings(budget_bytes=2 * SIZE, downloads_at_once=4))
    hold.pump()
    assert hub["started"] == ["step0", "step1"] and hold.held == 2 * SIZE
    assert [hold.state(s) for s in revisions] == ["downloading", "downloading", "waiting", "waiting"]
    assert hold.handle("ref-step0") and hold.state(revisions[0]) == "ready"
    hold.pump()
    assert hub["started"] == ["step0", "step1"]  # step0 still holds its room until its extraction is stored
    hold.done_with(revisions[0])
    assert hub["released"] == ["commit-step0"] and hold.held == SIZE
    hold.pump()
    assert hub["started"] == ["step0", "step1", "step2"] and hold.peak == 2 * SIZE


def test_one_download_at_a_time_by_default(hub):
    hold = weights.Weights(specs("step0", "step1"), weights.WeightsSettings(budget_bytes=10 * SIZE))
    hold.pump()
    assert hub["started"] == ["step0"]


def test_cached_revisions_are_neither_fetched_nor_deleted(hub):
    cached, alias = specs("cached", "alias")
    hold = weights.Weights([cached, alias], weights.WeightsSettings(budget_bytes=10 * SIZE))
    assert hold.state(cached) == "ready"
    hold.pump()
    assert hub["started"] == ["alias"]
    hold.handle("ref-alias")
    hold.done_with(cached)
    hold.done_with(alias)  # its commit was in the cache before the sweep, under another name
    assert hub["released"] == [] and hold.held == 0


def test_failures_carry_their_reason_and_the_others_go_on(hub):
    missing, huge, fine, lost = specs("missing", "huge", "fine", "lost")
    hub["outcomes"]["ref-lost"] = {"ok": False, "reason": f"{REPO}@lost: HTTP 500 (after 6 tries)", "downloaded": 0}
    hold = weights.Weights([missing, huge, fine, lost], weights.WeightsSettings(budget_bytes=2 * SIZE, downloads_at_once=2))
    hold.pump()
    assert hold.state(missing) == "failed" and hold.reason(missing).endswith("revision not found on the hub (404)")
    assert hold.state(huge) == "failed" and "more than the weights budget" in hold.reason(huge)
    assert hub["started"] == ["fine", "lost"]
    hold.handle("ref-lost")
    assert hold.state(lost) == "failed" and "HTTP 500" in hold.reason(lost)
    assert hub["released"] == ["commit-lost"] and hold.held == SIZE  # what it fetched goes at once


def test_keep_weights_deletes_nothing_but_frees_the_room(hub):
    revisions = specs("step0", "step1")
    hold = weights.Weights(revisions, weights.WeightsSettings(budget_bytes=SIZE, keep=True))
    hold.pump()
    hold.handle("ref-step0")
    hold.done_with(revisions[0])
    hold.pump()
    assert hub["released"] == [] and hub["started"] == ["step0", "step1"]


def test_a_revision_two_extractions_need_is_released_after_the_second(hub):
    spec = specs("step0")[0]
    hold = weights.Weights([spec, spec], weights.WeightsSettings(budget_bytes=SIZE))
    hold.pump()
    hold.handle("ref-step0")
    hold.done_with(spec)
    assert hub["released"] == []
    hold.done_with(spec)
    assert hub["released"] == ["commit-step0"]


def test_offline_nothing_is_fetched(hub, monkeypatch):
    monkeypatch.setattr(download, "online", lambda: False)
    hold = weights.Weights(specs("step0"), weights.WeightsSettings(budget_bytes=SIZE))
    hold.pump()
    assert hub["started"] == [] and hold.state(specs("step0")[0]) == "ready"
