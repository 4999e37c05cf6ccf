"""Built-in models are named for what they are (quantised checkpoints, dequantised to fp32); the short names stay
accepted, and a store's old partitions and keys under the old names are never mixed with the new ones."""

import re
from pathlib import Path

import pytest

from raygeom.errors import RaygeomError
from raygeom.jobs.plan import extraction_key
from raygeom.replica.extract import ExtractionSettings
from raygeom.sources.models import BUILTIN_MODELS, ModelSpec, resolve_model


@pytest.mark.parametrize(
    "typed, name",
    [
        ("smollm2", "smollm2-135m-instruct-q4_1"),
        ("smollm2-135m", "smollm2-135m-instruct-q4_1"),
        ("SmolLM2-135M-Instruct-Q4_1", "smollm2-135m-instruct-q4_1"),
        ("gemma3", "gemma3-270m-q4_k_m"),
        ("gemma3-270m", "gemma3-270m-q4_k_m"),
        ("gemma-3-270m", "gemma3-270m-q4_k_m"),
        ("gemma3-270m-q4_k_m", "gemma3-270m-q4_k_m"),
    ],
)
def test_short_names_resolve_to_the_honest_name_used_in_tables_and_the_store(typed, name):
    spec = resolve_model(typed)
    assert (spec.kind, spec.name, spec.slug) == ("builtin", name, name)


def test_descriptions_say_quantised_and_dequantised():
    assert "Q4_1 dequantised to fp32" in BUILTIN_MODELS["smollm2-135m-instruct-q4_1"][2]
    assert "Q4_K_M dequantised to fp32" in BUILTIN_MODELS["gemma3-270m-q4_k_m"][2]


def test_the_new_name_never_shares_a_key_with_a_store_written_under_the_old_one():
    settings = ExtractionSettings()
    old = extraction_key(ModelSpec("smollm2-135m", "builtin"), "corpus", settings, "all", 256)
    new = extraction_key(resolve_model("smollm2"), "corpus", settings, "all", 256)
    assert old != new


def test_an_unknown_name_gets_the_nearest_short_or_full_name_and_the_short_names():
    # issue 48: one line, "did you mean" over the short and full names, the short names the README uses listed
    with pytest.raises(RaygeomError, match=r"'smollm3' \(did you mean 'smollm2'\?\): give a built-in \(gemma3-270m, smollm2\)"):
        resolve_model("smollm3")
    with pytest.raises(RaygeomError, match=r"did you mean 'gemma3-270m-q4_k_m'\?"):
        resolve_model("gemma3-270m-q4-k-m")


@pytest.mark.parametrize("path", ["docs/quickstart.ipynb", "Makefile"])
def test_the_quickstart_and_the_makefile_name_the_instruct_q4_1_model(path):
    text = (Path(__file__).resolve().parents[2] / path).read_text()
    assert "SmolLM2-135M-Instruct (Q4_1" in text and not re.search(r"SmolLM2-135M(?!-Instruct)", text)
