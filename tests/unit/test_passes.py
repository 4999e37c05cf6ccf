"""The pass planner (raygeom.jobs.passes): from what each planned analysis declares it reads, the fewest forward passes
per (model, revision), in a fixed order (the pooled pass first), each naming the analyses it serves and what it reads."""

import pytest

from raygeom.jobs.passes import describe, job_passes
from raygeom.jobspec import load_job

HEAD = """[job]
name = "p"
out = "store"
[[models]]
id = "EleutherAI/pythia-14m"
revisions = ["step0", "step143000"]
[corpus]
name = "bbc"
n_samples = 40
"""
CHUNKS = "chunk_len = 64\nchunks_per_domain = 3\n"
KNN = "[analyses.knn_lm]\nchunk_len = 64\ntrain_chunks = 6\ntest_chunks = 6\nbootstrap_block = 16\n"


def passes_of(tmp_path, analyses: str):
    path = tmp_path / "job.toml"
    path.write_text(HEAD + analyses)
    return job_passes(load_job(path))


@pytest.mark.parametrize(
    "analyses, expected",
    [
        ("[analyses.pga]\n[analyses.twonn]\n", "1 (pooled: pga, twonn)"),
        # convergence reads the pooled pass (on the aligned texts), it does not make its own
        ("[analyses.pga]\n[analyses.convergence]\n", "1 (pooled: pga, convergence)"),
        ("[analyses.convergence]\n", "1 (pooled: convergence)"),
        ("[analyses.diagnostics]\n[analyses.pga]\n", "1 (pooled: diagnostics, pga)"),
        # the chunk analyses of the same chunk settings share one pass, whatever else each one sets
        (
            f"[analyses.token_dispersion]\n{CHUNKS}n_slices = 3\ngroup_size = 3\nn_groups = 5\n[analyses.gap]\n{CHUNKS}",
            "1 (chunks: token_dispersion, gap)",
        ),
        # the pooled pass first, then the others in the order the job names them
        (f"[analyses.pga]\n{KNN}[analyses.gap]\n{CHUNKS}", "3 (pooled: pga; knn: knn_lm; chunks: gap)"),
    ],
)
def test_analyses_that_read_the_same_thing_share_one_pass(tmp_path, analyses, expected):
    assert describe(passes_of(tmp_path, analyses)) == expected


def test_what_differs_gets_a_pass_of_its_own_named_with_its_reason(tmp_path):
    passes = passes_of(
        tmp_path,
        f"[analyses.pga]\n[analyses.convergence]\n[analyses.diagnostics]\nmax_words = 20\n"
        f"[analyses.gap]\n{CHUNKS}[analyses.token_dispersion]\nchunk_len = 32\nchunks_per_domain = 3\ngroup_size = 3\nn_groups = 5\nn_slices = 3\n{KNN}",
    )
    assert [(p.kind, p.serves) for p in passes] == [
        ("pooled", ("pga", "convergence")),
        ("pooled", ("diagnostics",)),  # its texts cut at max_words are not the pooled pass's: not shared
        ("chunks", ("gap",)),
        ("chunks", ("token_dispersion",)),  # other chunk settings: another pass
        ("knn", ("knn_lm",)),
    ]
    whys = [p.why for p in passes]
    assert "texts every model reads whole" in whys[0] and whys[1] == "texts cut at max_words=20", whys
    assert "64 tokens" in whys[2] and "32 tokens" in whys[3] and "next-token targets" in whys[4], whys


def test_a_pooled_pass_of_the_sample_as_it_is_says_so(tmp_path):
    (only,) = passes_of(tmp_path, "[analyses.pga]\n")
    assert (only.kind, only.why) == ("pooled", "one vector per text and layer")
