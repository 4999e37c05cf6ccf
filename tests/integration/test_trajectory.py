"""Trajectories: training saves loadable checkpoints on its schedule (in process, the loop Ray Train runs),
and a trajectory job sweeps a run directory, ranks its checkpoints by G against perplexity, writes its
report, and computes nothing on a rerun."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from raygeom.analyses import train
from raygeom.errors import RaygeomError
from raygeom.jobs import train as train_job
from raygeom.jobspec import load_job

pytestmark = pytest.mark.integration

SMALL = dict(steps=6, batch_size=4, seq_len=32, hidden_size=32, n_layers=2, n_heads=4, vocab_size=300, eval_every=6, warmup=2)


@pytest.fixture(scope="module")
def data():
    from raygeom.testing import TINY_TEXT

    sentences = [s for s in TINY_TEXT.split(" . ") if s]
    rng = np.random.default_rng(0)
    texts = [" . ".join(sentences[j] for j in rng.permutation(len(sentences))) for _ in range(40)]
    tokenizer = train.train_tokenizer(texts[:30], 300)
    return train.TrainData(
        train.sequences(tokenizer, texts[:30], 32),
        train.sequences(tokenizer, texts[30:], 32)[:4],
        len(tokenizer),
        tokenizer.eos_token_id,
        tokenizer,
        tuple(texts[30:]),
    )


def test_training_saves_loadable_checkpoints_on_its_schedule(data, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from raygeom.sources.models import resolve_models

    settings = train.TrainSettings(**SMALL, seed=3)
    plan = train.CheckpointPlan(str(tmp_path / "run"), train.checkpoint_steps(settings.steps, 3))
    assert plan.steps == (0, 1, 2, 4, 6)
    (tmp_path / "run").mkdir()
    history = train.fit(settings, data, checkpoints=plan)
    specs = resolve_models(str(tmp_path / "run"))
    assert [(s.revision, s.step) for s in specs] == [(f"step{s}", s) for s in plan.steps]
    initial = train.build_model(settings, data.vocab_size, data.eos_id).state_dict()
    for step in plan.steps:
        directory = tmp_path / "run" / f"step{step}"
        model = AutoModelForCausalLM.from_pretrained(directory)
        tokenizer = AutoTokenizer.from_pretrained(directory)
        assert tokenizer("the market rose")["input_ids"] == data.tokenizer("the market rose")["input_ids"]
        info = json.loads((directory / train.CHECKPOINT_INFO).read_text())
        assert info["step"] == step and info["key"] == plan.key(settings) and np.isfinite(info["heldout_perplexity"])
        same = all(torch.equal(model.state_dict()[name], tensor) for name, tensor in initial.items())
        assert same == (step == 0)  # step0 is the initial weights, every later checkpoint has trained
    logged = {h["step"]: h["heldout_perplexity"] for h in history if h["heldout_perplexity"] is not None}
    assert logged[4] == pytest.approx(
        json.loads((tmp_path / "run" / "step4" / train.CHECKPOINT_INFO).read_text())["heldout_perplexity"]
    )
    assert [e["step"] for e in train.checkpoint_evaluations(tmp_path / "run")] == list(plan.steps)


def test_another_runs_checkpoints_are_never_overwritten(tmp_path):
    (tmp_path / "run" / "checkpoint-10").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint-10" / "config.json").write_text("{}")
    plan = train.CheckpointPlan(str(tmp_path / "run"), (0, 1))
    with pytest.raises(RaygeomError, match="already holds checkpoints of another run"):
        train_job._claim_run_dir(plan, "some-key")


def test_train_and_trajectory_sections_are_checked(tmp_path):
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        '[train]\nrun_dir = "r"\nsave_every = 100\nsteps = 400\n[corpus]\nname = "heldout"\n[trajectory]\nlate_from = 64\n'
    )
    job = load_job(job_file)
    run_dir = str(tmp_path / "r")  # relative paths resolve against the job file's folder
    assert job.corpus == f"{run_dir}/heldout.jsonl" and job.trajectory.late_from == 64
    assert [(e.source, e.run_dir) for e in job.models] == [(run_dir, True)]  # [train]'s run directory is swept
    assert job.train.plan().steps[-3:] == (256, 300, 400)
    for body, message in (
        ("[train]\nsave_every = 10\n", "needs run_dir"),
        ('[train]\nrun_dir = "r"\nsave_every = 10\nsteps = 0\n', "steps must be"),
        ('[train]\nrun_dir = "r"\nsave_every = 10\nbogus = 1\n', "unknown key"),
        ('[[models]]\nid = "smollm2"\n[corpus]\nname = "heldout"\n', "has no \\[train\\]"),
        ('[[models]]\nid = "smollm2"\n[trajectory]\nbootstrap = 5\n', "bootstrap"),
    ):
        job_file.write_text(body)
        with pytest.raises(RaygeomError, match=message):
            load_job(job_file)


def test_cli_train_refuses_a_shared_run_dir_before_starting_anything(tmp_path):
    from typer.testing import CliRunner

    from raygeom.cli.root import app

    result = CliRunner().invoke(
        app, ["train", "--lam", "0", "--lam", "1", "--save-every", "10", "--run-dir", str(tmp_path / "r"), "--out", str(tmp_path)]
    )
    assert result.exit_code == 2 and "--run-dir needs" in result.output


@pytest.fixture(scope="module")
def trajectory(ray_local, tmp_path_factory):
    from test_checkpoint_sweep import trajectory_run  # the module pytest collected, so its one run is shared

    run = trajectory_run(tmp_path_factory)
    return run["root"], run["job_file"], run["outputs"]


def test_trajectory_job_ranks_checkpoints_and_writes_its_report(trajectory):
    root, _, outputs = trajectory
    rows = pq.read_table(root / "out" / "results" / "trajectory_checkpoints.parquet").to_pylist()
    assert [(r["revision"], r["step"]) for r in rows] == [(f"checkpoint-{s}", s) for s in (10, 20, 30, 40)]
    assert sorted(r["select_rank"] for r in rows) == [1, 2, 3, 4] and {r["perplexity_source"] for r in rows} == {"chunks"}
    assert rows[2]["weights_flag"] == "same weights as checkpoint-40" and rows[2]["gap"] == pytest.approx(rows[3]["gap"])
    summary = pq.read_table(root / "out" / "results" / "trajectory_agreement.parquet").to_pylist()
    assert [s["n"] for s in summary] == [4, 3] and np.isfinite(summary[0]["spearman"])
    dispersion = pq.read_table(root / "out" / "results" / "trajectory_dispersion.parquet").to_pylist()
    assert {r["step"] for r in dispersion} == {10, 20, 30, 40} and all(r["chunk_len"] == 32 for r in dispersion)
    from tools import results_pages

    assert not (root / "docs" / "trajectory.md").exists()  # the job exports its rows; the repository's script writes it
    assert results_pages.main([str(root / "docs" / "trajectory.md")]) == 0
    report = (root / "docs" / "trajectory.md").read_text()
    for needle in (
        "## Subspace PGA over step x layer",
        "![z heatmap](trajectory/heatmap.png)",
        "Spearman(G, -perplexity)",
        "## What a model this small can and cannot show",
        "checkpoint-30",
    ):
        assert needle in report
    assert all(
        (root / "docs" / "trajectory" / f"{n}.png").is_file()
        for n in ("heatmap", "z_vs_step", "dispersion_vs_step", "gap_vs_perplexity")
    )


def test_trajectory_rerun_computes_nothing(trajectory):
    from raygeom.jobs.trajectory import run_trajectory_job

    root, job_file, first = trajectory
    again = run_trajectory_job(load_job(job_file), Console(quiet=True))
    assert again["swept"].computed_units == 0 and again["computed_dispersion_units"] == 0
    assert [r["gap"] for r in again["rows"]] == [r["gap"] for r in first["rows"]]


def test_cli_train_saves_checkpoints_through_ray_train_and_reuses_them(ray_local, tmp_path):
    from typer.testing import CliRunner

    from raygeom.cli.root import app
    from raygeom.sources.models import resolve_models
    from raygeom.testing import TINY_TEXT

    sentences = [s for s in TINY_TEXT.split(" . ") if s]
    corpus = tmp_path / "texts.txt"
    corpus.write_text("\n".join(f"{sentences[i % 5]} . {sentences[(i + 1) % 5]} . {sentences[(i + 3) % 5]}" for i in range(60)))
    args = [
        "train",
        "--corpus",
        str(corpus),
        "--steps",
        "5",
        "--batch-size",
        "4",
        "--seq-len",
        "16",
        "--hidden-size",
        "32",
        "--n-layers",
        "2",
        "--vocab-size",
        "300",
        "--eval-every",
        "5",
        "--save-every",
        "2",
        "--log-until",
        "2",
        "--out",
        str(tmp_path / "out"),
    ]
    first = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert first.exit_code == 0, first.output
    run_dir = tmp_path / "out" / "checkpoints" / "lam0-seed0"
    assert [s.step for s in resolve_models(str(run_dir))] == [0, 1, 2, 4, 5]
    assert (run_dir / "heldout.jsonl").is_file() and (run_dir / train_job.RUN_MARKER).is_file()
    again = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert again.exit_code == 0 and "cached" in again.output
