"""Ray Train glue of push-away training: the TorchTrainer and the loop each of its workers runs.

The training itself (model, data, loss, evaluation, checkpoints) is the ``fit`` function a caller passes in
(``raygeom.analyses.train.fit``, by ``raygeom.jobs.train``); only the Ray part lives here, so the analysis
stays free of Ray and the engine imports no analysis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pyarrow as pa

from raygeom.errors import RaygeomError
from raygeom.store.tree import atomic_write_table


def worker_loop(config: dict) -> None:
    """Runs on every Ray Train worker; rank 0 writes the per-step log."""
    import ray.train
    import ray.train.torch

    context = ray.train.get_context()
    rank = context.get_world_rank()
    history = config["fit"](
        config["settings"],
        config["data"],
        rank,
        context.get_world_size(),
        prepare=ray.train.torch.prepare_model,
        report=ray.train.report,
        checkpoints=config["checkpoints"],
    )
    if rank == 0:
        atomic_write_table(pa.Table.from_pylist(history), Path(config["history_path"]))


def fit_on_workers(fit: Callable, settings, data, history_path: Path, checkpoints, storage: Path, name: str) -> None:
    """One run of ``settings`` on ``settings.workers`` workers (a TorchTrainer, or one Ray task for one worker); a
    failure is one RaygeomError line.

    Every worker calls ``fit(settings, data, rank, world, prepare=, report=, checkpoints=)`` and returns its
    per-step log (``raygeom.analyses.train.fit``); ``fit`` is pickled by reference, so it must be importable."""
    resources = {"CPU": settings.cpus_per_worker} | ({"GPU": 1} if settings.use_gpu else {})
    try:
        if settings.workers == 1:
            _fit_in_one_task(fit, settings, data, history_path, checkpoints, resources)
        else:
            _fit_with_trainer(fit, settings, data, history_path, checkpoints, storage, name, resources)
    except Exception as error:  # Ray wraps worker failures in its own types
        cause = getattr(error, "cause", None) or error  # a task's RayTaskError carries the worker's exception
        while getattr(cause, "__cause__", None) is not None:
            cause = cause.__cause__
        message = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
        raise RaygeomError(f"training failed (lambda={settings.lam}, seed={settings.seed}): {message}") from None


def _one_worker(fit: Callable, settings, data, history_path: str, checkpoints) -> None:
    prepare = (lambda model: model.to("cuda")) if settings.use_gpu else None
    history = fit(settings, data, 0, 1, prepare=prepare, report=None, checkpoints=checkpoints)
    atomic_write_table(pa.Table.from_pylist(history), Path(history_path))


def _fit_in_one_task(fit: Callable, settings, data, history_path: Path, checkpoints, resources: dict) -> None:
    """One worker needs no process group, no trainer controller and no Ray Train session, each an actor process that
    imports torch (two one-worker runs at once on 2 cores: 58 s as TorchTrainers, 19 s as tasks): the same loop, with
    the same numbers, runs as one Ray task on the same resources."""
    import ray

    task = ray.remote(_one_worker).options(num_cpus=resources["CPU"], num_gpus=resources.get("GPU", 0), max_retries=0)
    ray.get(task.remote(fit, settings, data, str(Path(history_path).resolve()), checkpoints))


def trainer_class() -> type:
    """TorchTrainer without Ray Train's placement-group cleaner.

    The cleaner (a detached actor) asks the State API every second whether the run's controller is alive, and frees
    the workers' placement group when the answer is "not found". A raygeom local Ray serves no State API
    (``include_dashboard=False``), and on a machine with several Rays the API client may resolve another cluster,
    which does not know the controller: the cleaner then removed the placement group of a live run and killed both
    workers (seen in a full test run: "Destroying worker since its placement group was removed"). Without the cleaner,
    the group of a controller that died lives on only until the job ends (Ray ties it to the job's driver)."""
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    class Trainer(TorchTrainer):
        def _create_default_callbacks(self):
            return [
                callback
                for callback in super()._create_default_callbacks()
                if not isinstance(callback, PlacementGroupCleanerCallback)
            ]

    return Trainer


def _fit_with_trainer(
    fit: Callable, settings, data, history_path: Path, checkpoints, storage: Path, name: str, resources: dict
) -> None:
    from ray.train import RunConfig, ScalingConfig

    trainer = trainer_class()(
        worker_loop,
        train_loop_config={
            "fit": fit,
            "settings": settings,
            "data": data,
            "history_path": str(Path(history_path).resolve()),
            "checkpoints": checkpoints,
        },
        scaling_config=ScalingConfig(num_workers=settings.workers, use_gpu=settings.use_gpu, resources_per_worker=resources),
        run_config=RunConfig(name=name, storage_path=str(Path(storage).resolve())),
    )
    trainer.fit()
