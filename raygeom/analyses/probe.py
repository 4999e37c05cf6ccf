"""Linear probe of each layer: multinomial logistic regression on the corpus labels, fixed stratified split;
accuracy with its Wilson interval beside chance (raygeom.numerics.probe)."""

from __future__ import annotations

from dataclasses import dataclass

from raygeom.analyses.registry import Metric, Needs, Params, PerLayer, param, read_layer, register
from raygeom.errors import RaygeomError
from raygeom.params import MAX_SEED


@dataclass(frozen=True)
class ProbeParams(Params):
    seed: int = param(0, "Seed of the stratified train/test split.", low=0, high=MAX_SEED)
    test_fraction: float = param(
        0.25, "Share of the texts held out for testing.", low=0.0, high=1.0, low_open=True, high_open=True
    )
    c: float = param(1.0, "Inverse L2 regularisation strength of the logistic regression.", low=0.0, low_open=True, high=1e12)


def probe_task(root: str, model: str, revision: str, layer: str, test_fraction: float, seed: int, c: float, key: str) -> dict:
    from raygeom.numerics import probe
    from raygeom.numerics.uncertainty import wilson_interval
    from raygeom.store.tree import Store

    ids, h = read_layer(root, model, revision, layer, key)
    samples = Store(root).read_samples(model, revision, key)
    if "label" not in samples.column_names:
        raise RaygeomError("the corpus of this extraction has no labels, so there is nothing to probe")
    labels = dict(zip(samples["sample_id"].to_pylist(), samples["label"].to_pylist()))
    result = probe.linear_probe_accuracy(h, [labels[int(i)] for i in ids], test_fraction=test_fraction, seed=seed, c=c)
    # Accuracy on a few dozen test texts is a coarse number: it travels with its Wilson interval.
    low, high = wilson_interval(int(round(result["accuracy"] * result["n_test"])), result["n_test"])
    return {**result, "accuracy_lo": low, "accuracy_hi": high}


def require_labels(corpus_name: str, otherwise: str = "") -> None:
    """Refuse, before any work, a probe on a corpus without labels (``otherwise``: the flag that leaves probes out)."""
    from raygeom.sources.corpus import load_corpus

    if load_corpus(corpus_name).labels is None:
        raise RaygeomError(
            f"corpus '{corpus_name}' has no labels, so there is nothing to probe "
            "(use 'bbc', a JSONL/Parquet file with a 'label' field, or hf:ag_news" + (f"; or {otherwise})" if otherwise else ")")
        )


@register
class Probe(PerLayer):
    name = "probe"
    version = 2  # shares its units with `raygeom diagnose`/`probe` (DIAGNOSTICS_VERSION 2)
    Params = ProbeParams
    title = "Linear probe"
    needs = Needs(labels=True)
    columns = ("seed", "test_fraction", "c", "accuracy", "accuracy_lo", "accuracy_hi", "chance", "n_test", "converged")
    metrics = (Metric("accuracy", "probe accuracy", "accuracy_lo", "accuracy_hi", chance="chance"),)
    series = ("seed", "test_fraction", "c")
    task = probe_task
    arguments = ("test_fraction", "seed", "c")

    def check_job(self, params, job) -> None:
        if not job.corpus_pending:
            require_labels(job.corpus)

    def units(self, store, model, revision, layers, params: ProbeParams, info):
        samples = store.read_samples(model, revision, info["key"])
        if "label" not in samples.column_names:
            raise RaygeomError(
                f"the corpus of {model}@{revision} has no labels, so there is nothing to probe "
                "(use the built-in 'bbc' corpus, a JSONL/Parquet file with a 'label' field, or hf:ag_news)"
            )
        return super().units(store, model, revision, layers, params, info)
