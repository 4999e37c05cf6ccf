"""Push-away training: the loop in process on a tiny GPT-NeoX, one run as a Ray task (one worker), and one through
Ray Train (two data-parallel workers)."""

import math
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from raygeom.analyses import train
from raygeom.errors import RaygeomError
from raygeom.jobs import train as train_job
from raygeom.store.tree import Store

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def data():
    from raygeom.testing import TINY_TEXT

    sentences = [s for s in TINY_TEXT.split(" . ") if s]
    rng = np.random.default_rng(0)
    texts = [" . ".join(sentences[j] for j in rng.permutation(len(sentences))) for _ in range(60)]
    tokenizer = train.train_tokenizer(texts[:50], 300)
    return train.TrainData(
        train.sequences(tokenizer, texts[:50], 32),
        train.sequences(tokenizer, texts[50:], 32)[:8],
        len(tokenizer),
        tokenizer.eos_token_id,
    )


SMALL = dict(steps=25, batch_size=8, seq_len=32, hidden_size=32, n_layers=2, n_heads=4, vocab_size=300, eval_every=25, warmup=5)


def test_push_away_raises_dispersion_against_lambda_zero(data):
    plain = train.fit(train.TrainSettings(**SMALL, lam=0.0, seed=1), data)
    pushed = train.fit(train.TrainSettings(**SMALL, lam=1.0, seed=1), data)
    assert plain[0]["dispersion"] == pytest.approx(pushed[0]["dispersion"])  # same init, same first batch
    assert pushed[-1]["heldout_dispersion"] > plain[-1]["heldout_dispersion"] + 0.2
    assert np.mean([h["dispersion"] for h in pushed[-5:]]) > np.mean([h["dispersion"] for h in plain[-5:]]) + 0.2
    assert plain[-1]["lm_loss"] < plain[0]["lm_loss"]  # it does learn
    again = train.fit(train.TrainSettings(**SMALL, lam=1.0, seed=1), data)
    assert [h["loss"] for h in again] == [h["loss"] for h in pushed]


def test_ray_train_run_logs_every_step_and_is_cached(ray_local, data, tmp_path, monkeypatch):
    monkeypatch.setattr(train, "prepare_data", lambda fields: data)
    settings = train.TrainSettings(**{**SMALL, "eval_every": 10}, lam=0.5, seed=2)
    store = Store(tmp_path)
    row = train_job.run_training(store, settings)
    history = pq.read_table(row["history"]).to_pylist()
    assert [h["step"] for h in history] == list(range(1, 26))
    assert all(math.isfinite(h["loss"]) and 0 <= h["dispersion"] <= 2 for h in history)
    assert [h["step"] for h in history if h["heldout_perplexity"] is not None] == [10, 20, 25]
    assert row["heldout_perplexity"] == pytest.approx(history[-1]["heldout_perplexity"])
    in_process = train.fit(settings, data)
    assert [h["loss"] for h in in_process] == pytest.approx([h["loss"] for h in history], rel=1e-6)
    assert train_job.run_training(store, settings)["cached"]
    summary = train.summarise([row, {**row, "lam": 0.0, "heldout_perplexity": row["heldout_perplexity"] + 1.0}])
    assert summary[1]["paired_delta_mean"] == pytest.approx(-1.0)
    from raygeom.report.dispersion_plots import plot_training

    paths = train.write_tables(store, [row], summary)
    assert paths["runs"].is_file() and paths["table"].is_file()
    assert plot_training([row], summary, tmp_path / "training.png").stat().st_size > 5_000


def test_a_failure_on_the_worker_is_one_line_naming_the_run(ray_local, data, tmp_path, monkeypatch):
    monkeypatch.setattr(train, "prepare_data", lambda fields: data)
    settings = train.TrainSettings(**{**SMALL, "steps": 2}, lam=0.25, seed=4, push_layer="block_07")
    with pytest.raises(RaygeomError) as failure:
        train_job.run_training(Store(tmp_path), settings)
    message = str(failure.value)
    assert message.startswith("training failed (lambda=0.25, seed=4): push layer 'block_07' not in this model: ")
    assert "\n" not in message and "Traceback" not in message


def test_settings_are_validated_and_the_cli_fails_cleanly(tmp_path):
    with pytest.raises(RaygeomError, match="multiple of workers"):
        train.TrainSettings(batch_size=10, workers=3)
    with pytest.raises(RaygeomError, match="lam must be a number >= 0"):
        train.TrainSettings(lam=-1.0)
    done = subprocess.run(
        [sys.executable, "-m", "raygeom.cli", "train", "--over", "median", "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120,
    )
    assert done.returncode == 2 and "over must be one of tokens, last, mean" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()


def test_the_trainer_has_no_placement_group_cleaner(ray_local):
    """Ray Train's cleaner frees a run's placement group when the State API does not find the controller, which a
    local raygeom Ray cannot answer and another Ray on the machine answers wrongly: it killed a live 2-worker run."""
    from ray.train import ScalingConfig

    from raygeom.engine.ray_train import trainer_class

    trainer = trainer_class()(lambda config: None, scaling_config=ScalingConfig(num_workers=2))
    kinds = {type(callback).__name__ for callback in trainer._create_default_callbacks()}
    assert "BackendSetupCallback" in kinds and "PlacementGroupCleanerCallback" not in kinds, kinds


def test_two_data_parallel_workers_on_fractional_cpus(ray_local, data, tmp_path, monkeypatch):
    monkeypatch.setattr(train, "prepare_data", lambda fields: data)
    settings = train.TrainSettings(**{**SMALL, "steps": 4, "eval_every": 4}, lam=0.5, seed=3, workers=2, cpus_per_worker=0.5)
    row = train_job.run_training(Store(tmp_path), settings)
    history = pq.read_table(row["history"]).to_pylist()
    assert [h["step"] for h in history] == [1, 2, 3, 4] and row["workers"] == 2
    assert math.isfinite(row["heldout_perplexity"]) and 0 < row["heldout_dispersion"] <= 2
