"""Push-away training as a job: one Ray run per settings (``raygeom.engine.ray_train.fit_on_workers``
running ``raygeom.analyses.train.fit`` on every worker), cached by its key, its summary row stored, and for a
trajectory the run directory claimed, filled with checkpoints and marked complete."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from raygeom.analyses import train as training
from raygeom.analyses.train import CHECKPOINT_INFO, CheckpointPlan, TrainSettings
from raygeom.errors import RaygeomError
from raygeom.report.figures import save_text
from raygeom.store.tree import Store, read_table

RUN_MARKER = "raygeom_run.json"


def completed_trajectory(plan: CheckpointPlan, key: str) -> dict | None:
    """The run's summary row when its directory holds every checkpoint of this plan, written by a run with
    this key (the checkpoints are the artefact: a store that lost its row does not retrain them)."""
    root = Path(plan.run_dir)
    try:
        marker = json.loads((root / RUN_MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    complete = marker.get("key") == key and all((root / f"step{s}" / "config.json").is_file() for s in plan.steps)
    return marker.get("row") if complete and isinstance(marker.get("row"), dict) else None


def _claim_run_dir(plan: CheckpointPlan, key: str) -> None:
    """Refuse to overwrite checkpoints another run (other settings, or not raygeom's) left there."""
    root = Path(plan.run_dir)
    for child in sorted(root.glob("*/config.json")):
        try:
            owner = json.loads((child.parent / CHECKPOINT_INFO).read_text()).get("key")
        except (OSError, json.JSONDecodeError):
            owner = None
        if owner != key:
            raise RaygeomError(
                f"{root} already holds checkpoints of another run ({child.parent.name}); "
                "remove them or give this run another run directory"
            )
    (root / RUN_MARKER).unlink(missing_ok=True)


def model_name(settings: TrainSettings) -> str:
    return f"gpt-neox-scratch-d{settings.hidden_size}-l{settings.n_layers}"


def provenance_columns(settings: TrainSettings, corpus_fingerprint: str | None) -> dict:
    """What produced a run's row: the model trained, its last step, the text, the sequence length, every setting."""
    from raygeom import __version__

    fields = {n: v for n, v in asdict(settings).items() if n not in ("use_gpu", "cpus_per_worker")}
    return {
        "model": model_name(settings),
        "revision": f"step{settings.steps}",
        "step": settings.steps,
        "corpus": settings.corpus,
        "corpus_fingerprint": corpus_fingerprint,
        "chunk_len": settings.seq_len,
        "settings": json.dumps(fields, sort_keys=True),
        "raygeom_version": __version__,
    }


def run_training(store: Store, settings: TrainSettings, checkpoints: CheckpointPlan | None = None, data=None) -> dict:
    """One Ray run (cached by its settings' key, and its checkpoint plan's); returns its summary row.
    ``data``: ``training.prepare_data(settings.data_fields())`` made already (a grid's runs share it)."""
    key = settings.key() if checkpoints is None else checkpoints.key(settings)
    if checkpoints is not None:
        done = completed_trajectory(checkpoints, key)
        if done is not None:
            if not store.has_result("train_runs", key):
                store.write_result("train_runs", key, done)
            return {**done, "cached": True}
    elif store.has_result("train_runs", key):
        return {**store.read_results("train_runs", [key]).to_pylist()[0], "cached": True}
    if checkpoints is not None:
        Path(checkpoints.run_dir).mkdir(parents=True, exist_ok=True)
        _claim_run_dir(checkpoints, key)
    if data is None:
        data = training.prepare_data(settings.data_fields())  # through the module: tests plant their data there
    from raygeom.engine.ray_train import fit_on_workers

    history_path = store.root / "train" / f"history-{key}.parquet"
    started = time.perf_counter()
    fit_on_workers(training.fit, settings, data, history_path, checkpoints, store.root / "ray_train", f"push-away-{key}")
    wall = time.perf_counter() - started
    history = read_table(history_path).to_pylist()
    last = history[-1]
    row = {
        "key": key,
        "lam": settings.lam,
        "seed": settings.seed,
        "steps": settings.steps,
        "workers": settings.workers,
        "push_layer": settings.push_layer,
        "over": settings.over,
        "final_train_loss": last["lm_loss"],
        "heldout_perplexity": last["heldout_perplexity"],
        "heldout_dispersion": last["heldout_dispersion"],
        "n_train_sequences": int(len(data.train)),
        "n_heldout_sequences": int(len(data.heldout)),
        "wall_s": wall,
        "history": str(history_path),
        "unit_key": key,
        **provenance_columns(settings, data.corpus_fingerprint),
    }
    if checkpoints is not None:
        root = Path(checkpoints.run_dir)
        save_text(
            "".join(
                json.dumps({"text": t, **({"label": data.heldout_labels[i]} if data.heldout_labels else {})}) + "\n"
                for i, t in enumerate(data.heldout_texts)
            ),
            root / "heldout.jsonl",
        )
        if data.tokenizer is not None:
            data.tokenizer.save_pretrained(root)
        row.update(run_dir=str(root), n_checkpoints=len(checkpoints.steps))
    store.write_result("train_runs", key, row)
    if checkpoints is not None:  # last: it is what marks the trajectory complete
        save_text(
            json.dumps({"key": key, "steps": list(checkpoints.steps), "settings": asdict(settings), "row": row}, indent=2),
            Path(checkpoints.run_dir) / RUN_MARKER,
        )
    return row
