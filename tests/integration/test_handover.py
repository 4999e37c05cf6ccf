"""A replica handed from one revision to the next serves exactly what a new replica of that revision serves, and a
sweep that hands its replicas on stores the same bytes as one that starts a replica per revision."""

import numpy as np
import pytest

pytestmark = pytest.mark.integration
REVISIONS = ("step0", "step1000", "step143000")
TEXTS = [f"text number {i} about {'cats' if i % 2 else 'ships'} and {i * 7} more" for i in range(12)]


def test_a_handed_on_replica_serves_the_next_revision_as_a_new_one_would(hub_cache):
    from raygeom.errors import RaygeomError
    from raygeom.replica.extract import ExtractionSettings
    from raygeom.replica.replica import Replica
    from raygeom.sources.models import ModelSpec, resolve_model

    specs = [resolve_model("EleutherAI/pythia-14m", revision) for revision in REVISIONS]
    settings = ExtractionSettings(seq_len=16, batch_size=4)
    fresh = {spec.revision: Replica(spec, threads=1) for spec in specs}
    expected = {
        revision: (r.describe()["fingerprint"], r.pooled(TEXTS, settings, None, nll=True)) for revision, r in fresh.items()
    }
    assert len({fingerprint for fingerprint, _ in expected.values()}) == 3  # three different weights

    handed = Replica(specs[0], threads=1)
    for spec in [*specs[1:], specs[0]]:  # on to each revision, then back to the first
        assert handed.describe(spec=spec)["fingerprint"] == expected[spec.revision][0]
        assert handed.spec == spec
        got, want = handed.pooled(TEXTS, settings, None, nll=True), expected[spec.revision][1]
        for layer in want.pooled:
            np.testing.assert_array_equal(got.pooled[layer], want.pooled[layer], err_msg=f"{spec.revision} {layer}")
        np.testing.assert_array_equal(got.nll, want.nll)
    # A call without spec= is for the model it holds; a failed load is that revision's error, and the next load clears it.
    with pytest.raises(RaygeomError, match="step77"):
        handed.describe(spec=ModelSpec("EleutherAI/pythia-14m", "hub", "step77"))
    assert handed.describe(spec=specs[1])["fingerprint"] == expected["step1000"][0]


def test_a_sweep_hands_its_replicas_on_and_stores_what_one_replica_per_revision_stores(
    hub_cache, ray_local, tmp_path, monkeypatch
):
    from raygeom.engine import orchestrate, replica_actor
    from raygeom.replica.extract import ExtractionSettings
    from raygeom.replica.request import ExtractionRequest
    from raygeom.sources.corpus import Corpus
    from raygeom.sources.models import resolve_model
    from raygeom.store.tree import Store

    created = []
    original = replica_actor.create
    monkeypatch.setattr(replica_actor, "create", lambda spec, *a, **k: created.append(spec.revision) or original(spec, *a, **k))
    specs = [resolve_model("EleutherAI/pythia-14m", revision) for revision in ("step0", "step143000")]
    corpus = Corpus("handover", TEXTS)
    results = {}
    for in_flight in (1, 2):  # one replica handed on from the first revision to the second; a replica per revision
        created.clear()
        store = Store(tmp_path / f"out{in_flight}")
        items = [
            orchestrate.SweepItem(ExtractionRequest(spec, corpus, ExtractionSettings(seq_len=16, batch_size=4), nll=True))
            for spec in specs
        ]
        orchestrate.run_sweep(store, items, lambda item, info: [], max_in_flight=in_flight)
        found = {}
        for spec, item in zip(specs, items):
            info = store.completion(spec.slug, spec.revision, item.request.key())
            found[spec.revision, "nll"] = store.read_samples(spec.slug, spec.revision, info["key"])["nll"].to_numpy().tobytes()
            for layer in info["layers"]:
                found[spec.revision, layer] = store.read_layer(spec.slug, spec.revision, layer, key=info["key"])[1].tobytes()
        results[in_flight] = (sorted(created), found)
    assert results[1][0] == ["step0"] and results[2][0] == ["step0", "step143000"]
    assert results[1][1] == results[2][1] and len(results[1][1]) == 2 * 6  # every layer and the NLL, byte for byte
