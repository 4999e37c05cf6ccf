"""What a replica is asked to extract: one (model, revision) over one sampled corpus with one set of
extraction settings, and the content key under which the store keeps the result. Pure: no Ray, no models."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from raygeom.replica.settings import ExtractionSettings
from raygeom.sources.corpus import Corpus
from raygeom.sources.models import ModelSpec
from raygeom.store.tree import content_key

EXTRACTION_VERSION = 2  # 2: one replica and one tokenize (BOS as trained, positions over real tokens)
READOUT_COMPONENTS = 256


def extraction_key(
    spec: ModelSpec, corpus_fingerprint: str, settings: ExtractionSettings, layer_selection: str, readout_components: int
) -> str:
    return content_key(
        "extract",
        EXTRACTION_VERSION,
        spec.kind,
        spec.source,
        spec.revision,
        corpus_fingerprint,
        asdict(settings),
        layer_selection,
        readout_components,
    )


@dataclass(frozen=True)
class ExtractionRequest:
    spec: ModelSpec
    corpus: Corpus  # already sampled: every model sees these texts in this order
    settings: ExtractionSettings
    layer_selection: str = "all"
    readout_components: int = READOUT_COMPONENTS
    # Per-sample NLL costs the full-vocabulary LM head; only analyses that read it ask. Not part of the key:
    # the vectors are the same either way, and a later request adds the NLL to the stored samples.
    nll: bool = False

    def key(self) -> str:
        return extraction_key(self.spec, self.corpus.fingerprint(), self.settings, self.layer_selection, self.readout_components)
