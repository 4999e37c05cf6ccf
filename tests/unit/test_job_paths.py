"""A job file's relative paths name places beside the job file, whatever the shell's directory (issue 17 §3)."""

import os
from pathlib import Path

from raygeom.jobspec import load_job


def write_job(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True)
    path = folder / "job.toml"
    path.write_text(body)
    return path


def test_relative_paths_are_resolved_against_the_job_files_folder(tmp_path, monkeypatch):
    checkout = tmp_path / "checkout"
    (checkout / "texts.jsonl").parent.mkdir(parents=True)
    (checkout / "texts.jsonl").write_text('{"text": "a"}\n')
    (checkout / "models" / "mine").mkdir(parents=True)
    job = write_job(
        checkout / "jobs",
        '[job]\nout = "../runs/x"\n[corpus]\nname = "../texts.jsonl"\n'
        '[[models]]\nid = "../models/mine"\n[[models]]\nid = "EleutherAI/pythia-14m"\n'
        '[[models]]\nid = "smollm2"\n[[models]]\nid = "../weights.gguf"\n'
        '[trajectory]\nreport = "../docs/t.md"\n'
        '[train]\nrun_dir = "../runs/x/checkpoints"\nsave_every = 100\n',
    )
    shell = tmp_path / "elsewhere"
    shell.mkdir()
    monkeypatch.chdir(shell)
    spec = load_job(job)
    assert Path(spec.out) == checkout / "runs" / "x"
    assert Path(spec.corpus) == checkout / "texts.jsonl"
    assert Path(spec.trains[0].run_dir) == checkout / "runs" / "x" / "checkpoints"
    assert Path(spec.trajectory.report) == checkout / "docs" / "t.md"
    sources = [m.source for m in spec.models]
    assert Path(sources[0]) == checkout / "models" / "mine"
    assert sources[1:3] == ["EleutherAI/pythia-14m", "smollm2"]  # a hub id and a built-in name are not paths
    assert Path(sources[3]) == checkout / "weights.gguf"
    assert Path(sources[4]) == checkout / "runs" / "x" / "checkpoints"  # what [train] writes is swept


def test_a_job_run_from_its_own_folder_and_from_the_checkout_names_the_same_store(tmp_path, monkeypatch):
    job = write_job(tmp_path / "jobs", '[job]\nout = "../runs/x"\n[[models]]\nid = "smollm2"\n')
    stores = []
    for shell, given in ((tmp_path, "jobs/job.toml"), (tmp_path / "jobs", "job.toml"), (Path("/"), str(job))):
        monkeypatch.chdir(shell)
        stores.append(Path(load_job(given).out).resolve())
    assert stores == [tmp_path.resolve() / "runs" / "x"] * 3
    monkeypatch.chdir(tmp_path)
    assert load_job("jobs/job.toml").out == os.path.join("runs", "x")  # printed as the user would type it


def test_absolute_and_default_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    absolute = write_job(tmp_path / "a", f'[job]\nout = "{tmp_path / "store"}"\n[[models]]\nid = "smollm2"\n')
    assert load_job(absolute).out == str(tmp_path / "store")
    write_job(tmp_path / "b", '[[models]]\nid = "smollm2"\n')
    assert load_job("b/job.toml").out == os.path.join("b", "runs", "job")
