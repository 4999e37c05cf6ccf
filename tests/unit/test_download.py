"""raygeom.sources.download against the loopback hub (tests/hub.py), in this process, on a hand-made repo (no torch):
retries of 5xx, a cut transfer resumed with a Range request, a stall, a missing revision, bytes that fail the checksum,
refs written only for a checked revision, release through the cache API."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from raygeom.sources import download
from tests.hub import LoopbackHub

REPO = "EleutherAI/pythia-14m"


def write_repo(root, revisions):
    """An HF-cache-shaped repo folder: per revision a config, a tokenizer file shared by all, ~200 KB of weights."""
    folder = root / f"models--{REPO.replace('/', '--')}"
    for index, revision in enumerate(revisions):
        commit = hashlib.sha1(f"{REPO}@{revision}".encode()).hexdigest()
        snapshot = folder / "snapshots" / commit
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text(json.dumps({"hidden_size": 8, "num_hidden_layers": 1, "step": index}))
        (snapshot / "tokenizer.json").write_text('{"same": "for every revision"}')
        (snapshot / "model.safetensors").write_bytes(np.random.default_rng(index).bytes(200_000))
        (snapshot / "README.md").write_text("not fetched: no replica loads it")
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / revision).write_text(commit)
    return folder


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    folder = write_repo(tmp_path_factory.mktemp("source"), ["step0", "step1", "step2", "step1000"])
    with LoopbackHub() as server:
        server.add(folder, REPO)
        yield server


@pytest.fixture
def client(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 1)
    hub.clear()
    yield hub
    hub.clear()


def source_bytes(hub, revision, name):
    repo = hub.repos[REPO]
    return repo.files(repo.refs[revision])[name]["data"]


def test_fetch_lists_checks_and_writes_the_ref_last(client):
    got = download.fetch(REPO, "step1", backoff_s=0.01)
    assert sorted(p.name for p in got.path.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (got.path / "model.safetensors").read_bytes() == source_bytes(client, "step1", "model.safetensors")
    assert download.local_snapshot(REPO, "step1") == got.path
    assert download.cached_revisions() == {(REPO, "step1")}
    again = download.fetch(REPO, "step1")
    assert again.downloaded == 0 and again.path == got.path


def test_500_twice_is_retried_with_backoff(client):
    client.fault("500", file="model.safetensors", times=2)
    got = download.fetch(REPO, "step1", retries=3, backoff_s=0.01)
    statuses = [s for m, p, s in client.requests if m == "GET" and p.endswith("model.safetensors")]
    assert statuses == [500, 500, 200]
    assert got.path.is_dir()
    # the schedule itself: backoff, 2 x, 4 x ... and then one line naming what failed
    calls, waits = [], []

    def always_500():
        calls.append(1)
        raise download._Transient("HTTP 500")

    with pytest.raises(download.DownloadError, match=r"thing: HTTP 500 \(after 4 tries\)"):
        download.with_retries(always_500, "thing", retries=3, backoff_s=0.5, sleep=waits.append)
    assert waits == [0.5, 1.0, 2.0] and len(calls) == 4


def test_a_cut_transfer_resumes_with_a_range_request(client):
    client.fault("cut", file="model.safetensors", after=150_000, times=1)
    got = download.fetch(REPO, "step2", backoff_s=0.01)
    statuses = [s for m, p, s in client.requests if m == "GET" and p.endswith("model.safetensors")]
    assert statuses == [200, 206]  # the resumed request asked for the rest only
    assert (got.path / "model.safetensors").read_bytes() == source_bytes(client, "step2", "model.safetensors")


def test_a_stall_is_a_read_timeout_and_the_transfer_goes_on(client):
    client.fault("stall", file="model.safetensors", after=100_000, seconds=2.5, times=1)
    got = download.fetch(REPO, "step2", backoff_s=0.01)
    assert (got.path / "model.safetensors").read_bytes() == source_bytes(client, "step2", "model.safetensors")


def test_a_missing_revision_fails_at_once_with_its_reason(client):
    client.fault("404", revision="step1000")
    with pytest.raises(download.DownloadError, match=r"pythia-14m@step1000: revision not found on the hub \(404\)"):
        download.fetch(REPO, "step1000", backoff_s=0.01)
    assert len([r for r in client.requests if "step1000" in r[1]]) == 1  # not retried
    assert download.fetch_outcome(REPO, "step1000")["reason"].endswith("(404)")


def test_corrupted_bytes_of_the_right_size_are_refused_and_never_referenced(client):
    client.fault("corrupt", file="model.safetensors", revision="step0")
    with pytest.raises(download.DownloadError, match=r"checksum: model.safetensors: sha256 .* is not the hub's .*after 3 tries"):
        download.fetch(REPO, "step0", retries=2, backoff_s=0.01)
    assert download.local_snapshot(REPO, "step0") is None
    assert download.cached_revisions() == set()
    blobs = list((download.cache_root() / f"models--{REPO.replace('/', '--')}" / "blobs").iterdir())
    assert not any(b.stat().st_size == 200_000 for b in blobs)  # the corrupted weights are gone from the cache


def test_release_deletes_through_the_cache_api_and_keeps_shared_blobs(client):
    download.fetch(REPO, "step1", backoff_s=0.01)
    download.fetch(REPO, "step2", backoff_s=0.01)
    before = download.cache_bytes()
    freed = download.release(REPO, download.local_snapshot(REPO, "step1").name)
    assert freed == 200_000 + len(json.dumps({"hidden_size": 8, "num_hidden_layers": 1, "step": 1}))
    assert download.cached_revisions() == {(REPO, "step2")}
    assert (download.local_snapshot(REPO, "step2") / "tokenizer.json").is_file()  # shared with step1: kept
    assert before - download.cache_bytes() >= freed
    assert download.release(REPO, "step1") == 0


def test_hub_revisions_in_step_order_and_none_offline(client, monkeypatch):
    assert download.hub_revisions(REPO) == ["step0", "step1", "step2", "step1000"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert download.hub_revisions(REPO) is None
