"""`raygeom plan` says what the job says: the PGA grid as given (r = 0, 1, 5), the units of every planned analysis per
model, GPUs only where the job or the machine has them, and the parameters of a model whose shape is known."""

from typer.testing import CliRunner

from raygeom.jobs import plan as sweep

JOB = """[job]
name = "words"
out = "{out}"
[[models]]
id = "smollm2"
[[models]]
id = "EleutherAI/pythia-14m"
revisions = ["step1000", "step143000"]
[corpus]
name = "bbc"
n_samples = 40
[analyses.pga]
k = 8
r = [0, 1, 5]
n_null = 20
[analyses.spectral]
k = 8
"""


def plan(tmp_path, monkeypatch, extra: str = "") -> str:
    return plan_of(tmp_path, monkeypatch, JOB.format(out=tmp_path / "store") + extra)


def plan_of(tmp_path, monkeypatch, text: str) -> str:
    """`raygeom plan` of this job file's text, on a machine without a GPU, its output on one line."""
    from raygeom.cli.root import app

    cached = sweep.cached_config  # pythia's layers from Pythia's table, not whatever hub cache this machine has
    monkeypatch.setattr(sweep, "cached_config", lambda spec: None if "pythia" in spec.source else cached(spec))
    monkeypatch.setattr("shutil.which", lambda name: None)  # no GPU on this machine
    job = tmp_path / "job.toml"
    job.write_text(text)
    result = CliRunner().invoke(app, ["plan", str(job)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_plan_names_the_grid_as_given_and_counts_every_analysis(tmp_path, monkeypatch):
    text = plan(tmp_path, monkeypatch)
    assert "k=8, r = 0, 1, 5, n_null=20, seed=0" in text and "CCR-1" not in text
    assert "--n-null auto" not in text and "GPUs" not in text  # n_null is fixed; no [sweep], no GPU here
    # smollm2's shape is known without loading it: 30 blocks of d = 576, vocab 49,152, tied
    assert "smollm2-135m-instruct-q4_1 | 134.5M | 32 (config) | main | 128 | 0" in text.replace("│", "|")
    # pythia-14m (8 layers from Pythia's table) x 2 revisions x (3 PGA ranks + spectral)
    assert "EleutherAI/pythia-14m | 1" in text.replace("│", "|") and "| 64 | 0" in text.replace("│", "|")


def test_a_sweep_job_shows_gpus_per_replica(tmp_path, monkeypatch):
    assert "GPUs/replica (80 GiB)" in plan(tmp_path, monkeypatch, "[sweep]\ngpu_memory_gib = 80\n")


def test_units_per_model_are_the_pooled_extractions_and_the_grid_adds_the_analyses_with_their_own(tmp_path, monkeypatch):
    gap = "[analyses.gap]\nchunk_len = 64\nchunks_per_domain = 3\n"
    text = plan(tmp_path, monkeypatch, gap).replace("│", "|")
    # 128 + 64 pooled units (as above) and one gap unit per (model, revision): 3
    assert "pooled units" in text and "-> 195 units; 0 done, 195 to compute" in text
    only = JOB.split("[analyses.pga]")[0] + gap
    monkeypatch.setattr("raygeom.jobs.plan.cached_config", lambda spec: None)
    job = tmp_path / "only.toml"
    job.write_text(only.format(out=tmp_path / "store"))
    from raygeom.cli.root import app

    result = CliRunner().invoke(app, ["plan", str(job)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "params" in line and "revisions" in line)
    assert "units" not in header and "done" not in header  # no per-model units to show
    assert "-> 3 units; 0 done, 3 to compute" in " ".join(result.output.split())
