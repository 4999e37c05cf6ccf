"""`raygeom plan` on a job whose [train] has not run: what training will write, and the units after it."""

from pathlib import Path

from typer.testing import CliRunner

from raygeom.cli.root import app
from raygeom.analyses.train import checkpoint_steps

JOB = Path(__file__).resolve().parents[2] / "jobs" / "trajectory.toml"


def _job_into(tmp_path: Path, steps: int, n_layers: int) -> Path:
    text = JOB.read_text()
    text = text.replace('run_dir = "runs/trajectory/checkpoints"', f'run_dir = "{tmp_path / "ckpt"}"')
    text = text.replace("steps = 800", f"steps = {steps}").replace("n_layers = 4", f"n_layers = {n_layers}")
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def test_plan_before_training_counts_checkpoints_and_units(tmp_path):
    job = _job_into(tmp_path, steps=300, n_layers=3)
    result = CliRunner().invoke(app, ["plan", str(job), "--out", str(tmp_path / "store")], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    n_checkpoints = len(checkpoint_steps(300, 100, 512))  # the job's save_every = 100, log_until = 512
    assert f"[train] has not run yet" in result.output
    assert f"{n_checkpoints} checkpoints x 5 layers -> {n_checkpoints * 5} PGA units" in result.output
    assert "0 done" in result.output


def test_plan_after_training_reads_the_held_out_corpus(tmp_path):
    job = _job_into(tmp_path, steps=300, n_layers=3)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "heldout.jsonl").write_text("")  # present but empty: the normal plan reads it and refuses
    result = CliRunner().invoke(app, ["plan", str(job), "--out", str(tmp_path / "store")], env={"COLUMNS": "250"})
    assert "has not run yet" not in result.output
    assert result.exit_code == 2
