"""Thread pools of a Ray worker that runs raygeom's unit tasks.

A unit task asks Ray for one CPU. numpy's BLAS and torch's pools size themselves to every core of the node when
they start, so with N tasks of N threads each on N cores every task ran at half speed (measured here: one task
alone used 1.64 cores, and 2 Ray workers gave 1.05x over 1). So a unit task first puts every pool of its process
at one thread (:func:`one_thread`); a replica actor and a Ray Train worker set torch's to the
CPUs they asked for.

This is done in the task, not in a ``worker_process_setup_hook``: a hook is a runtime environment, and Ray starts
every worker of a job that has one through ``setup_worker.py``, a second Python that imports Ray before the worker
does (about 1 CPU-s per worker here). The hook also imported every numerics module in every worker, replicas
included, so that a ``ray.cancel`` could not interrupt a first ``import scipy.stats`` (which leaves scipy
half-imported for every later task); raygeom no longer cancels tasks (``UnitRunner._drop``).

Torch is not imported for this: most unit tasks (the nulls, every numpy metric) never use it, and importing it cost
each task worker about 2 CPU-s here. Instead the pools a process has not loaded yet get one thread from the
environment (OpenMP, OpenBLAS and MKL read it when they load), and a torch already imported is set directly. This
runs on every unit task, not once per process: a worker that ran a training task in between may have raised torch's.
"""

from __future__ import annotations

import os
import sys

ONE_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_loaded_pools_limited = False


def one_thread() -> None:
    """Every BLAS/OpenMP pool of this process, and torch's, at one thread (a unit task's one CPU), without importing
    torch: pools loaded later start at one thread (:data:`ONE_THREAD_ENV`)."""
    global _loaded_pools_limited
    os.environ.update(dict.fromkeys(ONE_THREAD_ENV, "1"))
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    if not _loaded_pools_limited:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)  # kept: applied at once, restored only on request
        _loaded_pools_limited = True
