"""A user's own training run (HF Trainer-style checkpoint-N/ directories) swept exactly like hub revisions:
steps parsed into every table, resume, weight-duplicate flags, plan/status and the heatmap."""

import json
import shutil

import pyarrow.parquet as pq
import pytest
from rich.console import Console
from typer.testing import CliRunner

from raygeom.jobspec import load_job

pytestmark = pytest.mark.integration

STEPS = (10, 20, 30, 40)  # checkpoint-40 is a copy of checkpoint-30
LAYERS = 5  # embed, 3 blocks, final_norm


def write_trainer_run(root):
    """What transformers.Trainer leaves behind: checkpoint-N/ with weights, trainer state and optimizer,
    the tokenizer only at the run's root (a Trainer not given the tokenizer saves none per checkpoint)."""
    from raygeom.testing import tiny_gpt_neox, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(root)
    for seed, step in enumerate(STEPS[:-1]):
        directory = root / f"checkpoint-{step}"
        tiny_gpt_neox(len(tokenizer), 500 + seed).save_pretrained(directory)
        (directory / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        (directory / "optimizer.pt").write_bytes(b"not read")
    shutil.copytree(root / f"checkpoint-{STEPS[-2]}", root / f"checkpoint-{STEPS[-1]}")
    (root / "runs").mkdir()  # TensorBoard logs sit beside the checkpoints
    return root


def write_job(directory, run_dir, out, corpus, extra: str = ""):
    from raygeom.testing import write_tiny_job

    return write_tiny_job(
        directory / "trajectory.toml",
        "own-run",
        out,
        corpus,
        sweep="analysis_threads = 2\n",
        models=f'[[models]]\nrun_dir = "{run_dir}"\n',
        extra=extra,
    )


_TRAJECTORY: dict = {}


def trajectory_run(tmp_path_factory) -> dict:
    """One trajectory job per session over one trainer run (its sweep computes every unit on a fresh store, then the
    trajectory analyses run): these tests inspect its sweep, test_trajectory its rankings and report."""
    if not _TRAJECTORY:
        from raygeom.jobs.trajectory import run_trajectory_job
        from raygeom.testing import TINY_TEXT, varied_text

        root = tmp_path_factory.mktemp("trajectory")
        run = write_trainer_run(root / "my-run")
        sentences = [s for s in TINY_TEXT.split(" . ") if s]
        corpus = root / "heldout.jsonl"
        # A varied start: without it the first 32 tokens gave the embedding rank 8 to 10 in 40 texts, too few to be scored.
        corpus.write_text(
            "".join(
                json.dumps(
                    {
                        "text": f"{varied_text(i)} {sentences[i % 5]} in {1990 + i} about {i * 7} "
                        f"{sentences[(i + 2) % 5]} . " * 3,
                        "label": f"topic{i % 3}",
                    }
                )
                + "\n"
                for i in range(45)
            )
        )
        job_file = write_job(
            root,
            run,
            root / "out",
            corpus,
            extra=f"""
[trajectory]
chunk_len = 32
chunks_per_domain = 3
batch_size = 3
late_from = 20
bootstrap = 200
report = "{root / "docs" / "trajectory.md"}"
""",
        )
        _TRAJECTORY.update(root=root, job_file=job_file, outputs=run_trajectory_job(load_job(job_file), Console(quiet=True)))
    return _TRAJECTORY


@pytest.fixture(scope="module")
def swept(ray_local, tmp_path_factory):
    run = trajectory_run(tmp_path_factory)
    return run["job_file"], run["outputs"]["swept"]


def test_every_checkpoint_is_a_revision_with_its_step(swept):
    _, outputs = swept
    assert outputs.computed_units == len(outputs.over_revisions["pga"].rows) == len(STEPS) * LAYERS
    table = pq.read_table(outputs.files["pga"][0]).to_pylist()
    assert {r["model"] for r in table} == {"my-run"}
    assert sorted({(r["revision"], r["step"]) for r in table}) == [(f"checkpoint-{s}", s) for s in STEPS]
    assert [r["step"] for r in table if r["layer"] == "final_norm"] == list(STEPS)  # in step order
    zones = pq.read_table(outputs.over_revisions["pga"].collapse).to_pylist()
    assert sorted(z["step"] for z in zones) == list(STEPS)
    assert any(p.name == "heatmap_my-run.png" for p in outputs.over_revisions["pga"].plots)


def test_a_copied_checkpoint_is_flagged_and_the_others_are_not(swept):
    _, outputs = swept
    flags = {r["revision"]: r["weights_flag"] for r in pq.read_table(outputs.revisions).to_pylist()}
    assert flags == {
        "checkpoint-10": None,
        "checkpoint-20": None,
        "checkpoint-30": "same weights as checkpoint-40",
        "checkpoint-40": "same weights as checkpoint-30",
    }
    assert [f[1] for f in outputs.flagged] == ["checkpoint-30", "checkpoint-40"]


def test_rerun_computes_nothing_and_status_plan_read_the_store(swept):
    from raygeom.cli.root import app
    from raygeom.jobs.run import run

    job_file, first = swept
    again = run(load_job(job_file), Console(quiet=True))
    assert again.computed_units == 0 and len(again.over_revisions["pga"].rows) == len(first.over_revisions["pga"].rows)
    runner = CliRunner()
    status = runner.invoke(app, ["status", str(job_file)], env={"COLUMNS": "200"})
    assert status.exit_code == 0, status.output
    assert "20/20" in status.output and "my-run@checkpoint-30: same weights as checkpoint-40" in status.output
    plan = runner.invoke(app, ["plan", str(job_file)], env={"COLUMNS": "200"})
    assert plan.exit_code == 0, plan.output
    assert "4: checkpoint-10 .. checkpoint-40" in plan.output and "0 to compute" in plan.output


def test_a_job_naming_a_missing_run_directory_fails_with_one_line(tmp_path):
    from raygeom.cli.root import app

    job_file = write_job(tmp_path, tmp_path / "never-trained", tmp_path / "out", "bbc")
    result = CliRunner().invoke(app, ["plan", str(job_file)])
    assert result.exit_code == 2 and "run directory not found" in result.output
