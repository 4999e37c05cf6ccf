"""An analysis that lives in another package joins raygeom through the ``raygeom.analyses`` entry-point group: a
temporary distribution (a module and its dist-info with entry_points.txt) on the CLI's PYTHONPATH, then
``raygeom run`` of a job file naming it, from an empty directory. Its table holds the participation ratio of each
layer, checked against numpy on the stored vectors. The same package draws it its own way through the
``raygeom.renderers`` group, with the renderer module CONTRIBUTING.md shows: its report section and its PNG."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

MODULE = """
from dataclasses import dataclass

from raygeom.analyses.registry import Metric, Params, PerLayer, param, read_layer, register


@dataclass(frozen=True)
class PRParams(Params):
    centred: bool = param(True, "Centre the vectors first.")


def pr_task(root, model, revision, layer, centred, key):
    import numpy as np

    h = read_layer(root, model, revision, layer, key)[1].astype(np.float64)
    if centred:
        h = h - h.mean(axis=0)
    s = np.linalg.svd(h, compute_uv=False) ** 2
    return float(s.sum() ** 2 / (s ** 2).sum())


@register
class ParticipationRatio(PerLayer):
    name = "participation_ratio"
    version = 1
    Params = PRParams
    title = "Participation ratio"
    columns = ("centred", "participation_ratio")
    metrics = (Metric("participation_ratio", "participation ratio"),)
    series = ("centred",)
    task = pr_task
    arguments = ("centred",)

    def finish(self, params, value):
        return {"participation_ratio": value}
"""

JOB = """[job]
name = "outside"
out = "store"
[[models]]
id = "EleutherAI/pythia-14m"
revisions = ["step1000"]
[corpus]
name = "{corpus}"
n_samples = 30
[extract]
seq_len = 16
batch_size = 8
layers = "embed,1,final_norm"
[analyses.participation_ratio]
centred = [true, false]
"""


def contributing_renderer() -> str:
    """The renderer module of CONTRIBUTING.md's "How it is drawn", for this package's analysis."""
    [(path, body)] = re.findall(r"<!-- plugin file: (\S+) -->\n```python\n(.*?)```", (ROOT / "CONTRIBUTING.md").read_text(), re.S)
    assert path == "my_package/drawing.py" and 'NAME = "mean_norm"' in body
    return body.replace('NAME = "mean_norm"', 'NAME = "participation_ratio"')


def test_an_analysis_from_another_package_runs_from_a_job_file(tmp_path, hub_cache, tiny_corpus):
    site = tmp_path / "site"
    (site / "outside_pkg").mkdir(parents=True)
    (site / "outside_pkg" / "__init__.py").write_text("")
    (site / "outside_pkg" / "pr.py").write_text(MODULE)
    (site / "outside_pkg" / "drawing.py").write_text(contributing_renderer())
    info = site / "outside_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: outside-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[raygeom.analyses]\nparticipation_ratio = outside_pkg.pr\n[raygeom.renderers]\nparticipation_ratio = outside_pkg.drawing\n"
    )
    workdir = tmp_path / "empty"
    workdir.mkdir()
    (workdir / "job.toml").write_text(JOB.format(corpus=tiny_corpus))
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=f"{site}{os.pathsep}{ROOT}", COLUMNS="200")

    def cli(*args):
        return subprocess.run(
            [sys.executable, str(ROOT / "cli.py"), *args], capture_output=True, text=True, env=env, cwd=workdir, timeout=600
        )

    helped = cli("analyze", "participation_ratio", "--help")
    assert helped.returncode == 0 and "--centred" in helped.stdout, helped.stdout + helped.stderr
    # Its own local Ray: the workers inherit this PYTHONPATH, as every worker has an installed package.
    done = cli("run", "job.toml", "--num-cpus", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Participation ratio" in done.stdout and not done.stderr.strip(), done.stderr
    # drawn by its own renderer: its PNG instead of the generic one, its section in the report
    plots = workdir / "store" / "plots"
    assert (plots / "participation_ratio_by_depth.png").is_file()
    assert not list(plots.glob("participation_ratio_participation_ratio_vs_depth.png"))
    report = (workdir / "store" / "report.html").read_text()
    assert "participation_ratio at the last layer of each model" in report
    assert "<section id='participation_ratio'><h2>Participation ratio</h2>" in report
    rows = pq.read_table(workdir / "store" / "results" / "participation_ratio.parquet").to_pylist()
    assert sorted((r["layer"], r["centred"]) for r in rows) == sorted(
        (layer, centred) for layer in ("embed", "block_01", "final_norm") for centred in (True, False)
    )
    from raygeom.store.tree import Store

    store = Store(workdir / "store")
    for row in rows:
        h = store.read_layer(row["model"], row["revision"], row["layer"])[1].astype(np.float64)
        if row["centred"]:
            h = h - h.mean(axis=0)
        eigen = np.linalg.eigvalsh(h.T @ h)  # the same ratio from the Gram matrix's eigenvalues, not the SVD
        assert row["participation_ratio"] == pytest.approx(eigen.sum() ** 2 / (eigen**2).sum(), rel=1e-6)
    refused = cli("participation_ratio", "--n-samples", "1.5", "--out", "refused")
    assert refused.returncode == 2 and len([line for line in refused.stderr.splitlines() if line.strip()]) == 1, refused.stderr
    assert not (workdir / "refused").exists()
