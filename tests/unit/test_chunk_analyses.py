"""The registered analyses with extractions of their own: their declarations point at what exists, and the two
dispersion intervals the chunk analyses add are the textbook ones, computed here independently with scipy."""

import subprocess
import sys

import numpy as np
import pytest
from scipy import stats
from scipy.spatial.distance import pdist

from raygeom.analyses import registry

OWN = {
    "token_dispersion": ("chunks", "dispersion_layers", "dispersion"),
    "slices": ("chunks", "dispersion_layers", "dispersion"),
    "gap": ("chunks", "dispersion_gap", "select"),
    "knn_lm": ("knn", "knn", "knn"),
    "convergence": ("aligned", "converge", "converge"),
}


@pytest.mark.parametrize("name", sorted(OWN))
def test_declarations_point_at_what_exists(name):
    analysis = registry.get(name)
    extraction, results, command = OWN[name]
    assert (analysis.extraction, analysis.results_dir, analysis.command) == (extraction, results, command)
    defaults = analysis.Params()
    assert set(analysis.series) <= set(defaults.settings())


def test_chunk_analyses_share_one_extraction_declaration():
    from raygeom.analyses.token_dispersion import ChunkExtractionParams, extraction_of

    shared = [f for f in ChunkExtractionParams.declared()]
    for name in ("token_dispersion", "slices", "gap"):
        params = registry.get(name).Params()
        assert isinstance(params, ChunkExtractionParams)
        assert extraction_of(params, "all") == extraction_of(ChunkExtractionParams(), "all"), name
    assert {f.name for f in shared} == {"chunk_len", "chunks_per_domain", "batch_size", "domain_tokens", "seed"}


def test_declaring_them_imports_no_torch():
    code = (
        "import sys; from raygeom.analyses import registry; registry.analyses(); "
        "print(sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("chunks,d", [(5, 8), (40, 16)])
def test_dispersion_intervals_are_the_t_and_jackknife_intervals(seed, chunks, d):
    from raygeom.analyses.dispersion import _dispersion_intervals

    rng = np.random.default_rng(seed)
    per_chunk = rng.uniform(0.2, 0.9, chunks)
    pooled = rng.normal(size=(chunks, d)) + rng.normal(size=d)
    got = _dispersion_intervals(per_chunk, pooled)
    # both dispersions lie in [0, 2]: each interval is taken on the logit scale of D / 2 and mapped back
    logit = np.log(per_chunk / 2 / (1 - per_chunk / 2))
    half = stats.t.ppf(0.975, chunks - 1) * logit.std(ddof=1) / np.sqrt(chunks)
    back = lambda v: 2 / (1 + np.exp(-v))  # noqa: E731
    assert got["token_dispersion_lo"] == pytest.approx(min(back(logit.mean() - half), per_chunk.mean()), rel=1e-9)
    assert got["token_dispersion_hi"] == pytest.approx(max(back(logit.mean() + half), per_chunk.mean()), rel=1e-9)
    full = pdist(pooled, "cosine").mean()
    leave_out = np.array([pdist(np.delete(pooled, i, axis=0), "cosine").mean() for i in range(chunks)])
    se = np.sqrt((chunks - 1) / chunks * np.sum((leave_out - leave_out.mean()) ** 2))
    centre, spread = np.log(full / 2 / (1 - full / 2)), stats.norm.ppf(0.975) * se / (2 * (full / 2) * (1 - full / 2))
    assert got["sample_dispersion_lo"] == pytest.approx(back(centre - spread), rel=1e-9)
    assert got["sample_dispersion_hi"] == pytest.approx(back(centre + spread), rel=1e-9)
    assert 0 < got["token_dispersion_lo"] < got["token_dispersion_hi"] < 2


def test_too_few_chunks_give_no_interval_not_a_false_one():
    from raygeom.analyses.dispersion import _dispersion_intervals

    got = _dispersion_intervals(np.array([0.5]), np.ones((2, 4)))
    assert all(np.isnan(v) for v in got.values())
