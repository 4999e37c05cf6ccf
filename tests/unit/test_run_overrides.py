"""`raygeom run JOB --flag` overrides the job's setting for every flag `raygeom pga` takes."""

import re

import pytest
from typer.testing import CliRunner

from raygeom.cli import root


@pytest.fixture
def captured(monkeypatch):
    jobs = []
    monkeypatch.setattr(root, "_run", lambda job, address, num_cpus: jobs.append((job, address, num_cpus)))
    return jobs


def pga_flags() -> set[str]:
    import click

    command = typer_command("pga")
    return {opt for p in command.params if isinstance(p, click.Option) for opt in p.opts if opt.startswith("--")}


def typer_command(name):
    import typer.main

    return typer.main.get_command(root.app).commands[name]


def test_run_takes_every_flag_that_pga_takes():
    run_flags = {opt for p in typer_command("run").params for opt in getattr(p, "opts", []) if opt.startswith("--")}
    assert pga_flags() <= run_flags


def test_each_override_lands_in_the_job(captured, tmp_path, monkeypatch):
    from pathlib import Path

    laptop = Path(__file__).resolve().parents[2] / "jobs" / "laptop.toml"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "other.txt").write_text("a text\n")  # a --corpus file must exist (issue 48: else refused as missing)
    args = [
        "run",
        str(laptop),
        "--out",
        "runs/x",
        "--model",
        "EleutherAI/pythia-14m",
        "--revision",
        "step1000",
        "--corpus",
        "other.txt",
        "--n-samples",
        "50",
        "--seq-len",
        "64",
        "--pool",
        "mean",
        "--keep-first",
        "--batch-size",
        "4",
        "--layers",
        "embed,3",
        "--k",
        "20",
        "--ccr",
        "2",
        "--n-null",
        "auto",
        "--z-half-width",
        "0.5",
        "--n-null-cap",
        "300",
        "--null-chunks",
        "3",
        "--seed",
        "7",
        "--num-cpus",
        "2",
    ]
    result = CliRunner().invoke(root.app, args)
    assert result.exit_code == 0, result.output
    job, address, num_cpus = captured[0]
    assert job.out == "runs/x" and job.corpus == "other.txt" and job.n_samples == 50 and job.sample_seed == 7
    assert [(m.source, m.revisions) for m in job.models] == [("EleutherAI/pythia-14m", ("step1000",))]
    assert (job.extraction.seq_len, job.extraction.pool, job.extraction.skip_first, job.extraction.batch_size) == (
        64,
        "mean",
        False,
        4,
    )
    assert job.layers == "embed,3" and num_cpus == 2
    pga = job.pga
    assert (pga.k, pga.r, pga.n_null_auto, pga.z_half_width, pga.n_null_cap, pga.null_chunks, pga.seed) == (
        20,
        2,
        True,
        0.5,
        300,
        3,
        7,
    )


def test_no_flag_keeps_the_job_file_and_bad_overrides_are_one_line(captured):
    assert CliRunner().invoke(root.app, ["run", "jobs/laptop.toml"]).exit_code == 0
    job = captured[0][0]
    assert job.n_samples == 600 and job.pga.n_null == 100 and not job.pga.n_null_auto
    for bad, message in ((["--layers", "10:5"], "layer"), (["--n-null", "lots"], "n-null"), (["--revision", "step1"], "--model")):
        result = CliRunner().invoke(root.app, ["run", "jobs/laptop.toml", *bad])
        assert result.exit_code == 2 and re.search(message, result.output), result.output
