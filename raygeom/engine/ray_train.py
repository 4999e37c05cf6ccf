"""Ray Train glue of push-away training: the TorchTrainer and the loop each of its workers runs.

The training itself (model, data, loss, evaluation, checkpoints) is ``raygeom.analyses.train.fit``;
only the Ray part lives here, so the analysis stays free of Ray.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pyarrow as pa

from raygeom.errors import RaygeomError
from raygeom.store.tree import atomic_write_table


def worker_loop(config: dict) -> None:
    """Runs on every Ray Train worker; rank 0 writes the per-step log."""
    import ray.train
    import ray.train.torch

    from raygeom.analyses.train import CheckpointPlan, TrainSettings, fit

    context = ray.train.get_context()
    rank = context.get_world_rank()
    plan = config.get("checkpoints")
    history = fit(TrainSettings(**config["settings"]), config["data"], rank, context.get_world_size(),
                  prepare=ray.train.torch.prepare_model, report=ray.train.report,
                  checkpoints=CheckpointPlan(plan["run_dir"], tuple(plan["steps"])) if plan else None)
    if rank == 0:
        atomic_write_table(pa.Table.from_pylist(history), Path(config["history_path"]))


def fit_on_workers(settings, data, history_path: Path, checkpoints, storage: Path, name: str) -> None:
    """One TorchTrainer run of ``settings`` on ``settings.workers`` workers; a failure is one RaygeomError line."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    resources = {"CPU": settings.cpus_per_worker} | ({"GPU": 1} if settings.use_gpu else {})
    trainer = TorchTrainer(
        worker_loop,
        train_loop_config={"settings": asdict(settings), "data": data, "history_path": str(Path(history_path).resolve()),
                           "checkpoints": asdict(checkpoints) if checkpoints else None},
        scaling_config=ScalingConfig(num_workers=settings.workers, use_gpu=settings.use_gpu, resources_per_worker=resources),
        run_config=RunConfig(name=name, storage_path=str(Path(storage).resolve())),
    )
    try:
        trainer.fit()
    except Exception as error:  # Ray Train wraps worker failures in its own types
        cause = error
        while getattr(cause, "__cause__", None) is not None:
            cause = cause.__cause__
        message = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
        raise RaygeomError(f"training failed (lambda={settings.lam}, seed={settings.seed}): {message}") from None
