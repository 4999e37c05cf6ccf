"""`raygeom plan` prints a line only where it applies (issue 45 item 3): the download line for hub revisions alone (a
built-in downloads nothing), GPU columns and GPU-hours only where the job or this machine has GPUs, and the measured
cost counts the stored units of every planned analysis."""

import re

import pytest

from raygeom.jobs import plan as sweep
from tests.unit.test_plan_words import plan_of

HEAD = """[job]
name = "lines"
out = "{out}"
[corpus]
name = "bbc"
n_samples = 40
"""


def plan(tmp_path, monkeypatch, body: str) -> str:
    return plan_of(tmp_path, monkeypatch, HEAD.format(out=tmp_path / "store") + body)


def test_a_built_in_downloads_nothing(tmp_path, monkeypatch):
    text = plan(tmp_path, monkeypatch, '[[models]]\nid = "smollm2"\n[pga]\nk = 8\nn_null = 10\n')
    assert "download:" not in text and "Pythia table" not in text
    assert "134.5M" in text  # what the loaded model counts (the store's params after a run), not 121.2M


def test_hub_revisions_say_what_they_download(tmp_path, monkeypatch):
    text = plan(
        tmp_path, monkeypatch, '[[models]]\nid = "EleutherAI/pythia-14m"\nrevisions = ["step1000"]\n[pga]\nk = 8\nn_null = 10\n'
    )
    assert "download: " in text and "of weights (fp16, from the Pythia table)" in text


SWEEP = '[sweep]\nsizes = ["14m"]\nrevisions = ["step1000", "step2000"]\nanalysis_threads = 2\n{gpus}[pga]\nk = 8\nn_null = 10\n'


def test_a_sweep_without_gpus_on_a_cpu_machine_shows_no_gpu_line(tmp_path, monkeypatch):
    text = plan(tmp_path, monkeypatch, SWEEP.format(gpus=""))
    assert "GPU" not in text, text
    assert re.search(r"reference rates, see docs/sweeps.md\): pga \d+\.\d (s|min|h) of CPU time;", " ".join(text.split()))


def test_a_sweep_that_says_its_gpus_shows_them(tmp_path, monkeypatch):
    text = plan(tmp_path, monkeypatch, SWEEP.format(gpus="gpus_per_node = 8\n"))
    assert "GPUs/replica (80 GiB)" in text and "GPU-hours (A100)" in text


def test_the_measured_cost_counts_every_analysis(tmp_path):
    """A store holding the units of [analyses.pga] and [analyses.spectral]: measured counts them all (it said 0 PGA
    units: it read the [pga] section's keys, which such a job does not run)."""
    import pyarrow as pa

    from raygeom.jobspec import load_job

    job = tmp_path / "job.toml"
    body = '[[models]]\nid = "smollm2"\n[extract]\nlayers = "0,5"\n[analyses.pga]\nk = 8\nr = [0, 1]\nn_null = 10\n[analyses.spectral]\nk = 8\n'
    job.write_text(HEAD.format(out=tmp_path / "store") + body)
    built = sweep.build_plan(load_job(job))
    (revision,) = built.revisions
    for label, units in revision.analysis_units.items():
        revision.analysis_done[label] = set(units)  # every unit stored
    pga = pa.table({"cpu_seconds": [1.0, 3.0], "n": [40, 40], "n_null": [10, 10], "unit_key": ["a", "b"]})
    spectral = pa.table({"cpu_seconds": [0.5], "n": [40], "d": [576], "unit_key": ["c"]})
    built.store.read_results = lambda name, keys=None: {"pga": pga, "spectral": spectral}[name]
    cost = sweep.estimate(built)
    assert cost.measured_units == 3 * 2 and cost.stored == {"pga r=0": 2, "pga r=1": 2, "spectral": 2}
    # every analysis's rate: CPU-seconds per its declared work, (n_null + 1) N^2 for PGA, N d min(N, d) by default
    assert cost.analyses["pga"].rate == 4.0 / (2 * 11 * 40**2) and cost.analyses["pga"].remaining_seconds == 0
    assert cost.analyses["spectral"].rate == 0.5 / (40 * 576 * 40) and cost.remaining_analysis_seconds == 0
    revision.analysis_done["pga r=1"] = set()  # two PGA units of 10 nulls to compute
    revision.analysis_done["spectral"] = set(list(revision.analysis_units["spectral"])[:1])  # and one spectral unit
    missing = sweep.estimate(built)
    assert missing.analyses["pga"].remaining_seconds == 2 * 11 * 40**2 * cost.analyses["pga"].rate
    assert missing.analyses["spectral"].remaining_seconds == pytest.approx(0.5)  # smollm2: d = 576, as measured
    assert missing.remaining_analysis_seconds == pytest.approx(2 * 2.0 + 0.5)
    revision.analysis_done["spectral"] = set()  # none measured: its missing units are not priced
    assert sweep.estimate(built).analyses["spectral"].remaining_seconds is None
