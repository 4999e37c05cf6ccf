"""Refusals that point the way (issue 48 §4): a misspelt model gets the nearest built-in name (short or full) or hub
id of the local HF cache, in one line; a corpus file that is not there is named as missing, with the folder a
relative name was read from (the job file's folder in a job file, the current folder for --corpus)."""

from __future__ import annotations

from typer.testing import CliRunner

from raygeom.cli.root import app


def refused(*args, env=None) -> str:
    shown = CliRunner().invoke(app, [str(a) for a in args], env=env)
    assert shown.exit_code == 2, shown.output
    lines = shown.output.strip().splitlines()
    assert len(lines) == 1, shown.output
    return lines[0]


def test_a_misspelt_built_in_gets_did_you_mean(tmp_path):
    hub = tmp_path / "hub"
    hub.mkdir()
    env = {"HF_HUB_CACHE": str(hub)}
    line = refused("pga", "--model", "smolm2", env=env)
    assert "unknown model 'smolm2' (did you mean 'smollm2'?)" in line
    assert "gemma3-270m, smollm2" in line and "(gemma3-270m is" not in line
    assert "did you mean 'gemma3-270m'?" in refused("pga", "--model", "gemma-270", env=env)
    assert "did you mean 'smollm2-135m-instruct-q4_1'?" in refused("pga", "--model", "smollm2-135m-instruct-q4", env=env)


def test_a_misspelt_hub_id_of_the_local_cache_gets_did_you_mean(tmp_path):
    hub = tmp_path / "hub"
    (hub / "models--EleutherAI--pythia-14m").mkdir(parents=True)
    line = refused("pga", "--model", "pythia-14", env={"HF_HUB_CACHE": str(hub)})
    assert "did you mean 'EleutherAI/pythia-14m'?" in line


def test_a_missing_corpus_file_in_a_job_names_the_job_files_folder(tmp_path, monkeypatch):
    folder = tmp_path / "jobs"
    folder.mkdir()
    job = folder / "job.toml"
    job.write_text("[[models]]\nid = 'smollm2'\n[corpus]\nname = 'texts/my_corpus.txt'\n")
    monkeypatch.chdir(tmp_path)
    line = refused("plan", "jobs/job.toml")
    assert "corpus file not found: 'texts/my_corpus.txt'" in line
    assert f"resolved from the job file's folder {folder} to {folder / 'texts' / 'my_corpus.txt'}" in line
    assert "unknown corpus" not in line
    (folder / "texts").mkdir()
    (folder / "texts" / "my_corpus.txt").write_text("one text\n")
    from raygeom.jobspec import load_job

    assert load_job(job).corpus == str(folder / "texts" / "my_corpus.txt")  # the file there: the job loads


def test_a_missing_corpus_file_flag_names_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = refused("pga", "--model", "smollm2", "--corpus", "texts/my_corpus.txt")
    assert f"corpus file not found: 'texts/my_corpus.txt' resolved from the current folder {tmp_path}" in line
    assert "did you mean" not in line
