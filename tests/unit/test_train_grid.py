"""A [train] grid (a width ladder): one run per combination of its list values, each with its own run directory,
heads scaled with d, every run swept; k chosen per width from k/d; several grids of one analysis in one job."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from raygeom.errors import RaygeomError

LADDER = """
[job]
name = "ladder"
out = "{out}"

[train]
run_dir = "{runs}"
hidden_size = [32, 64]
seed = [0, 1]
head_dim = 16
n_layers = 2
save_every = 10
log_until = 0
corpus = "bbc"
steps = 20
batch_size = 4
seq_len = 16

[corpus]
name = "heldout"
n_samples = 50

[[analyses.pga]]
k_per_d = 0.25
r = [0, 1]

[[analyses.pga]]
k = 4
r = 1

[analyses.spectral]
k_per_d = 0.25
{extra}
"""


def _write(tmp_path: Path, extra: str = "", **replace) -> Path:
    text = LADDER.format(out=tmp_path / "store", runs=tmp_path / "runs", extra=extra)
    for old, new in replace.items():
        text = text.replace(old, new)
    path = tmp_path / "ladder.toml"
    path.write_text(text)
    return path


def test_the_grid_is_one_run_per_combination_each_in_its_own_directory(tmp_path):
    from raygeom.analyses.train import checkpoint_steps
    from raygeom.jobspec import load_job

    job = load_job(_write(tmp_path))
    runs = [(r.variant, r.settings.hidden_size, r.settings.n_heads, r.settings.seed, Path(r.run_dir).name) for r in job.trains]
    assert runs == [
        ("d32-seed0", 32, 2, 0, "d32-seed0"),
        ("d32-seed1", 32, 2, 1, "d32-seed1"),
        ("d64-seed0", 64, 4, 0, "d64-seed0"),
        ("d64-seed1", 64, 4, 1, "d64-seed1"),
    ]
    shared = {(r.settings.steps, r.settings.n_layers, r.settings.data_fields(), r.plan().steps) for r in job.trains}
    assert len(shared) == 1  # everything but width and seed is the same
    assert len({r.plan().key(r.settings) for r in job.trains}) == 4
    specs = job.model_specs()  # before training: the checkpoints each run will write
    steps = checkpoint_steps(20, 10, 0)
    assert len(specs) == 4 * len(steps)
    assert {s.name for s in specs} == {"d32-seed0", "d32-seed1", "d64-seed0", "d64-seed1"}
    assert job.corpus == str(tmp_path / "runs" / "d32-seed0" / "heldout.jsonl")  # the runs share their held-out texts


def test_several_grids_of_one_analysis_are_kept_apart_and_not_repeated(tmp_path):
    from raygeom.jobspec import load_job

    planned = [
        (p.analysis, getattr(p.params, "k_per_d", None), p.params.k, getattr(p.params, "r", None))
        for p in load_job(_write(tmp_path)).planned()
    ]
    assert planned == [("pga", 0.25, 100, 0), ("pga", 0.25, 100, 1), ("pga", 0.0, 4, 1), ("spectral", 0.25, 100, None)]
    doubled = load_job(_write(tmp_path, "[[analyses.pga]]\nk = 4\nr = [1, 5]", **{"[analyses.spectral]\nk_per_d = 0.25": ""}))
    again = [(p.params.k_per_d, p.params.k, p.params.r) for p in doubled.planned()]
    assert again == [(0.25, 100, 0), (0.25, 100, 1), (0.0, 4, 1), (0.0, 4, 5)]  # k = 4, r = 1 is planned once


@pytest.mark.parametrize("d, k_per_d, k", [(32, 0.25, 8), (64, 0.25, 16), (100, 0.1, 10), (30, 0.01, 1)])
def test_k_per_d_sets_k_from_each_models_width(d, k_per_d, k):
    from raygeom.params import PGAParams, for_width

    assert for_width(PGAParams(k_per_d=k_per_d), d).k == k
    assert for_width(PGAParams(k=7), d).k == 7  # no k/d: the fixed k
    assert for_width(PGAParams(k_per_d=k_per_d), None).k == 100  # width unknown: unchanged


def test_a_fixed_k_keeps_its_unit_key_and_k_per_d_gets_its_own():
    from raygeom.analyses.pga import PGA_VERSION, pga_unit_key
    from raygeom.params import PGAParams, for_width
    from raygeom.store.tree import content_key

    assert pga_unit_key("x", "block_00", PGAParams(k=16)) == content_key("pga", PGA_VERSION, "x", "block_00", 16, 1, 100, 0, 10)
    resolved = for_width(PGAParams(k_per_d=0.25), 64)
    assert resolved.k == 16 and pga_unit_key("x", "block_00", resolved) != pga_unit_key("x", "block_00", PGAParams(k=16))


@pytest.mark.parametrize(
    "extra, replace, message",
    [
        ("", {"seq_len = 16": "seq_len = [16, 32]"}, "seq_len cannot be a list: every run of a grid shares its data"),
        ("", {"head_dim = 16": "head_dim = 24"}, "hidden_size 32 is not a multiple of head_dim 24"),
        ("", {"seed = [0, 1]": "seed = [0, 0]"}, "seed must list distinct values"),
        ("", {"seed = [0, 1]": "seed = []"}, "seed must list distinct values"),
        (
            "[width]\nreport = 'w.md'",
            {"hidden_size = [32, 64]": "hidden_size = 32"},
            "[train] needs hidden_size = [a list of widths]",
        ),
        ("[width]\npositive_z = 'x'", {}, "[width] positive_z"),
        ("", {"k_per_d = 0.25\nr = [0, 1]": "k_per_d = 1.5\nr = [0, 1]"}, "k_per_d"),
    ],
)
def test_a_bad_grid_is_refused_in_one_line_through_the_cli(tmp_path, extra, replace, message):
    job = _write(tmp_path, extra, **replace)
    done = subprocess.run(
        [sys.executable, "-m", "raygeom.cli", "plan", str(job)], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "store").exists() and not (tmp_path / "runs").exists()


def test_mean_t_interval_is_scipys_t_interval():
    from raygeom.numerics.uncertainty import mean_t_interval

    rng = np.random.default_rng(3)
    for n in (2, 3, 8):
        x = rng.normal(size=n)
        got = mean_t_interval(x)
        lo, hi = stats.t.interval(0.95, n - 1, loc=x.mean(), scale=stats.sem(x))
        assert got["lo"] == pytest.approx(lo) and got["hi"] == pytest.approx(hi) and got["n"] == n
    one = mean_t_interval([1.5])
    assert one["mean"] == 1.5 and np.isnan(one["lo"]) and np.isnan(one["hi"])
    with pytest.raises(RaygeomError):
        mean_t_interval([])


@pytest.mark.parametrize(
    "cluster, runs, expected",
    [
        ({"CPU": 2.0}, [(1, 1.0, False)] * 2, 2),  # the tiny ladder: both runs at once
        ({"CPU": 2.0}, [(1, 2.0, False)] * 8, 1),  # jobs/width.toml here: a run takes both CPUs
        ({"CPU": 64.0}, [(2, 4.0, False)] * 8, 8),  # a cluster holds the whole grid
        ({"CPU": 64.0}, [(2, 4.0, False)] * 9, 8),
        ({"CPU": 64.0, "GPU": 4.0}, [(2, 1.0, True)] * 8, 2),  # GPUs are the bound
        ({"CPU": 1.0}, [(1, 2.0, False)] * 3, 1),  # never 0: a run that does not fit waits for Ray, as before
        ({"CPU": 8.0}, [(1, 1.0, False), (1, 4.0, False)], 2),  # the largest run decides
    ],
)
def test_runs_at_once_is_what_the_cluster_holds(cluster, runs, expected):
    from types import SimpleNamespace

    from raygeom.jobs.trajectory import runs_at_once

    settings = [SimpleNamespace(workers=w, cpus_per_worker=c, use_gpu=g) for w, c, g in runs]
    assert runs_at_once(settings, cluster) == expected
