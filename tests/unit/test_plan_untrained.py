"""`raygeom plan` on a job whose [train] has not run: what training will write, and the units after it."""

import re
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raygeom.analyses.train import checkpoint_steps
from raygeom.cli.root import app
from raygeom.errors import RaygeomError

JOB = Path(__file__).resolve().parents[2] / "jobs" / "trajectory.toml"
SAVES = (tomllib.loads(JOB.read_text())["train"]["save_every"], tomllib.loads(JOB.read_text())["train"]["log_until"])


def _job_into(tmp_path: Path, steps: int, n_layers: int) -> Path:
    text = JOB.read_text()
    assert 'run_dir = "../runs/trajectory/checkpoints"' in text
    text = text.replace('run_dir = "../runs/trajectory/checkpoints"', f'run_dir = "{tmp_path / "ckpt"}"')
    text = re.sub(r"(?m)^steps = \d+", f"steps = {steps}", text).replace("n_layers = 4", f"n_layers = {n_layers}")
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def test_plan_before_training_counts_checkpoints_and_units(tmp_path):
    job = _job_into(tmp_path, steps=300, n_layers=3)
    # plan times a few real training steps for the estimate (20 of them, a tokenizer trained first): with the job's
    # 8 x 128-token batches, its 4,096-token vocabulary and all of BBC that took 31 s in CI (95-200 s on a loaded machine);
    # small batches of a 300-text corpus take a few seconds. What the table shows of the run is the same.
    text = job.read_text()
    for old, new in {
        "batch_size = 8\nseq_len = 128\n": "batch_size = 2\nseq_len = 16\nmax_texts = 300\n",
        "vocab_size = 4096": "vocab_size = 512",
    }.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    job.write_text(text)
    result = CliRunner().invoke(app, ["plan", str(job), "--out", str(tmp_path / "store")], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    n_checkpoints = len(checkpoint_steps(300, *SAVES))  # the job's save_every and log_until
    run = next(line for line in result.output.splitlines() if "to train" in line)
    assert [cell.strip() for cell in run.split("│")[1:8]] == [str(v) for v in ("ckpt", 128, 4, 3, 0, 300, n_checkpoints)], run
    assert run.rstrip("│ ").endswith(("s", "min"))  # the measured time of the run
    from raygeom.jobspec import load_job

    planned = len(load_job(job).planned())
    assert (
        f"then: {n_checkpoints} checkpoints x 5 layers x {planned} planned analyses -> {n_checkpoints * 5 * planned:,} units"
        in result.output
    )
    assert "0 done" in result.output


def test_plan_after_training_reads_the_held_out_corpus(tmp_path):
    job = _job_into(tmp_path, steps=300, n_layers=3)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "heldout.jsonl").write_text("")  # present but empty: the normal plan reads it and refuses
    result = CliRunner().invoke(app, ["plan", str(job), "--out", str(tmp_path / "store")], env={"COLUMNS": "250"})
    assert "has not run yet" not in result.output
    assert result.exit_code == 2


def test_a_train_job_lists_the_checkpoints_it_will_write_before_its_run_directory_exists(tmp_path):
    # `raygeom run` checked the job's sizes by listing the run directory first: `run directory not found` before training.
    from raygeom.jobs.preflight import check_sizes
    from raygeom.jobspec import load_job

    job = load_job(_job_into(tmp_path, steps=300, n_layers=3))
    assert not (tmp_path / "ckpt").exists()
    specs = job.model_specs()
    assert [s.revision for s in specs] == [f"step{s}" for s in checkpoint_steps(300, *SAVES)]
    assert {(s.kind, s.source) for s in specs} == {("checkpoint", str((tmp_path / "ckpt").resolve()))}
    check_sizes(job, job.model_specs())  # d comes from [train]'s hidden_size: k = 32 < d = 128
    assert not (tmp_path / "ckpt").exists()
    small = tmp_path / "small.toml"
    small.write_text(_job_into(tmp_path, steps=300, n_layers=3).read_text().replace("hidden_size = 128", "hidden_size = 32"))
    with pytest.raises(RaygeomError, match="k must satisfy 0 < k < d; got k=32, d=32"):
        check_sizes(load_job(small), load_job(small).model_specs())


def test_plan_of_a_ladder_lists_the_runs_its_skip_leaves_and_writes_nothing(tmp_path):
    """jobs/width.toml's grid with its skip, planned before anything is trained, from another directory."""
    from raygeom.testing import write_labelled_corpus

    corpus = write_labelled_corpus(tmp_path / "texts.jsonl", 200)
    text = (JOB.parent / "width.toml").read_text()
    for old, new in {
        "hidden_size = [128, 256, 512]": "hidden_size = [32, 48]",
        "n_layers = [4, 8, 12]": "n_layers = [1, 2]",
        "skip = [{hidden_size = 512, n_layers = 8}, {hidden_size = 512, n_layers = 12}]": "skip = [{hidden_size = 48, n_layers = 2}]",
        'corpus = "bbc"': f'corpus = "{corpus}"',
        "vocab_size = 1024": "vocab_size = 300",
        "eval_sequences = 64": "eval_sequences = 4",
        "seed = [0, 1]": "seed = [0]",
    }.items():
        assert old in text, old
        text = text.replace(old, new)
    work = tmp_path / "work"
    (work / "jobs").mkdir(parents=True)
    (work / "jobs" / "width.toml").write_text(text)
    result = CliRunner().invoke(app, ["plan", str(work / "jobs" / "width.toml")], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    runs = [line.split("│")[1].strip() for line in result.output.splitlines() if "│ to train │" in line]
    assert runs == ["d32-l1-seed0", "d32-l2-seed0", "d48-l1-seed0"], result.output
    assert [p.name for p in work.iterdir()] == ["jobs"]  # plan writes nothing
