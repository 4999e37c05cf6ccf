"""`--job FILE` on every analysis command (issue 17 §1): the job's models and revisions, corpus, sample, extraction,
layers and store are taken; a flag given on the command line overrides the job's value; a bad job file is one line
and exit 2. Each command is stopped where its work would start (the function that would extract, train or start Ray
records what it was given), so nothing here loads a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raygeom.cli import root
from raygeom.errors import RaygeomError

STOP = "stopped where the work starts"


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "labelled.jsonl"
    topics = ["markets", "politics", "sport"]
    path.write_text(
        "\n".join(json.dumps({"text": f"text number {i} about {topics[i % 3]}", "label": topics[i % 3]}) for i in range(60))
    )
    return path


def write_job(tmp_path: Path, corpus: Path, models: str | None = None, extra: str = "") -> Path:
    job = tmp_path / "job.toml"
    models = models or "[[models]]\nid = 'EleutherAI/pythia-14m'\nrevisions = ['step0', 'step1000']\n"
    job.write_text(
        f"[job]\nname = 'from-the-job'\nout = '{tmp_path / 'job-store'}'\n{models}"
        f"[corpus]\nname = '{corpus}'\nn_samples = 33\nseed = 4\n"
        f"[extract]\nseq_len = 24\npool = 'mean'\nskip_first = false\nbatch_size = 3\nlayers = 'embed,1'\n"
        f"{extra}"
    )
    return job


def stop_at(monkeypatch, target, name: str) -> list:
    """``target.name`` records its arguments and refuses: the command ends there with exit 2, having done nothing."""
    calls = []

    def stopped(*args, **kwargs):
        calls.append((args, kwargs))
        raise RaygeomError(STOP)

    monkeypatch.setattr(target, name, stopped)
    return calls


def invoke(*args) -> object:
    return CliRunner().invoke(root.app, [str(a) for a in args])


def stopped(result) -> None:
    assert result.exit_code == 2 and STOP in result.output, result.output


def models_of(specs) -> list[tuple[str, str]]:
    return [(s.name, s.revision) for s in specs]


# ------------------------------------------------------------------ the commands that run a job (pga, registry ones)


@pytest.fixture
def ran(monkeypatch) -> list:
    jobs = []
    monkeypatch.setattr(root, "_run", lambda job, address, num_cpus: jobs.append(job))
    return jobs


ANALYSIS_OF = {
    "converge": ["convergence"],
    "knn": ["knn_lm"],
    "select": ["gap"],
    "dispersion": ["token_dispersion", "slices"],
    "diagnose": ["diagnostics"],
}  # a generated command named otherwise than its analysis (or of several)


@pytest.mark.parametrize(
    "command",
    [["pga"], ["probe"], ["diagnose"], ["spectral"], ["analyze", "twonn"], ["converge"], ["knn"], ["select"], ["dispersion"]],
)
def test_a_job_command_takes_the_job_and_the_flags_given_over_it(command, ran, tmp_path, corpus):
    job = write_job(tmp_path, corpus, extra="[pga]\nk = 7\nn_null = 20\n")
    assert invoke(*command, "--job", job).exit_code == 0
    taken = ran[-1]
    assert taken.name == "from-the-job" and taken.out == str(tmp_path / "job-store")
    assert [(m.source, m.revisions) for m in taken.models] == [("EleutherAI/pythia-14m", ("step0", "step1000"))]
    assert (taken.corpus, taken.n_samples, taken.sample_seed, taken.layers) == (str(corpus), 33, 4, "embed,1")
    assert (taken.extraction.seq_len, taken.extraction.pool, taken.extraction.skip_first, taken.extraction.batch_size) == (
        24,
        "mean",
        False,
        3,
    )
    assert [p.analysis for p in taken.planned()] == ANALYSIS_OF.get(command[-1], [command[-1]])
    if command == ["pga"]:  # the job's [pga] section, too
        assert (taken.pga.k, taken.pga.n_null) == (7, 20)
    # A flag given on the command line overrides the job's value; the others stay the job's.
    assert (
        invoke(
            *command,
            "--job",
            job,
            "--out",
            tmp_path / "mine",
            "-m",
            "EleutherAI/pythia-70m@step1",
            "-n",
            "40",
            "--seq-len",
            "16",
            "--keep-first",
            "--layers",
            "all",
        ).exit_code
        == 0
    )
    over = ran[-1]
    assert over.out == str(tmp_path / "mine") and [(m.source, m.revisions) for m in over.models] == [
        ("EleutherAI/pythia-70m", ("step1",))
    ]
    assert (over.n_samples, over.extraction.seq_len, over.extraction.skip_first, over.layers) == (40, 16, False, "all")
    assert (over.corpus, over.sample_seed, over.extraction.pool, over.extraction.batch_size) == (str(corpus), 4, "mean", 3)
    if command == ["pga"]:
        assert invoke("pga", "--job", job, "--k", "5", "--seed", "9").exit_code == 0
        assert (ran[-1].pga.k, ran[-1].pga.n_null, ran[-1].pga.seed, ran[-1].sample_seed) == (5, 20, 9, 9)
        # --n-null auto over the job's count, as [analyses.pga] n_null = 'auto' and [pga] n_null = 'auto' plan it
        assert invoke("pga", "--job", job, "--n-null", "auto").exit_code == 0
        assert [(p.params.n_null, p.params.n_null_auto) for p in ran[-1].planned()] == [(100, True)]


def test_pga_takes_every_model_given_and_one_null_chunks_default(ran, tmp_path):
    assert (
        invoke(
            "pga", "--model", "EleutherAI/pythia-14m", "--model", "EleutherAI/pythia-70m", "-r", "step0", "-r", "step1"
        ).exit_code
        == 0
    )
    job = ran[-1]
    assert [(m.source, m.revisions) for m in job.models] == [
        ("EleutherAI/pythia-14m", ("step0", "step1")),
        ("EleutherAI/pythia-70m", ("step0", "step1")),
    ]
    assert job.out == "runs/default" and job.pga.null_chunks == 10


def test_run_takes_every_model_given(ran):
    assert invoke("run", "jobs/laptop.toml", "-m", "EleutherAI/pythia-14m", "-m", "EleutherAI/pythia-70m@step1").exit_code == 0
    assert [(m.source, m.revisions) for m in ran[-1].models] == [
        ("EleutherAI/pythia-14m", ("main",)),
        ("EleutherAI/pythia-70m", ("step1",)),
    ]


# ------------------------------------------------------------------ diagnose, converge, probe


def test_diagnose_without_a_job_keeps_its_flags_and_defaults(ran, tmp_path, corpus):
    args = ["-m", "EleutherAI/pythia-14m", "-r", "step1000", "-c", corpus, "-n", "40", "--seed", "2", "--out", tmp_path / "o"]
    assert invoke("diagnose", *args, "--ccr-ranks", "5,0", "--n-null", "auto").exit_code == 0
    job = ran[-1]
    assert [(m.source, m.revisions) for m in job.models] == [("EleutherAI/pythia-14m", ("step1000",))]
    assert (job.corpus, job.n_samples, job.sample_seed, job.layers, job.out, job.extraction.seq_len) == (
        str(corpus),
        40,
        2,
        "all",
        str(tmp_path / "o"),
        128,
    )
    (planned,) = job.planned()
    # PGA's declarations (one default each: null_chunks 10 as pga's), its own ranks, n_null 'auto' as pga takes it
    assert (planned.analysis, planned.params.null_chunks, planned.params.ranks) == ("diagnostics", 10, (0, 5))
    assert (planned.params.n_null_auto, planned.params.probe) == (True, True)
    refused = invoke("diagnose", *args, "--ccr-ranks", "1,x")
    assert refused.exit_code == 2 and "--ccr-ranks must be comma-separated integers" in refused.output, refused.output


# ------------------------------------------------------------------ dispersion, select, knn, train


@pytest.fixture
def no_ray(monkeypatch):
    from raygeom.cli import train

    monkeypatch.setattr(train, "_prepare", lambda address: None)
    monkeypatch.setattr(train, "_start", lambda address, num_cpus: None)


def test_train_takes_the_job_train_section_and_the_flags_given_over_it(no_ray, monkeypatch, tmp_path, corpus):
    from raygeom.jobs import train as train_job

    calls = stop_at(monkeypatch, train_job, "run_training")
    job = tmp_path / "job.toml"
    job.write_text(
        f"[job]\nout = '{tmp_path / 'job-store'}'\n[corpus]\nname = 'heldout'\n"
        f"[train]\ncorpus = '{corpus}'\nrun_dir = '{tmp_path / 'run'}'\nsave_every = 50\nsteps = 100\n"
        "hidden_size = 32\nn_heads = 2\nn_layers = 2\nvocab_size = 300\nseq_len = 16\n"
    )
    stopped(invoke("train", "--job", job))
    (store, settings, plan), _ = calls[-1]
    assert store.root == tmp_path / "job-store" and plan.run_dir == str((tmp_path / "run").resolve())
    assert (settings.corpus, settings.steps, settings.hidden_size, settings.n_layers, settings.lr) == (
        str(corpus),
        100,
        32,
        2,
        2e-3,
    )
    stopped(invoke("train", "--job", job, "--steps", "60", "--lr", "0.01", "--out", tmp_path / "mine"))
    (store, settings, plan), _ = calls[-1]
    assert store.root == tmp_path / "mine" and (settings.steps, settings.lr, settings.hidden_size) == (60, 0.01, 32)
    assert plan.steps[-1] == 60
    result = invoke("train", "--job", job, "--lam", "0.1")
    assert result.exit_code == 2 and "--lam with --job" in result.output, result.output


# ------------------------------------------------------------------ a bad job file: one line, exit 2

BAD_JOBS = {
    "missing": None,
    "malformed": "[job\n",
    "bad value": "[[models]]\nid = 'smollm2'\n[corpus]\nn_samples = 1.5\n",
    "no models": "[job]\nname = 'x'\n",
}


@pytest.mark.parametrize("kind", list(BAD_JOBS))
@pytest.mark.parametrize("command", ["pga", "diagnose", "converge", "probe", "dispersion", "select", "knn", "train", "spectral"])
def test_a_bad_job_file_is_one_line_and_exit_2(command, kind, tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.chdir(tmp_path)
    job = tmp_path / "job.toml"
    if BAD_JOBS[kind] is not None:
        job.write_text(BAD_JOBS[kind])
    monkeypatch.setattr(sys, "argv", ["raygeom", command, "--job", str(job)])
    with pytest.raises(SystemExit) as done:
        root.main()
    assert done.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "error:" in lines[0], lines
    assert {p.name for p in tmp_path.iterdir()} <= {"job.toml"}
