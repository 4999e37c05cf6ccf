"""Points inside blocks through the real CLI, as a user runs it (a subprocess, an empty working directory, stdout a
pipe as in `ray job logs` or `> file`): pga, a sweep job file and the report; tables keep their full layer names."""

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args, cwd):
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "raygeom.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
        check=False,
    )


@pytest.fixture
def empty_dir(tmp_path):
    directory = tmp_path / "cwd"
    directory.mkdir()
    return directory


def test_piped_pga_prints_full_layer_names_inside_blocks_and_the_report_shows_them(
    hub_cache, ray_address, tiny_corpus, tmp_path, empty_dir
):
    out = tmp_path / "out"
    done = run_cli(
        "pga",
        "--model",
        "EleutherAI/pythia-14m",
        "--revision",
        "step1000",
        "--corpus",
        tiny_corpus,
        "--n-samples",
        "24",
        "--seq-len",
        "16",
        "--k",
        "8",
        "--n-null",
        "6",
        "--layers",
        "1.mlp_out,block_01.resid_mid,1.attn_out,1",
        "--out",
        out,
        "--address",
        ray_address,
        cwd=empty_dir,
    )
    assert done.returncode == 0, done.stderr
    table = [line for line in done.stdout.splitlines() if line.startswith("│")]
    assert [line.split("│")[1].strip() for line in table] == [
        "block_01.attn_out",
        "block_01.resid_mid",
        "block_01.mlp_out",
        "block_01",
    ]
    assert "…" not in done.stdout and max(len(line) for line in done.stdout.splitlines()) > 80
    rows = pq.read_table(out / "results" / "pga.parquet").to_pylist()
    depth = {row["layer"]: row["relative_depth"] for row in rows}
    assert depth["block_01.attn_out"] < depth["block_01.resid_mid"] < depth["block_01.mlp_out"] < depth["block_01"]
    assert {row["layer_index"] for row in rows} == {2}
    report = run_cli("report", out, cwd=empty_dir)
    assert report.returncode == 0, report.stderr
    html = (out / "report.html").read_text()
    for layer in ("block_01.attn_out", "block_01.resid_mid", "block_01.mlp_out"):
        assert layer in html


def test_a_sweep_job_file_names_points_inside_blocks(hub_cache, ray_address, tiny_corpus, tmp_path, empty_dir):
    """The plan of a sweep counts them, its run scores them and the report shows them; a point the family lacks
    is refused by the plan."""
    from raygeom.testing import write_tiny_job

    job = write_tiny_job(
        tmp_path / "job.toml",
        "inside",
        tmp_path / "sweep",
        tiny_corpus,
        models='[[models]]\nid = "EleutherAI/pythia-14m"\nrevisions = ["step1000"]\n',
    )
    job.write_text(job.read_text().replace("batch_size = 8", 'batch_size = 8\nlayers = "-1.mlp_out,2.resid_mid"'))
    plan = run_cli("plan", job, cwd=empty_dir)
    assert plan.returncode == 0, plan.stderr
    assert "-> 2 units" in plan.stdout
    swept = run_cli("run", job, "--address", ray_address, cwd=empty_dir)
    assert swept.returncode == 0, swept.stdout[-2000:] + swept.stderr[-2000:]
    rows = pq.read_table(tmp_path / "sweep" / "results" / "pga.parquet").to_pylist()
    assert sorted(row["layer"] for row in rows) == ["block_02.mlp_out", "block_02.resid_mid"]
    html = (tmp_path / "sweep" / "report.html").read_text()
    assert "block_02.mlp_out" in html and "block_02.resid_mid" in html
    job.write_text(job.read_text().replace("-1.mlp_out", "-1.ffn_out"))
    bad = run_cli("plan", job, cwd=empty_dir)
    assert bad.returncode == 2 and "layer '-1.ffn_out' not found" in bad.stderr and "Traceback" not in bad.stderr
