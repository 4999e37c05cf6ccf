"""A training run's directory as a sweep source: discovery, step parsing, selection, and steps that are
never made up (pure file-system checks, no models loaded)."""

import json

import pytest

from raygeom.errors import RaygeomError
from raygeom.sources import checkpoints
from raygeom.sources.models import ModelSpec, resolve_model, resolve_models


def _checkpoint(directory):
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    return directory


def test_step_names_of_trainer_and_pythia_layouts():
    assert checkpoints.step_of_name("checkpoint-500") == 500
    assert checkpoints.step_of_name("step0") == 0 and checkpoints.step_of_name("step-64") == 64
    assert checkpoints.step_of_name("step_128") == 128
    for name in ("main", "checkpoint", "checkpoint-500a", "runs", "step", "global_step10"):
        assert checkpoints.step_of_name(name) is None


def test_discover_orders_by_step_and_skips_interrupted_saves(tmp_path):
    run = tmp_path / "my-run"
    for name in ("checkpoint-1000", "checkpoint-20", "checkpoint-3"):
        _checkpoint(run / name)
    (run / "checkpoint-4000").mkdir()  # a save that never finished
    (run / "runs").mkdir()  # TensorBoard logs, not a checkpoint
    found = checkpoints.discover(run)
    assert [(c.label, c.step) for c in found.checkpoints] == [
        ("checkpoint-3", 3),
        ("checkpoint-20", 20),
        ("checkpoint-1000", 1000),
    ]
    assert [name for name, _ in found.skipped] == ["checkpoint-4000"]
    assert found.name == "my-run" and checkpoints.is_run_directory(run)
    assert not checkpoints.is_run_directory(run / "checkpoint-3")  # a checkpoint is a model, not a run


def test_generic_run_directory_takes_its_parents_name(tmp_path):
    _checkpoint(tmp_path / "traj" / "checkpoints" / "step0")
    specs = resolve_models(str(tmp_path / "traj" / "checkpoints"))
    assert [s.name for s in specs] == ["traj"] and specs[0].kind == "checkpoint" and specs[0].step == 0


def test_selection_by_label_or_step_and_a_clear_error_for_a_missing_one(tmp_path):
    for name in ("step0", "step1", "step2", "step100"):
        _checkpoint(tmp_path / "run" / name)
    run = checkpoints.discover(tmp_path / "run")
    assert [c.label for c in run.select("all")] == ["step0", "step1", "step2", "step100"]
    assert [c.label for c in run.select(["step100", "1", "step1"])] == ["step1", "step100"]
    with pytest.raises(RaygeomError, match="no checkpoint 'step7'"):
        run.select(["step7"])


def test_two_directories_claiming_one_step_are_refused(tmp_path):
    _checkpoint(tmp_path / "run" / "step5")
    _checkpoint(tmp_path / "run" / "checkpoint-5")
    with pytest.raises(RaygeomError, match="both claim step 5"):
        checkpoints.discover(tmp_path / "run")


def test_loose_step_named_weight_files_are_explained_not_guessed(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "model_step1000.safetensors").write_bytes(b"x")
    with pytest.raises(RaygeomError, match="weight files with a step in the name"):
        checkpoints.discover(tmp_path / "run")
    with pytest.raises(RaygeomError, match="no checkpoints"):
        checkpoints.discover(tmp_path)


def test_steps_are_never_made_up():
    assert resolve_model("EleutherAI/pythia-70m", "main").step == 143_000  # Pythia's main is its last step
    assert resolve_model("EleutherAI/pythia-70m", "step512").step == 512
    assert resolve_model("someone/their-model", "main").step is None
    assert resolve_model("someone/their-model", "v2").step is None
    assert ModelSpec("smollm2-135m", "builtin").step is None
    assert ModelSpec("/tmp/run", "checkpoint", "checkpoint-250").step == 250


def test_a_run_directory_as_one_model_is_its_last_checkpoint(tmp_path):
    for name in ("checkpoint-10", "checkpoint-200"):
        _checkpoint(tmp_path / "run" / name)
    spec = resolve_model(str(tmp_path / "run"))
    assert (spec.kind, spec.revision, spec.step) == ("checkpoint", "checkpoint-200", 200)
    assert spec.path == (tmp_path / "run" / "checkpoint-200").resolve()


def test_a_job_names_a_run_directory_by_id_or_run_dir(tmp_path):
    from raygeom.jobspec import load_job

    for name in ("checkpoint-1", "checkpoint-2"):
        _checkpoint(tmp_path / "run" / name)
    job_file = tmp_path / "job.toml"
    job_file.write_text(f"""
[sweep]
[[models]]
id = "{tmp_path / "run"}"
[[models]]
run_dir = "{tmp_path / "later"}"
revisions = "step100"
""")
    job = load_job(job_file)
    assert [(e.run_dir, e.revisions) for e in job.models] == [(True, ("all",)), (True, ("step100",))]
    assert [s.revision for s in job.models[0].specs()] == ["checkpoint-1", "checkpoint-2"]
    with pytest.raises(RaygeomError, match="run directory not found"):
        job.models[1].specs()  # resolved when the job runs, e.g. after its [train] section wrote it
