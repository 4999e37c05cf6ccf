"""Every dispersion row carries the step of the model it came from: Pythia's main is step 143000, other
models' main has no step (issue: SmolLM2 and Gemma rows once read 143000)."""

import pytest

from raygeom.analyses.dispersion import DispersionSettings, extraction_provenance
from raygeom.sources.corpus import Corpus
from raygeom.sources.models import resolve_model


@pytest.mark.parametrize(
    "name, revision, step",
    [
        ("smollm2", "main", None),
        ("gemma3", "main", None),
        ("EleutherAI/pythia-70m", "main", 143000),
        ("EleutherAI/pythia-70m", "step1000", 1000),
    ],
)
def test_rows_take_the_step_of_their_model(name, revision, step):
    spec = resolve_model(name, revision)
    corpus = Corpus(name="tiny", texts=["a b c"], labels=None)
    assert extraction_provenance(spec, corpus, DispersionSettings())["step"] == step
