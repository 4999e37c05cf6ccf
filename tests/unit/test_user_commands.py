"""The commands the README gives a new user (issue 48 §2): `raygeom tiny-pythia DIR` writes tiny Pythia stand-ins
into an HF cache folder from an empty directory, which the hub's own cache lookup finds under the real repo id and
stepN revision; `raygeom gc --dequantised` frees the dequantised model copies in $RAYGEOM_CACHE."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from raygeom.cli.root import app


def test_tiny_pythia_writes_an_hf_cache_from_an_empty_directory(tmp_path, monkeypatch):
    from huggingface_hub import try_to_load_from_cache

    monkeypatch.chdir(tmp_path)
    shown = CliRunner().invoke(app, ["tiny-pythia", "hub", "--revisions", "step0,step1000"])
    assert shown.exit_code == 0, shown.output
    assert f"HF_HUB_CACHE={tmp_path / 'hub'} HF_HUB_OFFLINE=1 raygeom run jobs/tiny-pythia.toml" in shown.output
    found = {}
    for revision in ("step0", "step1000"):
        config = try_to_load_from_cache("EleutherAI/pythia-14m", "config.json", cache_dir=tmp_path / "hub", revision=revision)
        assert isinstance(config, str), revision
        found[revision] = json.loads(open(config).read())
    assert {c["model_type"] for c in found.values()} == {"gpt_neox"}
    assert try_to_load_from_cache("EleutherAI/pythia-14m", "config.json", cache_dir=tmp_path / "hub", revision="step8") is None


def test_tiny_pythia_refuses_what_it_cannot_write_in_one_line(tmp_path):
    for args, said in (
        (["--revisions", "step3"], "not one: step3"),
        (["--model", "gpt2"], "a Pythia repo id such as EleutherAI/pythia-14m, got 'gpt2'"),
    ):
        shown = CliRunner().invoke(app, ["tiny-pythia", str(tmp_path / "hub"), *args])
        assert shown.exit_code == 2 and said in shown.output and len(shown.output.strip().splitlines()) == 1
    assert not (tmp_path / "hub").exists()


def test_gc_frees_the_dequantised_copies(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    copies = [cache / "dequantised" / "SmolLM2-135M-Instruct.Q4_1-abc", cache / "dequantised" / ".staging-x"]
    for folder in copies:
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"0" * 1000)
    monkeypatch.setenv("RAYGEOM_CACHE", str(cache))
    shown = CliRunner().invoke(app, ["gc", "--dequantised", "--dry-run"], env={"COLUMNS": "3000"})
    assert shown.exit_code == 0 and "would free 2,000 bytes of 2 dequantised copies" in shown.output, shown.output
    assert all(folder.exists() for folder in copies)
    shown = CliRunner().invoke(app, ["gc", "--dequantised"], env={"COLUMNS": "3000"})
    assert shown.exit_code == 0 and f"freed 2,000 bytes of 2 dequantised copies in {cache / 'dequantised'}" in shown.output
    assert not any(folder.exists() for folder in copies)


def test_gc_needs_a_store_or_dequantised():
    shown = CliRunner().invoke(app, ["gc"])
    assert shown.exit_code == 2 and "give a STORE, --dequantised, or both" in shown.output


def test_the_tiny_pythia_job_fits_the_models_tiny_pythia_writes():
    from pathlib import Path

    from raygeom.jobspec import load_job

    job = load_job(Path(__file__).resolve().parents[2] / "jobs" / "tiny-pythia.toml")
    assert [(m.source, m.revisions) for m in job.models] == [("EleutherAI/pythia-14m", ("step0", "step1000", "step143000"))]
    info = {"n_samples": job.n_samples, "d": 64, "config": {"hidden_size": 64}, "layers": job.layers}
    for item in job.planned():  # d = 64: k = 100 (a default) would be refused at the run's start
        item.spec.check(item.spec.for_width(item.params, 64), info, "EleutherAI/pythia-14m")
